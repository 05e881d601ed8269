#include "drivers/fncall/spawner.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "drivers/fncall/cgroup_v1.hpp"
#include "drivers/fncall/ns_pool.hpp"
#include "drivers/fncall/runner.hpp"
#include "drivers/fncall/sandbox_root.hpp"
#include "drivers/fncall/seccomp_filter.hpp"
#include "drivers/fncall/spawner.pb.h"
#include "runtime/frame.hpp"

namespace dsec::fncall {

namespace {

int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// epoll tags: (key << 2) | stream. Keys 0 and 1 are the dsecd socket and the
// signalfd; runners count up from 2.
enum Stream : uint64_t { kCtl = 0, kOut = 1, kErr = 2, kIn = 3 };
constexpr uint64_t kControlKey = 0, kSignalKey = 1;

enum class State { kStarting, kReady, kRunning };

constexpr int64_t kCpuCheckNs = 50'000'000;  // how often CPU-time limits are checked

struct Runner {
  Runner() = default;
  Runner(const Runner&) = delete;
  ~Runner() = default;
  uint64_t key = 0;
  pid_t pid = -1;
  State state = State::kStarting;
  UniqueFd ctl, out, err, in;
  // Shared with the runner process (CLONE_VM); see runner.hpp.
  RunnerShared shared;
  RunnerStart start{};
  void* stack = nullptr;
  std::vector<std::string> storage;  // argv, env and exec candidates of the run
  std::vector<char*> argv, envp;
  std::vector<const char*> candidates;
  int slot = -1, netns = -1, ipcns = -1;
  bool exited = false, ctl_eof = false, out_eof = false, err_eof = false;
  std::string setup_error;
  // The run, once assigned.
  uint64_t run_id = 0;
  std::string stdin_data;
  size_t stdin_off = 0;
  uint64_t output_cap = 0, cpu_time_ms = 0;
  std::string out_buf, err_buf;
  bool out_trunc = false, err_trunc = false;
  bool timed_out = false, output_exceeded = false, killed = false, kill_sent = false, cpu_exceeded = false;
  std::string kill_reason;
  std::string platform_error;  // the spawner failed this run
  int64_t start_ns = 0, deadline_ns = 0;
  uint64_t oom0 = 0;
  uint64_t cpu_us = 0;  // from wait4: the runner and everything it reaped
};

class Spawner {
 public:
  explicit Spawner(const SpawnerOptions& o) : opts_(o) {}
  int Main();

 private:
  // Setup; returns "" or why fncall cannot work on this host.
  std::string Init();
  void Loop();
  void Shutdown();

  void Send(spawner::Event& ev);
  void Log(int level, const std::string& text);
  void FlushControl();
  void OnControlReadable();
  void OnRequest(spawner::Request& req);
  void OnSignal();
  void OnRunnerEvent(uint64_t key, uint64_t stream, uint32_t events);
  void OnRunnerCtl(Runner& r);
  void ReadOutput(Runner& r, bool is_err);
  void WriteStdin(Runner& r);
  void CheckDone(Runner& r);
  void Finish(Runner& r);
  void Discard(Runner& r);
  void Kill(Runner& r, const char* why);
  void Dispatch();
  void Go(Runner& r, spawner::Run& run);
  void PrepareRun(Runner& r, const spawner::Run& run);
  void Refill();
  void RunnerFailed(const std::string& why);
  void CheckCpuTime(int64_t now);
  bool SpawnRunner();
  int AcquireSlot();
  void* AcquireStack();
  void ReleaseStack(Runner& r);
  void ReleaseNamespaces(Runner& r);
  void FailRun(uint64_t id, const std::string& why);
  void SendStats();

