#include "drivers/fncall/fncall_driver.hpp"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <vector>

#include "drivers/fncall/spawner.pb.h"

extern char** environ;

namespace dsec::drivers {

namespace {

std::string DefaultSpawnerPath() {
  if (const char* env = ::getenv("DSEC_SPAWNER"); env && *env) return env;
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "dsec-spawner";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "dsec-spawner";
}

int64_t SteadySeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string DescribeWait(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "ended (status " + std::to_string(status) + ")";
}

std::string Mib(uint64_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

}  // namespace

FncallDriver::FncallDriver(FncallOptions o) : opts_(std::move(o)) {
  if (opts_.spawner_path.empty()) opts_.spawner_path = DefaultSpawnerPath();
}

FncallDriver::~FncallDriver() { Stop(); }

Result<std::unique_ptr<FncallDriver>> FncallDriver::Start(FncallOptions options) {
  std::unique_ptr<FncallDriver> d(new FncallDriver(std::move(options)));
  d->epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  d->wake_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!d->epoll_ || !d->wake_) return Status::FromErrno(errno, "fncall driver: epoll/eventfd");
  DSEC_RETURN_IF_ERROR(d->Launch());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 1;
  ::epoll_ctl(d->epoll_.get(), EPOLL_CTL_ADD, d->wake_.get(), &ev);
  d->io_ = std::thread([p = d.get()] { p->IoLoop(); });
  return d;
}

Status FncallDriver::Launch() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return Status::FromErrno(errno, "fncall driver: socketpair");
  UniqueFd ours(sv[0]), theirs(sv[1]);
  std::vector<std::string> args = {opts_.spawner_path,
                                   "--fd", "3",
                                   "--uid", std::to_string(opts_.uid),
                                   "--gid", std::to_string(opts_.gid),
                                   "--pool", std::to_string(opts_.pool_size),
                                   "--max-runners", std::to_string(opts_.max_runners),
                                   "--cgroup-parent", opts_.cgroup_parent,
                                   "--tmpfs-bytes", std::to_string(opts_.tmpfs_bytes)};
  if (opts_.fresh_namespaces) args.push_back("--fresh-namespaces");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, theirs.get(), 3);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, opts_.spawner_path.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return Status::FromErrno(rc, "fncall: start " + opts_.spawner_path +
                                     " (build it, or point $DSEC_SPAWNER at it)");
  theirs.Reset();
  // Wait for the hello; log lines may come first.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.start_timeout_ms);
  spawner::Hello hello;
  bool got = false;
  while (!got) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    pollfd p{ours.get(), POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return Status::Unavailable("fncall: " + opts_.spawner_path + " did not say hello within " +
                                 std::to_string(opts_.start_timeout_ms) + " ms");
    }
    std::string frame;
    int err = ReadFrame(ours.get(), &frame);
    if (err) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      return Status::Unavailable("fncall: " + opts_.spawner_path + " " + DescribeWait(status) +
                                 " before saying hello");
    }
    spawner::Event ev;
    if (!ev.ParseFromString(frame)) continue;
    if (ev.has_log() && opts_.log) opts_.log(ev.log().level(), "spawner: " + ev.log().text());
    if (ev.has_hello()) {
      hello = ev.hello();
      got = true;
    }
  }
  if (!hello.error().empty()) {
    ::waitpid(pid, nullptr, 0);
    return Status::FailedPrecondition("fncall not available on this host: " + hello.error());
  }
  ::fcntl(ours.get(), F_SETFL, ::fcntl(ours.get(), F_GETFL) | O_NONBLOCK);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return Status::FromErrno(errno, "fncall: pidfd_open");
  }
  if (opts_.log)
    opts_.log(1, "fncall spawner pid " + std::to_string(pid) + " ready (cgroups " +
                     hello.cgroup_path() + ", " +
                     (hello.fresh_namespaces() ? "fresh" : "recycled") + " net/ipc namespaces)");
  sock_ = std::move(ours);
  pidfd_ = std::move(pidfd);
  spawner_pid_ = pid;
  decoder_ = FrameDecoder();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 2;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sock_.get(), &ev);
  ev.data.u64 = 3;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pidfd_.get(), &ev);
  return Status::Ok();
}

void FncallDriver::Wake() {
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

void FncallDriver::Enqueue(const std::string& payload) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    AppendFrame(&outbox_, payload);
  }
  Wake();
}

