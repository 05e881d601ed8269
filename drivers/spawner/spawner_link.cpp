#include "drivers/spawner/spawner_link.hpp"

#include "runtime/clock.hpp"

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

#include "drivers/spawner/spawner.pb.h"
#include "runtime/files.hpp"

extern char** environ;

namespace dsec::drivers {

namespace {

int64_t SteadySeconds() { return SteadyClockMs() / 1000; }

std::string DescribeWait(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "ended (status " + std::to_string(status) + ")";
}

}  // namespace

std::string DefaultSpawnerPath() { return SiblingExecutable("DSEC_SPAWNER", "dsec-spawner"); }

SpawnerLink::SpawnerLink(SpawnerLinkOptions o, EventHandler on_event, GoneHandler on_gone)
    : opts_(std::move(o)), on_event_(std::move(on_event)), on_gone_(std::move(on_gone)) {
  if (opts_.spawner_path.empty()) opts_.spawner_path = DefaultSpawnerPath();
}

SpawnerLink::~SpawnerLink() { Stop(); }

Result<std::unique_ptr<SpawnerLink>> SpawnerLink::Start(SpawnerLinkOptions options, EventHandler on_event,
                                                        GoneHandler on_gone) {
  std::unique_ptr<SpawnerLink> l(new SpawnerLink(std::move(options), std::move(on_event), std::move(on_gone)));
  l->epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  l->wake_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!l->epoll_ || !l->wake_) return Status::FromErrno(errno, l->opts_.name + ": epoll/eventfd");
  DSEC_RETURN_IF_ERROR(l->Launch());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 1;
  ::epoll_ctl(l->epoll_.get(), EPOLL_CTL_ADD, l->wake_.get(), &ev);
  l->io_ = std::thread([p = l.get()] { p->IoLoop(); });
  return l;
}

Status SpawnerLink::Launch() {
  const std::string& name = opts_.name;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return Status::FromErrno(errno, name + ": socketpair");
  UniqueFd ours(sv[0]), theirs(sv[1]);
  std::vector<std::string> args = {opts_.spawner_path, "--fd", "3"};
  for (const auto& a : opts_.args) args.push_back(a);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, theirs.get(), 3);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // A process group of its own: a terminal's Ctrl-C reaches dsecd alone,
  // which stops the spawner by closing its socket (it would otherwise
  // leave first, and be restarted during the shutdown).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, opts_.spawner_path.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return Status::FromErrno(rc, name + ": start " + opts_.spawner_path + " (build it, or point $DSEC_SPAWNER at it)");
  theirs.Reset();
  // Wait for the hello; log lines may come first.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.start_timeout_ms);
  spawner::Hello hello;
  for (bool got = false; !got;) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    pollfd p{ours.get(), POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return Status::Unavailable(name + ": " + opts_.spawner_path + " did not say hello within " +
                                 std::to_string(opts_.start_timeout_ms) + " ms");
    }
    std::string frame;
    if (ReadFrame(ours.get(), &frame) != 0) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      return Status::Unavailable(name + ": " + opts_.spawner_path + " " + DescribeWait(status) + " before saying hello");
    }
    spawner::Event ev;
    if (!ev.ParseFromString(frame)) continue;
    if (ev.has_log() && opts_.log) opts_.log(ev.log().level(), name + " spawner: " + ev.log().text());
    if (ev.has_hello()) {
      hello = ev.hello();
      got = true;
    }
  }
  if (!hello.error().empty()) {
    ::waitpid(pid, nullptr, 0);
    return Status::FailedPrecondition(name + " not available on this host: " + hello.error());
  }
  ::fcntl(ours.get(), F_SETFL, ::fcntl(ours.get(), F_GETFL) | O_NONBLOCK);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return Status::FromErrno(errno, name + ": pidfd_open");
  }
  if (opts_.log)
    opts_.log(1, name + " spawner pid " + std::to_string(pid) + " ready (cgroups " + hello.cgroup_path() + ", " +
                     (hello.fresh_namespaces() ? "fresh" : "recycled") + " net/ipc namespaces)");
  sock_ = std::move(ours);
  pidfd_ = std::move(pidfd);
  pid_ = pid;
  decoder_ = FrameDecoder();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 2;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sock_.get(), &ev);
  ev.data.u64 = 3;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pidfd_.get(), &ev);
  return Status::Ok();
}