  SpawnerOptions opts_;
  UniqueFd epoll_, sigfd_;
  int control_ = -1;
  FrameDecoder control_dec_;
  std::string control_out_;
  bool control_eof_ = false, shutting_down_ = false;
  CgroupMounts cgroups_;
  std::string group_base_;
  UniqueFd root_ns_;   // always kSlotRoot
  UniqueFd devnull_;   // fills unused runner slots
  SeccompProgram seccomp_;
  std::string work_opts_, tmp_opts_;
  sock_fprog seccomp_prog_{};
  std::vector<CgroupSlot> slots_;
  std::vector<int> free_slots_;
  NamespacePool netns_{CLONE_NEWNET, "net"};
  NamespacePool ipcns_{CLONE_NEWIPC, "ipc"};
  std::vector<void*> free_stacks_;
  std::unordered_map<uint64_t, std::unique_ptr<Runner>> runners_;
  std::unordered_map<pid_t, uint64_t> by_pid_;
  std::unordered_map<uint64_t, uint64_t> by_run_;  // run id -> runner key
  std::deque<uint64_t> ready_;
  std::deque<spawner::Run> pending_;
  std::multimap<int64_t, uint64_t> deadlines_;  // deadline -> runner key
  uint64_t next_key_ = 2;
  size_t starting_ = 0, running_ = 0;
  uint64_t runs_ = 0, runner_failures_ = 0, consecutive_failures_ = 0, ipcns_dropped_ = 0;
  // Runner starts failing in a row: back off (doubling up to 5 s), and while
  // no runner can start, fail runs at once with the reason instead of queueing.
  int64_t refill_resume_ns_ = 0;
  int64_t refill_backoff_ns_ = 100'000'000;
  std::string last_runner_error_;
  bool refill_progress_ = false;
  // CPU-time limits are enforced on the whole run's cgroup (RLIMIT_CPU alone
  // is per process, so forking would escape it): checked on these ticks.
  std::multimap<int64_t, uint64_t> cpu_checks_;  // check time -> runner key
};

std::string Spawner::Init() {
  if (::geteuid() != 0)
    return "dsec-spawner must run as root (it creates namespaces and cgroups); run dsecd as root";
  // Whatever dsecd's parent ignored (nohup, a shell's `&`) must not reach us
  // or the sandboxes: an ignored SIGCHLD would even auto-reap our runners.
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  sigfd_.Reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  // dsecd closing our socket is the normal signal to leave; SIGTERM on its
  // death is the backstop, and we clean up either way.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  rlimit nofile{1 << 20, 1 << 20};
  if (::setrlimit(RLIMIT_NOFILE, &nofile) < 0) {
    ::getrlimit(RLIMIT_NOFILE, &nofile);
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  // Never the OOM killer's victim. This matters beyond the spawner: runners
  // share its memory (CLONE_VM) and inherit this, and the kernel kills every
  // process sharing a victim's memory, so an OOM in a sandbox that picked a
  // runner would take the spawner with it.
  if (int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); fd >= 0) {
    (void)!::write(fd, "-1000", 5);
    ::close(fd);
  }
  // Empty the capability bounding set once, here: runners inherit it, so no
  // program can regain a capability through execve (each drop allocates new
  // credentials; doing it per runner was measurable). Our own effective
  // capabilities, which runners use for mounts and namespaces, stay.
  for (int cap = 0; cap <= 63; ++cap)
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break;
  // One UTS namespace for every sandbox: nobody inside can change it.
  if (::unshare(CLONE_NEWUTS) < 0) return std::string("unshare(CLONE_NEWUTS): ") + std::strerror(errno);
  (void)::sethostname("sandbox", 7);

  RootOptions ro;
  ro.uid = opts_.uid;
  ro.gid = opts_.gid;
  auto ns = BuildHostRootNamespace(ro);
  if (!ns.ok()) return ns.status().message();
  // Into its slot, where every runner finds it (runner.hpp).
  if (::dup2(ns->get(), kSlotRoot) < 0) return std::string("dup2 the host root: ") + std::strerror(errno);
  root_ns_.Reset(kSlotRoot);
  auto sc = BuildSandboxSeccomp();
  if (!sc.ok()) return sc.status().message();
  seccomp_ = std::move(*sc);
  auto cg = DiscoverCgroupMounts();
  if (!cg.ok()) return cg.status().message();
  cgroups_ = *cg;
  int swept = SweepStaleSpawnerGroups(cgroups_, opts_.cgroup_parent);
  group_base_ = opts_.cgroup_parent + "/sp" + std::to_string(::getpid());
  if (auto st = MakeGroupDirs(cgroups_, group_base_); !st.ok()) return st.message();
  if (swept) Log(2, "removed " + std::to_string(swept) + " cgroup(s) left by a spawner that died");

  work_opts_ = "mode=0755,uid=" + std::to_string(opts_.uid) + ",gid=" + std::to_string(opts_.gid) +
               ",size=" + std::to_string(opts_.tmpfs_bytes);
  tmp_opts_ = "mode=1777,size=" + std::to_string(opts_.tmpfs_bytes);
  seccomp_prog_ = seccomp_.prog();
  return {};
}

int Spawner::Main() {
  // Keep the runner slots (runner.hpp) for runners: our own descriptors live
  // at kFirstSpawnerFd and above, the slots hold /dev/null until used.
  control_ = ::fcntl(opts_.control_fd, F_DUPFD_CLOEXEC, kFirstSpawnerFd);
  if (control_ < 0) return 1;
  if (opts_.control_fd != control_) ::close(opts_.control_fd);
  devnull_.Reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (devnull_.get() < kFirstSpawnerFd) {
    int high = ::fcntl(devnull_.get(), F_DUPFD_CLOEXEC, kFirstSpawnerFd);
    devnull_.Reset(high);
  }
  for (int slot = kSlotRoot; slot < kFirstSpawnerFd; ++slot) ::dup2(devnull_.get(), slot);
  SetNonBlocking(control_);
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  std::string err = Init();
  spawner::Event hello;
  hello.mutable_hello()->set_pid(static_cast<uint32_t>(::getpid()));
  hello.mutable_hello()->set_cgroup_path(group_base_);
  hello.mutable_hello()->set_fresh_namespaces(opts_.fresh_namespaces);
  if (!err.empty()) hello.mutable_hello()->set_error(err);
  Send(hello);
  if (!err.empty()) {
    ::fcntl(control_, F_SETFL, ::fcntl(control_, F_GETFL) & ~O_NONBLOCK);
    (void)WriteFull(control_, control_out_.data(), control_out_.size());
    if (!group_base_.empty()) RemoveGroupDirs(cgroups_, group_base_);
    return 1;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kControlKey << 2;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, control_, &ev);
  ev.data.u64 = kSignalKey << 2;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sigfd_.get(), &ev);
  Loop();
  Shutdown();
  return 0;
}

void Spawner::Loop() {
  epoll_event events[256];
  while (!shutting_down_) {
    Refill();
    FlushControl();
    int timeout = -1;
    if (!deadlines_.empty()) {
      int64_t dt = deadlines_.begin()->first - NowNs();
      timeout = dt <= 0 ? 0 : static_cast<int>(dt / 1000000 + 1);
    }
    if (!cpu_checks_.empty()) {
      int64_t dt = cpu_checks_.begin()->first - NowNs();
      int t = dt <= 0 ? 0 : static_cast<int>(dt / 1000000 + 1);
      if (timeout < 0 || t < timeout) timeout = t;
    }
    // Keep filling the pool in small steps while idle, but only while that
    // makes progress; when paused, wake up when the pause ends.
    if (starting_ + ready_.size() < opts_.pool_size) {
      int t = refill_progress_ ? 0 : 1000;
      if (refill_resume_ns_ > NowNs()) t = static_cast<int>((refill_resume_ns_ - NowNs()) / 1000000 + 1);
      if (timeout < 0 || t < timeout) timeout = t;
    }
    int n = ::epoll_wait(epoll_.get(), events, 256, timeout);
    if (n < 0 && errno != EINTR) {
      Log(3, std::string("epoll_wait: ") + std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64 >> 2, stream = events[i].data.u64 & 3;
      if (key == kControlKey) {
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) OnControlReadable();
        if (events[i].events & EPOLLOUT) FlushControl();
      } else if (key == kSignalKey) {
        OnSignal();
      } else {
        OnRunnerEvent(key, stream, events[i].events);
      }
    }
    int64_t now = NowNs();
    CheckCpuTime(now);
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      uint64_t key = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      auto it = runners_.find(key);
      if (it == runners_.end()) continue;
      it->second->timed_out = true;
      Kill(*it->second, "wall-clock limit");
    }
    // Outcomes go out now, before Refill spends time starting runners.
    FlushControl();
    if (control_eof_) break;
  }
}