void FncallDriver::IoLoop() {
  std::string pending;  // bytes taken from outbox_ not yet written
  epoll_event events[16];
  while (!(stopping_ && spawner_pid_ < 0)) {
    if (pending.empty()) {
      std::lock_guard<std::mutex> lk(mu_);
      pending.swap(outbox_);
    }
    if (!pending.empty() && sock_) {
      ssize_t w = ::write(sock_.get(), pending.data(), pending.size());
      if (w > 0) pending.erase(0, static_cast<size_t>(w));
    }
    if (sock_) {
      epoll_event ev{};
      ev.events = EPOLLIN | (pending.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
      ev.data.u64 = 2;
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, sock_.get(), &ev);
    }
    int n = ::epoll_wait(epoll_.get(), events, 16, 1000);
    if (n == 0 && sock_) {
      // Idle for a second: refresh the spawner's numbers for `stats`.
      spawner::Request r;
      r.mutable_stats();
      AppendFrame(&pending, r.SerializeAsString());
    }
    for (int i = 0; i < n; ++i) {
      switch (events[i].data.u64) {
        case 1: {
          uint64_t v;
          (void)!::read(wake_.get(), &v, sizeof v);
          break;
        }
        case 2: {
          char buf[1 << 16];
          for (;;) {
            ssize_t r = ::read(sock_.get(), buf, sizeof buf);
            if (r > 0) {
              decoder_.Feed(buf, static_cast<size_t>(r));
              continue;
            }
            if (r < 0 && errno == EINTR) continue;
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
              ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sock_.get(), nullptr);
            }
            break;
          }
          std::string frame;
          int rc;
          while ((rc = decoder_.Next(&frame)) == 1) OnFrame(frame);
          if (rc < 0) {
            if (opts_.log) opts_.log(3, "fncall spawner sent an oversized frame; killing it");
            ::kill(spawner_pid_, SIGKILL);
          }
          break;
        }
        case 3: {
          // The spawner exited. Whatever it wrote before (outcomes of runs
          // that did finish) is still in the socket: read it first.
          for (char buf[1 << 16];;) {
            ssize_t got = sock_ ? ::read(sock_.get(), buf, sizeof buf) : 0;
            if (got <= 0) break;
            decoder_.Feed(buf, static_cast<size_t>(got));
          }
          for (std::string frame; decoder_.Next(&frame) == 1;) OnFrame(frame);
          int status = 0;
          ::waitpid(spawner_pid_, &status, 0);
          pending.clear();
          OnSpawnerGone(DescribeWait(status));
          break;
        }
      }
    }
  }
}

void FncallDriver::OnFrame(const std::string& frame) {
  spawner::Event ev;
  if (!ev.ParseFromString(frame)) {
    if (opts_.log) opts_.log(3, "fncall spawner sent a frame that is not an Event");
    return;
  }
  if (ev.has_log()) {
    if (opts_.log) opts_.log(ev.log().level(), "spawner: " + ev.log().text());
    return;
  }
  if (ev.has_stats()) {
    const auto& s = ev.stats();
    std::string j = "{\"ready\":" + std::to_string(s.ready()) +
                    ",\"running\":" + std::to_string(s.running()) +
                    ",\"starting\":" + std::to_string(s.starting()) +
                    ",\"runs\":" + std::to_string(s.runs()) +
                    ",\"runner_failures\":" + std::to_string(s.runner_failures()) +
                    ",\"netns_free\":" + std::to_string(s.netns_free()) +
                    ",\"netns_total\":" + std::to_string(s.netns_total()) +
                    ",\"ipcns_free\":" + std::to_string(s.ipcns_free()) +
                    ",\"ipcns_total\":" + std::to_string(s.ipcns_total()) + "}";
    std::lock_guard<std::mutex> lk(mu_);
    last_stats_json_ = j;
    return;
  }
  if (!ev.has_outcome()) return;
  const auto& o = ev.outcome();
  InFlight f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = inflight_.find(o.id());
    if (it == inflight_.end()) return;
    f = std::move(it->second);
    inflight_.erase(it);
    by_run_id_.erase(f.run_id);
  }
  auto res = ToExecResult(o, f.limits, f.argv0);
  res.set_run_id(f.run_id);
  if (res.verdict() == v1::VERDICT_PLATFORM_ERROR) ++runs_failed_;
  ++runs_done_;
  f.done(std::move(res));
}

