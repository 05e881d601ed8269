// dsec-spawner's event loop: the protocol with dsecd, signals, and the life of a
// run from "go" to its Outcome. The warm pools live in runner_pool.cpp (fncall
// runners) and container_pool.cpp (container inits).
#include "drivers/spawner/spawner_internal.hpp"

#include <seccomp.h>

namespace dsec::fncall {
namespace internal {

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
  // A container spawner keeps the containers' set, which their inits trim
  // to (container_init.cpp); fncall runs drop to an unprivileged user.
  unsigned long long keep = opts_.containers ? container::kContainerCaps : 0;
  for (int cap = 0; cap <= 63; ++cap) {
    if (keep & (1ull << cap)) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break;
  }
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
  if (opts_.containers) {
    auto base = BuildContainerBaseNamespace();
    if (!base.ok()) return base.status().message();
    // Above the slots, like our other descriptors.
    container_base_ns_.Reset(::fcntl(base->get(), F_DUPFD_CLOEXEC, kFirstSpawnerFd));
    if (!container_base_ns_) return std::string("keep the container base namespace: ") + std::strerror(errno);
    container_netns_.set_loopback_up(true);
    // One lane for every container creation of the node (we wait while each
    // init sets up): ahead of the node's other work, so a loaded node keeps
    // creating at the lane's pace. Each init is back at 0 before the agent
    // starts (container_init.cpp): nothing in a container runs boosted.
    if (::setpriority(PRIO_PROCESS, 0, container::kContainerLaneNice) < 0)
      Log(2, std::string("setpriority(-10) for the container lane: ") + std::strerror(errno));
  }
  auto sc = BuildSandboxSeccomp();
  if (!sc.ok()) return sc.status().message();
  seccomp_ = std::move(*sc);
  if (opts_.containers) {
    auto notifying = BuildSandboxSeccomp(true);
    if (!notifying.ok()) return notifying.status().message();
    container_seccomp_ = std::move(*notifying);
    container_seccomp_prog_ = container_seccomp_.prog();
    if (opts_.watch_writes) {
      auto watching = BuildSandboxSeccomp(true, true);
      if (!watching.ok()) return watching.status().message();
      watching_seccomp_ = std::move(*watching);
      watching_seccomp_prog_ = watching_seccomp_.prog();
      for (const auto& w : WatchedWrites())
        if (int nr = seccomp_syscall_resolve_name(w.name); nr != __NR_SCMP_ERROR) watched_writes_[nr] = &w;
    }
    if (Status st = OpenNotify(); !st.ok()) return st.message();
  }
  auto groups = cgroup::Groups::Discover();
  if (!groups.ok()) return groups.status().message();
  groups_ = std::move(*groups);
  int swept = groups_->SweepStaleSpawners(opts_.cgroup_parent);
  group_base_ = opts_.cgroup_parent + "/sp" + std::to_string(::getpid());
  if (auto st = groups_->Make(group_base_); !st.ok()) return st.message();
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
    // Best effort: dsecd learns why from this hello, or from the exit code.
    (void)WriteFull(control_, control_out_.data(), control_out_.size());
    if (groups_ && !group_base_.empty()) groups_->RemoveDirs(group_base_);
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
    // Same for the containers' net namespace pool.
    if (container_netns_topping_ && refill_progress_) timeout = 0;
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
      } else if (inits_.count(key)) {
        OnInitDone(key);
      } else if (key == kNotifyKey) {
        OnNotifyReadable();
      } else if (listeners_.count(key)) {
        OnListener(key, events[i].events);
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
    if (!denied_.empty() || !writes_.empty()) FlushDenied();
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
        ev.mutable_finished()->set_id(id);
        auto* o = ev.mutable_finished()->mutable_outcome();
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
    case spawner::Request::kCreateContainer:
      CreateContainer(req.create_container());
      return;
    case spawner::Request::kStats:
      SendStats();
      return;
    case spawner::Request::kAdoptListener:
      AdoptListener(req.adopt_listener());
      return;
    case spawner::Request::kFlush:
      FlushFor(req.flush());
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
  ev.mutable_finished()->set_id(id);
  ev.mutable_finished()->mutable_outcome()->set_platform_error(why);
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
    if (it == by_pid_.end()) {
      ContainerGone(pid);
      continue;
    }
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
  if (r.slot >= 0) ReleaseSlot(r.slot);
  ReleaseNamespaces(r);
  ReleaseStack(r);
  runners_.erase(r.key);
}

void Spawner::Finish(Runner& r) {
  spawner::Event ev;
  ev.mutable_finished()->set_id(r.run_id);
  auto* o = ev.mutable_finished()->mutable_outcome();
  RunSlot& slot = *slots_[r.slot];
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
  ReleaseSlot(r.slot);
  ReleaseNamespaces(r);
  ReleaseStack(r);
  runners_.erase(r.key);
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
    if (slots_[r.slot]->CpuUsageNs() >= r.cpu_time_ms * 1000000) {
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

void Spawner::Go(Runner& r, spawner::Run& run) {
  RunSlot& slot = *slots_[r.slot];
  Status st = slot.SetMemoryLimit(run.memory_bytes());
  if (st.ok()) st = slot.SetPidsMax(run.pids() ? run.pids() + 1 : 0);  // +1: the runner
  r.shared.join_cpu = run.cpu_millis() > 0 || run.cpu_time_ms() > 0;
  // A run that does not join v1's cpu groups is not bound by their quota;
  // in v2 it is in the one group, so the quota goes back to none.
  if (st.ok()) st = slot.SetCpuQuota(r.shared.join_cpu ? run.cpu_millis() : 0);
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

void Spawner::Shutdown() {
  shutting_down_ = true;
  for (auto& run : pending_) FailRun(run.id(), "dsecd is shutting down");
  pending_.clear();
  // Container inits still setting up: no container yet (dsecd records one
  // only once its agent answers). Killed, and waited for below: they run on
  // our memory until they are gone.
  for (auto& [key, init] : inits_)
    if (!init->reaped) ::kill(init->pid, SIGKILL);
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
  while ((!runners_.empty() || !inits_.empty() || !dying_inits_.empty()) && NowNs() < give_up) {
    int n = ::epoll_wait(epoll_.get(), events, 256, 100);
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64 >> 2, stream = events[i].data.u64 & 3;
      if (key == kSignalKey) OnSignal();
      else if (inits_.count(key)) OnInitDone(key);
      else if (key == kNotifyKey) OnNotifyReadable();
      else if (listeners_.count(key)) OnListener(key, events[i].events);
      else if (key != kControlKey) OnRunnerEvent(key, stream, events[i].events);
    }
    OnSignal();
  }
  // Inits that would not die: their memory is left to them.
  for (auto& [key, init] : inits_) (void)init.release();
  for (auto& [pid, init] : dying_inits_) (void)init.release();
  if (!control_eof_) {
    if (!denied_.empty() || !writes_.empty()) FlushDenied();
    ::fcntl(control_, F_SETFL, ::fcntl(control_, F_GETFL) & ~O_NONBLOCK);
    (void)WriteFull(control_, control_out_.data(), control_out_.size());  // dsecd may be gone: nobody to tell
  }
  for (auto& s : slots_)
    if (s) s->Remove();
  if (groups_) {
    groups_->RemoveDirs(group_base_);
    groups_->RemoveDirs(opts_.cgroup_parent);  // only if no other spawner uses it
  }
}

}  // namespace internal

int RunSpawner(const SpawnerOptions& options) {
  internal::Spawner s(options);
  return s.Main();
}

}  // namespace dsec::fncall