void Spawner::Send(spawner::Event& ev) {
  AppendFrame(&control_out_, ev.SerializeAsString());
}

void Spawner::Log(int level, const std::string& text) {
  spawner::Event ev;
  ev.mutable_log()->set_level(level);
  ev.mutable_log()->set_text(text);
  Send(ev);
}

void Spawner::FlushControl() {
  while (!control_out_.empty()) {
    ssize_t w = ::write(control_, control_out_.data(), control_out_.size());
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      control_eof_ = true;  // dsecd is gone
      control_out_.clear();
      return;
    }
    control_out_.erase(0, static_cast<size_t>(w));
  }
  epoll_event ev{};
  ev.events = EPOLLIN | (control_out_.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
  ev.data.u64 = kControlKey << 2;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, control_, &ev);
}

void Spawner::OnControlReadable() {
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(control_, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      control_eof_ = true;
      return;
    }
    if (n == 0) {
      control_eof_ = true;
      return;
    }
    control_dec_.Feed(buf, static_cast<size_t>(n));
  }
  std::string frame;
  for (;;) {
    int rc = control_dec_.Next(&frame);
    if (rc == 0) break;
    if (rc < 0) {
      Log(3, "dsecd sent an oversized frame; closing");
      control_eof_ = true;
      return;
    }
    spawner::Request req;
    if (!req.ParseFromString(frame)) {
      Log(3, "dsecd sent a frame that is not a spawner.Request; ignored");
      continue;
    }
    OnRequest(req);
  }
  Dispatch();
}

void Spawner::OnRequest(spawner::Request& req) {
  switch (req.body_case()) {
    case spawner::Request::kRun: {
      auto* run = req.mutable_run();
      if (run->argv_size() == 0) {
        FailRun(run->id(), "empty argv");
        return;
      }
      if (consecutive_failures_ >= 20 && ready_.empty()) {
        FailRun(run->id(), "fncall runners cannot start: " + last_runner_error_);
        return;
      }
      pending_.push_back(std::move(*run));
      return;
    }
    case spawner::Request::kKill: {
      uint64_t id = req.kill().id();
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->id() != id) continue;
        spawner::Event ev;
        auto* o = ev.mutable_outcome();
        o->set_id(id);
        o->set_killed(true);
        o->set_kill_reason(req.kill().reason());
        Send(ev);
        pending_.erase(it);
        return;
      }
      auto r = by_run_.find(id);
      if (r == by_run_.end()) return;  // already finished
      auto& runner = *runners_.at(r->second);
      runner.killed = true;
      runner.kill_reason = req.kill().reason();
      Kill(runner, "kill request");
      return;
    }
    case spawner::Request::kShutdown:
      shutting_down_ = true;
      return;
    case spawner::Request::kStats:
      SendStats();
      return;
    default:
      Log(2, "unknown request from dsecd ignored");
  }
}