void FncallDriver::OnSpawnerGone(const std::string& why) {
  pid_t old = spawner_pid_.exchange(-1);
  if (sock_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sock_.get(), nullptr);
  if (pidfd_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, pidfd_.get(), nullptr);
  sock_.Reset();
  pidfd_.Reset();
  std::unordered_map<uint64_t, InFlight> lost;
  {
    std::lock_guard<std::mutex> lk(mu_);
    lost.swap(inflight_);
    by_run_id_.clear();
    outbox_.clear();
  }
  std::string msg = stopping_ ? std::string("dsecd is shutting down")
                              : "the fncall spawner (pid " + std::to_string(old) + ") " + why +
                                    "; the run's outcome is unknown";
  for (auto& [id, f] : lost) {
    v1::ExecResult r;
    r.set_verdict(v1::VERDICT_PLATFORM_ERROR);
    r.set_error(msg);
    r.set_run_id(f.run_id);
    f.done(std::move(r));
  }
  if (stopping_) return;
  if (opts_.log) opts_.log(3, "fncall spawner pid " + std::to_string(old) + " " + why + "; restarting it");
  int64_t now = SteadySeconds();
  Status st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    restarts_.push_back(now);
    while (!restarts_.empty() && restarts_.front() < now - opts_.restart_window_s)
      restarts_.erase(restarts_.begin());
    if (static_cast<int>(restarts_.size()) > opts_.max_restarts)
      st = Status::Unavailable("fncall unavailable: the spawner died " +
                               std::to_string(restarts_.size()) + " times in " +
                               std::to_string(opts_.restart_window_s) + " s (last: " + why +
                               "); see the dsecd log, then restart dsecd");
  }
  if (st.ok()) st = Launch();
  if (!st.ok()) {
    if (opts_.log) opts_.log(3, st.message());
    std::lock_guard<std::mutex> lk(mu_);
    unavailable_ = st;
  }
}

Status FncallDriver::Available() const {
  std::lock_guard<std::mutex> lk(mu_);
  return unavailable_;
}

Status FncallDriver::CanHandle(const v1::SandboxSpec& spec) const {
  if (!spec.image().empty() && spec.image() != "host")
    return Status::InvalidArgument("fncall runs only on the built-in 'host' image, not '" +
                                   spec.image() + "' (use --kind container for built images)");
  if (spec.network().enabled())
    return Status::InvalidArgument("fncall sandboxes have no network; use --kind container for network access");
  return Available();
}

void FncallDriver::Create(const v1::SandboxRecord& sandbox, StatusCallback done) {
  done(CanHandle(sandbox.spec()));
}

void FncallDriver::Destroy(const v1::SandboxRecord&, StatusCallback done) { done(Status::Ok()); }

Status FncallDriver::Readopt(const v1::SandboxRecord&) { return Available(); }

void FncallDriver::Exec(const v1::SandboxRecord& sandbox, const std::string& run_id,
                        const v1::ExecRequest& req, ExecCallback done) {
  const v1::Limits& lim = req.limits();
  spawner::Request r;
  auto* run = r.mutable_run();
  for (const auto& a : req.argv()) run->add_argv(a);
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"HOME", "/work"},
      {"LANG", "C.UTF-8"},
      {"TMPDIR", "/tmp"},
      {"USER", "sandbox"}};
  for (const auto& [k, v] : sandbox.spec().env()) env[k] = v;
  for (const auto& [k, v] : req.env()) env[k] = v;
  for (const auto& [k, v] : env) run->add_env(k + "=" + v);
  run->set_cwd(!req.cwd().empty() ? req.cwd()
               : !sandbox.spec().workdir().empty() ? sandbox.spec().workdir()
                                                   : "/work");
  run->set_stdin(req.stdin());
  run->set_memory_bytes(lim.memory_bytes());
  run->set_pids(lim.pids());
  run->set_cpu_millis(lim.cpu_millis());
  run->set_timeout_ms(lim.timeout_ms());
  run->set_cpu_time_ms(lim.cpu_time_ms());
  run->set_output_bytes(lim.output_bytes());
  run->set_file_size_bytes(lim.file_size_bytes());
  run->set_open_files(lim.open_files());
  Status refused;
  size_t frame_size = r.ByteSizeLong();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (frame_size + 4096 > kMaxFrameBytes) {
      // The spawner would take it for a corrupt stream; callers validate
      // sizes first, so this is a last line of defence.
      refused = Status::InvalidArgument("fncall: the run request is " + std::to_string(frame_size) +
                                        " bytes, above the protocol's limit");
    } else if (!unavailable_.ok()) {
      refused = unavailable_;
    } else if (stopping_ || spawner_pid_ < 0) {
      refused = Status::Unavailable("fncall spawner is not running (restarting or shutting down)");
    } else {
      uint64_t id = next_id_++;
      run->set_id(id);
      std::string frame = r.SerializeAsString();
      inflight_[id] = InFlight{std::move(done), lim, req.argv(0), run_id};
      by_run_id_[run_id] = id;
      AppendFrame(&outbox_, frame);
    }
  }
  if (!refused.ok()) {
    done(refused);  // outside the lock: the callback may call back into us
    return;
  }
  Wake();
}

Status FncallDriver::Kill(const std::string& run_id, const std::string& reason) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_run_id_.find(run_id);
    if (it == by_run_id_.end()) return Status::NotFound("run " + run_id + " is not in flight");
    id = it->second;
  }
  spawner::Request r;
  r.mutable_kill()->set_id(id);
  r.mutable_kill()->set_reason(reason);
  Enqueue(r.SerializeAsString());
  return Status::Ok();
}