void SpawnerLink::Wake() {
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

Status SpawnerLink::Send(const spawner::Request& request) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!unavailable_.ok()) return unavailable_;
    if (stopping_ || pid_ < 0)
      return Status::Unavailable(opts_.name + " spawner is not running (restarting or shutting down)");
    AppendFrame(&outbox_, request.SerializeAsString());
  }
  Wake();
  return Status::Ok();
}

Status SpawnerLink::Available() const {
  std::lock_guard<std::mutex> lk(mu_);
  return unavailable_;
}

void SpawnerLink::IoLoop() {
  std::string pending;  // bytes taken from outbox_ not yet written
  epoll_event events[16];
  while (!(stopping_ && pid_ < 0)) {
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
      // Idle for a second: refresh the spawner's numbers (they come back as
      // a Stats event).
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
            if (r == 0 || (r < 0 && errno != EAGAIN)) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sock_.get(), nullptr);
            break;
          }
          std::string frame;
          int rc;
          while ((rc = decoder_.Next(&frame)) == 1) OnFrame(frame);
          if (rc < 0) {
            if (opts_.log) opts_.log(3, opts_.name + " spawner sent an oversized frame; killing it");
            ::kill(pid_, SIGKILL);
          }
          break;
        }
        case 3: {
          // It exited. What it wrote before (outcomes of work that did
          // finish) is still in the socket: read that first.
          for (char buf[1 << 16];;) {
            ssize_t got = sock_ ? ::read(sock_.get(), buf, sizeof buf) : 0;
            if (got <= 0) break;
            decoder_.Feed(buf, static_cast<size_t>(got));
          }
          for (std::string frame; decoder_.Next(&frame) == 1;) OnFrame(frame);
          int status = 0;
          ::waitpid(pid_, &status, 0);
          pending.clear();
          OnGone(DescribeWait(status));
          break;
        }
      }
    }
  }
}

void SpawnerLink::OnFrame(const std::string& frame) {
  spawner::Event ev;
  if (!ev.ParseFromString(frame)) {
    if (opts_.log) opts_.log(3, opts_.name + " spawner sent a frame that is not an Event");
    return;
  }
  if (ev.has_log()) {
    if (opts_.log) opts_.log(ev.log().level(), opts_.name + " spawner: " + ev.log().text());
    return;
  }
  if (ev.has_hello()) return;
  on_event_(ev);
}

void SpawnerLink::OnGone(const std::string& why) {
  pid_t old = pid_.exchange(-1);
  if (sock_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sock_.get(), nullptr);
  if (pidfd_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, pidfd_.get(), nullptr);
  sock_.Reset();
  pidfd_.Reset();
  {
    std::lock_guard<std::mutex> lk(mu_);
    outbox_.clear();
  }
  on_gone_("the " + opts_.name + " spawner (pid " + std::to_string(old) + ") " + why, stopping_);
  if (stopping_) return;
  if (opts_.log) opts_.log(3, opts_.name + " spawner pid " + std::to_string(old) + " " + why + "; restarting it");
  int64_t now = SteadySeconds();
  Status st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    restarts_.push_back(now);
    while (!restarts_.empty() && restarts_.front() < now - opts_.restart_window_s) restarts_.erase(restarts_.begin());
    if (static_cast<int>(restarts_.size()) > opts_.max_restarts)
      st = Status::Unavailable(opts_.name + " unavailable: the spawner died " + std::to_string(restarts_.size()) +
                               " times in " + std::to_string(opts_.restart_window_s) + " s (last: it " + why +
                               "); see the dsecd log, then restart dsecd");
  }
  if (st.ok()) st = Launch();
  if (st.ok() && opts_.on_restarted) opts_.on_restarted();
  if (!st.ok()) {
    if (opts_.log) opts_.log(3, st.message());
    std::lock_guard<std::mutex> lk(mu_);
    unavailable_ = st;
  }
}

void SpawnerLink::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  if (!io_.joinable()) return;
  {
    spawner::Request r;
    r.mutable_shutdown();
    std::lock_guard<std::mutex> lk(mu_);
    AppendFrame(&outbox_, r.SerializeAsString());
  }
  Wake();
  // The spawner cleans up and exits; the I/O thread returns once it has seen
  // the exit. Backstop: SIGKILL after 15 s.
  auto done = std::async(std::launch::async, [this] { io_.join(); });
  if (done.wait_for(std::chrono::seconds(15)) != std::future_status::ready) {
    pid_t pid = pid_.load();
    if (pid > 0) ::kill(pid, SIGKILL);
    Wake();
  }
  done.wait();
}

}  // namespace dsec::drivers