void Spawner::SendStats() {
  spawner::Event ev;
  auto* s = ev.mutable_stats();
  s->set_ready(static_cast<uint32_t>(ready_.size()));
  s->set_running(static_cast<uint32_t>(running_));
  s->set_starting(static_cast<uint32_t>(starting_));
  s->set_runs(runs_);
  s->set_runner_failures(runner_failures_);
  s->set_netns_free(static_cast<uint32_t>(netns_.free()));
  s->set_netns_total(static_cast<uint32_t>(netns_.total()));
  s->set_ipcns_free(static_cast<uint32_t>(ipcns_.free()));
  s->set_ipcns_total(static_cast<uint32_t>(ipcns_.total()));
  Send(ev);
}

void Spawner::FailRun(uint64_t id, const std::string& why) {
  spawner::Event ev;
  ev.mutable_outcome()->set_id(id);
  ev.mutable_outcome()->set_platform_error(why);
  Send(ev);
}

void Spawner::OnSignal() {
  signalfd_siginfo si;
  bool child = false;
  while (::read(sigfd_.get(), &si, sizeof si) == sizeof si) {
    if (si.ssi_signo == SIGCHLD) child = true;
    else shutting_down_ = true;  // SIGTERM/SIGINT/SIGHUP: clean up and leave
  }
  if (!child) return;
  for (;;) {
    int status = 0;
    rusage ru{};
    pid_t pid = ::wait4(-1, &status, WNOHANG, &ru);
    if (pid <= 0) break;
    auto it = by_pid_.find(pid);
    if (it == by_pid_.end()) continue;
    uint64_t key = it->second;
    by_pid_.erase(it);
    auto r = runners_.find(key);
    if (r == runners_.end()) continue;
    Runner& rr = *r->second;
    rr.exited = true;
    // The runner reaped every process of its run (PID 1 reaps orphans, and
    // the namespace's teardown reaps the rest), so its rusage is the run's.
    rr.cpu_us = static_cast<uint64_t>(ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec +
                                      ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec);
    if (rr.state != State::kRunning && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      if (rr.shared.setup_what)
        rr.setup_error = std::string(rr.shared.setup_what) + ": " + std::strerror(rr.shared.setup_errno);
      else if (!shutting_down_)
        rr.setup_error = "runner ended with wait status " + std::to_string(status);
    }
    CheckDone(*r->second);
  }
}

void Spawner::OnRunnerEvent(uint64_t key, uint64_t stream, uint32_t events) {
  auto it = runners_.find(key);
  if (it == runners_.end()) return;
  Runner& r = *it->second;
  switch (stream) {
    case kCtl: OnRunnerCtl(r); break;
    case kOut: ReadOutput(r, false); break;
    case kErr: ReadOutput(r, true); break;
    case kIn: WriteStdin(r); break;
  }
  CheckDone(r);
}

void Spawner::OnRunnerCtl(Runner& r) {
  char buf[64];
  for (;;) {
    ssize_t n = ::read(r.ctl.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      r.ctl_eof = true;
      if (r.state == State::kReady)  // died in the pool: not a candidate any more
        for (auto it = ready_.begin(); it != ready_.end(); ++it)
          if (*it == r.key) {
            ready_.erase(it);
            break;
          }
      break;
    }
    if (std::memchr(buf, kRunnerReady, static_cast<size_t>(n)) && r.state == State::kStarting) {
      r.state = State::kReady;
      --starting_;
      consecutive_failures_ = 0;
      refill_backoff_ns_ = 100'000'000;
      ready_.push_back(r.key);
    }
  }
  if (r.state == State::kReady) Dispatch();
}

void Spawner::ReadOutput(Runner& r, bool is_err) {
  UniqueFd& fd = is_err ? r.err : r.out;
  std::string& buf = is_err ? r.err_buf : r.out_buf;
  bool& trunc = is_err ? r.err_trunc : r.out_trunc;
  bool& eof = is_err ? r.err_eof : r.out_eof;
  char tmp[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), tmp, sizeof tmp);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      eof = true;
      fd.Reset();  // also leaves the epoll set
      return;
    }
    if (r.state != State::kRunning) continue;  // a runner never writes before its run
    size_t room = buf.size() < r.output_cap ? r.output_cap - buf.size() : 0;
    size_t take = static_cast<size_t>(n) < room ? static_cast<size_t>(n) : room;
    buf.append(tmp, take);
    if (take < static_cast<size_t>(n) && !trunc) {
      trunc = true;
      r.output_exceeded = true;
      Kill(r, "output limit");
    }
  }
}