std::string FncallDriver::StatsJson() const {
  // The spawner's numbers are refreshed by the I/O thread every idle second
  // (and on every ask); this answer carries the latest ones received.
  spawner::Request r;
  r.mutable_stats();
  const_cast<FncallDriver*>(this)->Enqueue(r.SerializeAsString());
  std::lock_guard<std::mutex> lk(mu_);
  return "{\"spawner_pid\":" + std::to_string(spawner_pid_.load()) +
         ",\"inflight\":" + std::to_string(inflight_.size()) +
         ",\"runs_done\":" + std::to_string(runs_done_.load()) +
         ",\"platform_errors\":" + std::to_string(runs_failed_.load()) +
         ",\"spawner\":" + last_stats_json_ + "}";
}

void FncallDriver::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  if (!io_.joinable()) return;
  spawner::Request r;
  r.mutable_shutdown();
  Enqueue(r.SerializeAsString());
  // The spawner kills its runners, removes its cgroups and exits; the I/O
  // thread returns once it has seen the exit. Backstop: SIGKILL after 15 s.
  auto done = std::async(std::launch::async, [this] { io_.join(); });
  if (done.wait_for(std::chrono::seconds(15)) != std::future_status::ready) {
    pid_t pid = spawner_pid_.load();
    if (pid > 0) ::kill(pid, SIGKILL);
    Wake();
  }
  done.wait();
}

v1::ExecResult FncallDriver::ToExecResult(const spawner::Outcome& o, const v1::Limits& limits,
                                          const std::string& argv0) {
  v1::ExecResult r;
  r.set_exit_code(o.exit_code());
  r.set_signal(o.signal());
  r.set_stdout(o.stdout());
  r.set_stderr(o.stderr());
  r.set_stdout_truncated(o.stdout_truncated());
  r.set_stderr_truncated(o.stderr_truncated());
  r.set_cpu_us(o.cpu_us());
  r.set_wall_us(o.wall_us());
  r.set_peak_memory_bytes(o.peak_memory_bytes());
  if (!o.platform_error().empty()) {
    r.set_verdict(v1::VERDICT_PLATFORM_ERROR);
    r.set_error("platform error: " + o.platform_error());
  } else if (o.killed()) {
    r.set_verdict(v1::VERDICT_PLATFORM_ERROR);
    r.set_error("killed" + (o.kill_reason().empty() ? std::string() : ": " + o.kill_reason()));
  } else if (o.timed_out()) {
    r.set_verdict(v1::VERDICT_TIME_LIMIT);
    r.set_error("time limit: wall-clock limit of " + std::to_string(limits.timeout_ms()) +
                " ms exceeded");
  } else if (o.cpu_time_exceeded()) {
    r.set_verdict(v1::VERDICT_TIME_LIMIT);
    r.set_error("time limit: CPU-time limit of " + std::to_string(limits.cpu_time_ms()) +
                " ms exceeded");
  } else if (o.oom_killed()) {
    r.set_verdict(v1::VERDICT_MEMORY_LIMIT);
    r.set_error("memory limit: the run used more than " + Mib(limits.memory_bytes()) +
                " and was killed");
  } else if (o.output_exceeded()) {
    r.set_verdict(v1::VERDICT_OUTPUT_LIMIT);
    r.set_error("output limit: a stream passed " + std::to_string(limits.output_bytes()) +
                " bytes; the run was killed and its output truncated");
  } else if (!o.user_error().empty()) {
    r.set_verdict(v1::VERDICT_RUNTIME_ERROR);
    r.set_exec_failed(true);
    r.set_exit_code(126);
    r.set_error(o.user_error());
  } else if (o.exec_errno()) {
    r.set_verdict(v1::VERDICT_RUNTIME_ERROR);
    r.set_exec_failed(true);
    // The shell's convention, whatever the Outcome says: 127 not found, 126 not executable.
    r.set_exit_code(o.exec_errno() == ENOENT ? 127 : 126);
    r.set_error(argv0 + (o.exec_errno() == ENOENT ? ": command not found"
                                                   : std::string(": cannot execute: ") +
                                                         std::strerror(o.exec_errno())));
  } else if (o.exited()) {
    r.set_verdict(o.exit_code() == 0 ? v1::VERDICT_OK : v1::VERDICT_RUNTIME_ERROR);
  } else {
    r.set_verdict(v1::VERDICT_RUNTIME_ERROR);
    r.set_error(std::string("killed by signal ") + strsignal(o.signal()));
  }
  return r;
}

}  // namespace dsec::drivers