void Spawner::WriteStdin(Runner& r) {
  while (r.in && r.stdin_off < r.stdin_data.size()) {
    ssize_t w = ::write(r.in.get(), r.stdin_data.data() + r.stdin_off, r.stdin_data.size() - r.stdin_off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;
    if (w < 0) break;  // EPIPE: the program closed stdin early; that is its business
    r.stdin_off += static_cast<size_t>(w);
  }
  r.in.Reset();
  std::string().swap(r.stdin_data);
}

void Spawner::Kill(Runner& r, const char* why) {
  if (r.kill_sent || r.exited) return;
  r.kill_sent = true;
  ::kill(r.pid, SIGKILL);  // PID 1 of its namespace: everything inside dies with it
}

void Spawner::CheckDone(Runner& r) {
  if (!r.exited || !r.ctl_eof || !r.out_eof || !r.err_eof) return;
  if (r.state == State::kRunning) Finish(r);
  else Discard(r);
}

// A runner that died before it got a run (setup failure, OOM in the pool,
// killed at shutdown): log why, give back its resources.
void Spawner::Discard(Runner& r) {
  if (r.state == State::kStarting) --starting_;
  if (r.state == State::kReady)
    for (auto it = ready_.begin(); it != ready_.end(); ++it)
      if (*it == r.key) {
        ready_.erase(it);
        break;
      }
  if (!r.setup_error.empty() && !shutting_down_)
    RunnerFailed("runner pid " + std::to_string(r.pid) + ": " + r.setup_error);
  if (r.slot >= 0) free_slots_.push_back(r.slot);
  ReleaseNamespaces(r);
  ReleaseStack(r);
  runners_.erase(r.key);
}

void Spawner::Finish(Runner& r) {
  spawner::Event ev;
  auto* o = ev.mutable_outcome();
  o->set_id(r.run_id);
  CgroupSlot& slot = slots_[r.slot];
  uint64_t setup = static_cast<uint64_t>(r.shared.setup_cpu_us > 0 ? r.shared.setup_cpu_us : 0);
  o->set_cpu_us(r.cpu_us > setup ? r.cpu_us - setup : 0);
  o->set_wall_us(static_cast<uint64_t>((NowNs() - r.start_ns) / 1000));
  o->set_peak_memory_bytes(slot.PeakBytes());
  o->set_oom_killed(slot.OomKills() > r.oom0);
  o->set_timed_out(r.timed_out);
  o->set_output_exceeded(r.output_exceeded);
  o->set_killed(r.killed);
  o->set_kill_reason(r.kill_reason);
  const RunnerShared& sh = r.shared;
  if (sh.reported) {
    int st = sh.wait_status;
    if (sh.setup_what && sh.user_error) {
      // The request's fault (e.g. a cwd that does not exist): like exec failing.
      o->set_user_error(std::string(sh.setup_what) + ": " + std::strerror(sh.setup_errno));
      o->set_exited(true);
      o->set_exit_code(126);
    } else if (sh.setup_what) {
      o->set_platform_error(std::string("before exec: ") + sh.setup_what + ": " +
                            std::strerror(sh.setup_errno));
    } else if (sh.exec_errno) {
      o->set_exec_errno(sh.exec_errno);
      o->set_exited(true);
      o->set_exit_code(sh.exec_errno == ENOENT ? 127 : 126);
    } else if (WIFEXITED(st)) {
      o->set_exited(true);
      o->set_exit_code(WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
      o->set_signal(WTERMSIG(st));
    }
  } else if (sh.setup_what) {
    o->set_platform_error(std::string("runner: ") + sh.setup_what + ": " + std::strerror(sh.setup_errno));
  } else {
    o->set_signal(SIGKILL);  // the runner itself was killed (limit, kill, or OOM)
  }
  if (!r.platform_error.empty()) o->set_platform_error(r.platform_error);
  if (r.cpu_exceeded || (r.cpu_time_ms && (o->signal() == SIGXCPU ||
                                             (o->signal() == SIGKILL && o->cpu_us() >= r.cpu_time_ms * 1000))))
    o->set_cpu_time_exceeded(true);
  *o->mutable_stdout() = std::move(r.out_buf);
  *o->mutable_stderr() = std::move(r.err_buf);
  o->set_stdout_truncated(r.out_trunc);
  o->set_stderr_truncated(r.err_trunc);
  Send(ev);
  ++runs_;
  --running_;
  by_run_.erase(r.run_id);
  for (auto it = deadlines_.lower_bound(r.deadline_ns); it != deadlines_.end() && it->first == r.deadline_ns; ++it)
    if (it->second == r.key) {
      deadlines_.erase(it);
      break;
    }
  free_slots_.push_back(r.slot);
  ReleaseNamespaces(r);
  ReleaseStack(r);
  runners_.erase(r.key);
}

// Stacks are reused: unmapping memory shared with running runners costs
// TLB shootdowns on every CPU they run on.
void* Spawner::AcquireStack() {
  if (!free_stacks_.empty()) {
    void* s = free_stacks_.back();
    free_stacks_.pop_back();
    return s;
  }
  void* s = ::mmap(nullptr, kRunnerStackBytes + kChildStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  return s == MAP_FAILED ? nullptr : s;
}

void Spawner::ReleaseStack(Runner& r) {
  if (r.stack) free_stacks_.push_back(r.stack);
  r.stack = nullptr;
}

// Kills runs whose cgroup used more CPU than their limit (all processes
// together); rechecks the others a tick later.
void Spawner::CheckCpuTime(int64_t now) {
  while (!cpu_checks_.empty() && cpu_checks_.begin()->first <= now) {
    uint64_t key = cpu_checks_.begin()->second;
    cpu_checks_.erase(cpu_checks_.begin());
    auto it = runners_.find(key);
    if (it == runners_.end() || it->second->state != State::kRunning || it->second->exited) continue;
    Runner& r = *it->second;
    if (slots_[r.slot].CpuUsageNs() >= r.cpu_time_ms * 1000000) {
      r.cpu_exceeded = true;
      Kill(r, "cpu-time limit");
    } else {
      cpu_checks_.emplace(now + kCpuCheckNs, key);
    }
  }
}

void Spawner::Dispatch() {
  while (!pending_.empty() && !ready_.empty()) {
    uint64_t key = ready_.front();
    ready_.pop_front();
    auto it = runners_.find(key);
    if (it == runners_.end() || it->second->exited || it->second->ctl_eof) continue;
    spawner::Run run = std::move(pending_.front());
    pending_.pop_front();
    Go(*it->second, run);
  }
}

// Lays out argv, envp and the execve candidates (PATH search, as execvp) in
// memory the runner reads once it gets "go".
void Spawner::PrepareRun(Runner& r, const spawner::Run& run) {
  auto& st = r.storage;
  st.clear();
  st.reserve(static_cast<size_t>(run.argv_size() + run.env_size()) + 16);
  std::string path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
  for (const auto& a : run.argv()) st.push_back(a);
  for (const auto& e : run.env()) {
    st.push_back(e);
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  }
  const std::string& prog = run.argv(0);
  size_t first_candidate = st.size();
  if (prog.find('/') != std::string::npos) {
    st.push_back(prog);
  } else {
    size_t start = 0;
    while (start <= path.size()) {
      size_t end = path.find(':', start);
      if (end == std::string::npos) end = path.size();
      std::string dir = path.substr(start, end - start);
      st.push_back((dir.empty() ? std::string(".") : dir) + "/" + prog);
      start = end + 1;
    }
  }
  st.push_back(run.cwd().empty() ? std::string("/work") : run.cwd());
  size_t nargv = static_cast<size_t>(run.argv_size());
  r.argv.clear();
  r.envp.clear();
  r.candidates.clear();
  for (size_t i = 0; i < nargv; ++i) r.argv.push_back(st[i].data());
  r.argv.push_back(nullptr);
  for (size_t i = nargv; i < first_candidate; ++i) r.envp.push_back(st[i].data());
  r.envp.push_back(nullptr);
  for (size_t i = first_candidate; i + 1 < st.size(); ++i) r.candidates.push_back(st[i].c_str());
  r.candidates.push_back(nullptr);
  RunnerShared& sh = r.shared;
  sh.argv = r.argv.data();
  sh.envp = r.envp.data();
  sh.candidates = r.candidates.data();
  sh.cwd = st.back().c_str();
  if (run.cpu_time_ms()) {
    rlim_t secs = (run.cpu_time_ms() + 999) / 1000;
    sh.cpu = {secs, secs + 1};
  }
  if (run.file_size_bytes()) sh.fsize = {run.file_size_bytes(), run.file_size_bytes()};
  if (run.open_files()) sh.nofile = {run.open_files(), run.open_files()};
}

void Spawner::Go(Runner& r, spawner::Run& run) {
  CgroupSlot& slot = slots_[r.slot];
  Status st = slot.SetMemoryLimit(run.memory_bytes());
  if (st.ok()) st = slot.SetPidsMax(run.pids() ? run.pids() + 1 : 0);  // +1: the runner
  r.shared.join_cpu = run.cpu_millis() > 0 || run.cpu_time_ms() > 0;
  if (st.ok() && r.shared.join_cpu) st = slot.SetCpuQuota(run.cpu_millis());
  r.state = State::kRunning;
  ++running_;
  r.run_id = run.id();
  by_run_[r.run_id] = r.key;
  if (!st.ok()) {
    r.platform_error = "set the run's cgroup limits: " + st.message();
    Kill(r, "limits");
    return;
  }
  slot.ResetCounters(r.shared.join_cpu);
  r.oom0 = slot.OomKills();
  r.output_cap = run.output_bytes();
  r.cpu_time_ms = run.cpu_time_ms();
  r.stdin_data.swap(*run.mutable_stdin());
  PrepareRun(r, run);
  r.start_ns = NowNs();
  r.deadline_ns = r.start_ns + static_cast<int64_t>(run.timeout_ms()) * 1000000;
  deadlines_.emplace(r.deadline_ns, r.key);
  if (r.cpu_time_ms) cpu_checks_.emplace(r.start_ns + kCpuCheckNs, r.key);
  char go = kRunnerGo;
  if (::write(r.ctl.get(), &go, 1) != 1) {
    r.platform_error = std::string("the runner died before its run: ") + std::strerror(errno);
    Kill(r, "runner gone");
    return;
  }
  if (r.stdin_data.empty()) {
    r.in.Reset();
  } else {
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u64 = (r.key << 2) | kIn;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r.in.get(), &ev);
    WriteStdin(r);
  }
}

int Spawner::AcquireSlot() {
  if (!free_slots_.empty()) {
    int s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  auto slot = CgroupSlot::Create(cgroups_, group_base_ + "/r" + std::to_string(slots_.size()));
  if (!slot.ok()) {
    last_runner_error_ = slot.status().message();
    return -1;
  }
  slots_.push_back(std::move(*slot));
  return static_cast<int>(slots_.size() - 1);
}

// Back to the pools once the runner is gone: every process that was in them
// is dead, so sockets are closed; an ipc namespace is reused only when no
// System V object survived in it.
void Spawner::ReleaseNamespaces(Runner& r) {
  if (r.netns >= 0) netns_.Release(r.netns);
  if (r.ipcns >= 0) {
    if (ipcns_.IpcEmpty(r.ipcns)) {
      ipcns_.Release(r.ipcns);
    } else {
      ipcns_.Drop(r.ipcns);
      ++ipcns_dropped_;
    }
  }
  r.netns = r.ipcns = -1;
}

bool Spawner::SpawnRunner() {
  int slot = AcquireSlot();
  if (slot < 0) return false;
  int netns = -1, ipcns = -1;
  if (!opts_.fresh_namespaces) {
    std::string err;
    netns = netns_.Acquire(&err);
    if (netns >= 0) ipcns = ipcns_.Acquire(&err);
    if (ipcns < 0) {
      last_runner_error_ = err;
      if (netns >= 0) netns_.Release(netns);
      free_slots_.push_back(slot);
      return false;
    }
  }
  auto give_back = [&] {
    free_slots_.push_back(slot);
    if (netns >= 0) netns_.Release(netns);
    if (ipcns >= 0) ipcns_.Release(ipcns);
  };
  int ctl[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0 || ::pipe2(out, O_CLOEXEC) < 0 ||
      ::pipe2(err, O_CLOEXEC) < 0 || ::pipe2(in, O_CLOEXEC) < 0) {
    last_runner_error_ = std::string("pipes: ") + std::strerror(errno);
    for (int fd : {ctl[0], ctl[1], out[0], out[1], err[0], err[1], in[0], in[1]})
      if (fd >= 0) ::close(fd);
    give_back();
    return false;
  }
  auto r = std::make_unique<Runner>();
  r->stack = AcquireStack();
  if (!r->stack) {
    last_runner_error_ = "out of memory for a runner stack";
    for (int fd : {ctl[0], ctl[1], out[0], out[1], err[0], err[1], in[0], in[1]}) ::close(fd);
    give_back();
    return false;
  }
  RunnerShared& sh = r->shared;
  ::dup2(ctl[1], kSlotCtl);
  ::dup2(out[1], kSlotOut);
  ::dup2(err[1], kSlotErr);
  ::dup2(in[0], kSlotIn);
  sh.has_net_ns = netns >= 0;
  sh.has_ipc_ns = ipcns >= 0;
  if (sh.has_net_ns) ::dup2(netns_.fd(netns), kSlotNet);
  if (sh.has_ipc_ns) ::dup2(ipcns_.fd(ipcns), kSlotIpc);
  ::close(ctl[1]);
  ::close(out[1]);
  ::close(err[1]);
  ::close(in[0]);
  auto pool_procs = slots_[slot].PoolProcsFds(), cpu_procs = slots_[slot].CpuProcsFds();
  sh.cgroup_hierarchies = static_cast<int>(std::min<size_t>(pool_procs.size(), 2));
  sh.cpu_hierarchies = static_cast<int>(std::min<size_t>(cpu_procs.size(), 2));
  for (int i = 0; i < sh.cgroup_hierarchies; ++i) ::dup2(pool_procs[static_cast<size_t>(i)], kSlotCgroup + i);
  for (int i = 0; i < sh.cpu_hierarchies; ++i) ::dup2(cpu_procs[static_cast<size_t>(i)], kSlotCpuCgroup + i);
  sh.work_opts = work_opts_.c_str();
  sh.tmp_opts = tmp_opts_.c_str();
  sh.seccomp = &seccomp_prog_;
  sh.uid = opts_.uid;
  sh.gid = opts_.gid;
  char* base = static_cast<char*>(r->stack);
  r->start.shared = &sh;
  r->start.child_stack_top = base + kRunnerStackBytes + kChildStackBytes;
  int flags = CLONE_VM | CLONE_FILES | CLONE_NEWPID |
              (opts_.fresh_namespaces ? CLONE_NEWNET | CLONE_NEWIPC : 0) | SIGCHLD;
  pid_t pid = ::clone(RunnerEntry, base + kRunnerStackBytes, flags, &r->start);
  int clone_errno = errno;
  if (pid > 0) {
    // Until the runner has its own table, ours must not change under it.
    timespec wait{10, 0};
    while (__atomic_load_n(&sh.handed_off, __ATOMIC_ACQUIRE) == 0) {
      long rc = ::syscall(SYS_futex, &sh.handed_off, FUTEX_WAIT, 0, &wait, nullptr, 0);
      if (rc < 0 && errno == ETIMEDOUT) {
        Log(3, "runner pid " + std::to_string(pid) + " did not start within 10 s; killing it");
        ::kill(pid, SIGKILL);
        break;  // it shares our table no more once it is dead
      }
    }
  }
  // Drop our references to the runner's ends: EOF on its pipes must depend
  // on the runner and its program only.
  for (int slot = kSlotCtl; slot < kFirstSpawnerFd; ++slot) ::dup2(devnull_.get(), slot);
  r->ctl.Reset(ctl[0]);
  r->out.Reset(out[0]);
  r->err.Reset(err[0]);
  r->in.Reset(in[1]);
  if (pid < 0) {
    last_runner_error_ = std::string("clone a runner: ") + std::strerror(clone_errno);
    ReleaseStack(*r);
    give_back();
    return false;
  }
  r->key = next_key_++;
  r->pid = pid;
  r->slot = slot;
  r->netns = netns;
  r->ipcns = ipcns;
  for (int fd : {r->ctl.get(), r->out.get(), r->err.get(), r->in.get()}) SetNonBlocking(fd);
  epoll_event ev{};
  // Edge-triggered: EOF is reported once, so no EPOLL_CTL_DEL is needed; the
  // fd leaves the epoll set when it is closed (we hold its only reference).
  ev.events = EPOLLIN | EPOLLET;
  ev.data.u64 = (r->key << 2) | kCtl;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r->ctl.get(), &ev);
  ev.data.u64 = (r->key << 2) | kOut;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r->out.get(), &ev);
  ev.data.u64 = (r->key << 2) | kErr;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r->err.get(), &ev);
  by_pid_[pid] = r->key;
  ++starting_;
  runners_[r->key] = std::move(r);
  return true;
}

void Spawner::Refill() {
  refill_progress_ = false;
  if (shutting_down_ || NowNs() < refill_resume_ns_) return;
  // Warm pool first; then whatever the queue needs, bounded by max_runners.
  size_t want = opts_.pool_size + pending_.size();
  size_t spawned = 0;
  while (starting_ + ready_.size() < want && runners_.size() < opts_.max_runners && spawned < 8) {
    if (!SpawnRunner()) {
      RunnerFailed("cannot start a runner: " + last_runner_error_);
      break;
    }
    ++spawned;
  }
  refill_progress_ = spawned > 0;
}

// A runner failed to start (SpawnRunner failed, or it died in setup). After
// 20 in a row, pause starting new ones with a doubling backoff and fail the
// queued runs with the reason; the first runner that gets ready resets this.
void Spawner::RunnerFailed(const std::string& why) {
  ++runner_failures_;
  ++consecutive_failures_;
  last_runner_error_ = why;
  // Log the first failure of a streak and then every doubling, not each one.
  if ((consecutive_failures_ & (consecutive_failures_ - 1)) == 0)
    Log(3, "fncall runner failed (" + std::to_string(consecutive_failures_) + " in a row): " + why);
  if (consecutive_failures_ < 20) return;
  refill_resume_ns_ = NowNs() + refill_backoff_ns_;
  refill_backoff_ns_ = std::min<int64_t>(refill_backoff_ns_ * 2, 5'000'000'000);
  while (!pending_.empty()) {
    FailRun(pending_.front().id(), "fncall runners cannot start: " + why);
    pending_.pop_front();
  }
}

void Spawner::Shutdown() {
  shutting_down_ = true;
  for (auto& run : pending_) FailRun(run.id(), "dsecd is shutting down");
  pending_.clear();
  for (auto& [key, r] : runners_) {
    if (r->state == State::kRunning) {
      r->killed = true;
      r->kill_reason = "dsecd is shutting down";
    }
    ::kill(r->pid, SIGKILL);
  }
  // Wait for every runner to be reaped, draining its pipes, then report.
  int64_t give_up = NowNs() + 10'000'000'000;
  epoll_event events[256];
  while (!runners_.empty() && NowNs() < give_up) {
    int n = ::epoll_wait(epoll_.get(), events, 256, 100);
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64 >> 2, stream = events[i].data.u64 & 3;
      if (key == kSignalKey) OnSignal();
      else if (key != kControlKey) OnRunnerEvent(key, stream, events[i].events);
    }
    OnSignal();
  }
  if (!control_eof_) {
    ::fcntl(control_, F_SETFL, ::fcntl(control_, F_GETFL) & ~O_NONBLOCK);
    (void)WriteFull(control_, control_out_.data(), control_out_.size());
  }
  for (auto& s : slots_) s.Remove();
  RemoveGroupDirs(cgroups_, group_base_);
  RemoveGroupDirs(cgroups_, opts_.cgroup_parent);  // only if no other spawner uses it
}

}  // namespace

int RunSpawner(const SpawnerOptions& options) {
  Spawner s(options);
  return s.Main();
}

}  // namespace dsec::fncall
