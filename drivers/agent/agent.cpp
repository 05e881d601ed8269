// dsec-agent's event loop: setup as PID 1 or subreaper, the listening socket,
// connections and their framing, requests dispatched to agent_exec.cpp and
// agent_files.cpp, signals, timers, and the clean exit when not PID 1.
#include "drivers/agent/agent_internal.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "drivers/agent/channel_sync.hpp"

#ifndef DSEC_VERSION
#define DSEC_VERSION "unknown"
#endif

namespace dsec::agent {
namespace internal {

int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Creates a listening unix socket at `path`, mode 0600, replacing a stale
// socket file (a previous agent's) but nothing else.
std::string ListenUnix(const std::string& path, UniqueFd* out, ino_t* ino) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    return "socket path '" + path + "' is longer than " + std::to_string(sizeof addr.sun_path - 1) + " bytes";
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return "'" + path + "' exists and is not a socket; refusing to replace it";
    if (::unlink(path.c_str()) < 0) return Errno("remove the stale socket " + path);
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return Errno("socket");
  mode_t old = ::umask(0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc < 0) return Errno("bind " + path);
  if (::chmod(path.c_str(), 0600) < 0) return Errno("chmod " + path);
  if (::listen(fd.get(), 128) < 0) return Errno("listen on " + path);
  if (::lstat(path.c_str(), &st) == 0) *ino = st.st_ino;
  *out = std::move(fd);
  return {};
}

}  // namespace

std::string Agent::Init() {
  pid1_ = ::getpid() == 1;
  if (!opts_.cgroup.empty()) {
    cgroup_procs_ = opts_.cgroup + "/cgroup.procs";
    if (opts_.oom_events.empty()) opts_.oom_events = opts_.cgroup + "/memory.events";
    if (::access(cgroup_procs_.c_str(), W_OK) != 0) return Errno("--cgroup: " + cgroup_procs_);
  }
  ::umask(022);
  // Whatever our parent ignored or blocked must not reach the commands we run
  // (an ignored SIGCHLD would even auto-reap them).
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  if (pid1_) {
    // The host stops a container by killing it; nothing inside may stop us.
    for (int s : {SIGTERM, SIGINT, SIGHUP}) ::signal(s, SIG_IGN);
  } else {
    for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
    // Orphans of the commands we run become our children, as under PID 1.
    if (::prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) return Errno("prctl(PR_SET_CHILD_SUBREAPER)");
  }
  ::sigprocmask(SIG_SETMASK, &set, nullptr);
  // Each exec holds four pipe ends while it runs: lift our soft limit on
  // descriptors to the hard one (commands get the original back).
  if (::getrlimit(RLIMIT_NOFILE, &nofile_) == 0 && nofile_.rlim_cur < nofile_.rlim_max) {
    rlimit raised{nofile_.rlim_max, nofile_.rlim_max};
    ::setrlimit(RLIMIT_NOFILE, &raised);
  }
  sigfd_.Reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!sigfd_ || !epoll_) return Errno("signalfd/epoll");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kSignal;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sigfd_.get(), &ev);

  if (opts_.listen_path.empty() && opts_.listen_fd < 0 && opts_.fd < 0)
    return "nothing to serve: give --listen PATH, --listen-fd N or --fd N";
  if (opts_.listen_fd >= 0) {
    ::fcntl(opts_.listen_fd, F_SETFD, FD_CLOEXEC);
    SetNonBlocking(opts_.listen_fd);
    listen_.Reset(opts_.listen_fd);
    ev.events = EPOLLIN;
    ev.data.u64 = kListen;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listen_.get(), &ev);
  }
  if (!opts_.listen_path.empty()) {
    std::string err = ListenUnix(opts_.listen_path, &listen_, &listen_ino_);
    if (!err.empty()) return err;
    ev.events = EPOLLIN;
    ev.data.u64 = kListen;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listen_.get(), &ev);
  }
  if (opts_.fd >= 0 && opts_.vport) {
    ::fcntl(opts_.fd, F_SETFD, FD_CLOEXEC);
    SetNonBlocking(opts_.fd);
    vport_.Reset(opts_.fd);
    VportWatch(kVport);
  } else if (opts_.fd >= 0) {
    ::fcntl(opts_.fd, F_SETFD, FD_CLOEXEC);
    SetNonBlocking(opts_.fd);
    Conn* c = AddConn(opts_.fd);
    if (!c) return Errno("serve fd " + std::to_string(opts_.fd));
    fd_conn_ = c->key;
  }
  return {};
}

int Agent::Main() {
  start_ns_ = NowNs();
  std::string err = Init();
  if (!err.empty()) {
    std::fprintf(stderr, "dsec-agent: %s\n", err.c_str());
    return 1;
  }
  if (opts_.ready_fd >= 0) {
    (void)WriteFull(opts_.ready_fd, "ready\n", 6);  // a parent that stopped waiting has nothing to learn
    ::close(opts_.ready_fd);
  }
  Loop();
  Shutdown();
  return 0;
}

void Agent::Loop() {
  epoll_event events[128];
  while (!stop_) {
    std::set<uint64_t> dirty;
    dirty.swap(dirty_);
    for (uint64_t key : dirty)
      if (Conn* c = FindConn(key)) Flush(*c);
    CollectClosed();
    if (stop_) break;
    int n = ::epoll_wait(epoll_.get(), events, 128, NextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "dsec-agent: epoll_wait: %s\n", std::strerror(errno));
      if (!pid1_) break;
      continue;
    }
    // Reap first: whatever exited before a request arrived is gone by the
    // time the request is served (Ping is a barrier for that).
    Reap();
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64 >> 3;
      auto kind = static_cast<Kind>(events[i].data.u64 & 7);
      switch (kind) {
        case kListen: OnListen(); break;
        case kSignal: OnSignalFd(); break;
        case kVport: OnVportEvent(events[i].events); break;
        case kInotify: OnInotify(); break;
        case kConn:
          if (Conn* c = FindConn(key)) OnConnEvent(*c, events[i].events);
          break;
        default: OnExecEvent(key, kind, events[i].events); break;
      }
    }
    RunTimers();
    CollectClosed();
  }
}

int Agent::NextTimeoutMs() const {
  if (!dirty_.empty()) return 0;
  int64_t next = timers_.empty() ? 0 : timers_.begin()->first;
  if (!attach_timers_.empty() && (!next || attach_timers_.begin()->first < next)) next = attach_timers_.begin()->first;
  if (listen_resume_ns_ && (!next || listen_resume_ns_ < next)) next = listen_resume_ns_;
  if (vport_poll_ns_ && (!next || vport_poll_ns_ < next)) next = vport_poll_ns_;
  if (!next) return -1;
  int64_t dt = next - NowNs();
  return dt <= 0 ? 0 : static_cast<int>(dt / 1000000 + 1);
}

void Agent::RunTimers() {
  int64_t now = NowNs();
  if (listen_resume_ns_ && listen_resume_ns_ <= now) {
    listen_resume_ns_ = 0;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListen;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listen_.get(), &ev);
  }
  if (vport_poll_ns_ && vport_poll_ns_ <= now) {
    // Hung up: a host is back when the port no longer says so.
    pollfd p{vport_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) >= 0 && !(p.revents & POLLHUP)) {
      vport_poll_ns_ = 0;
      VportWatch(kVport);
    } else {
      vport_poll_ns_ = now + 50'000'000;
    }
  }
  while (!attach_timers_.empty() && attach_timers_.begin()->first <= now) {
    auto [conn, id] = attach_timers_.begin()->second;
    attach_timers_.erase(attach_timers_.begin());
    OnAttachTimer(conn, id);
  }
  while (!timers_.empty() && timers_.begin()->first <= now) {
    auto [when, key] = *timers_.begin();
    timers_.erase(timers_.begin());
    OnExecTimer(key, when);
  }
}

void Agent::OnSignalFd() {
  signalfd_siginfo si;
  while (::read(sigfd_.get(), &si, sizeof si) == sizeof si) {
    // SIGCHLD: Reap() runs every iteration. The others reach us only when we
    // are not PID 1 (they are ignored there).
    if (si.ssi_signo != SIGCHLD) stop_ = true;
  }
}

void Agent::OnListen() {
  for (;;) {
    int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection would wake us at once, forever: stop
        // listening for a moment instead of spinning.
        std::fprintf(stderr, "dsec-agent: accept: %s; pausing for 100 ms\n", std::strerror(errno));
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listen_.get(), nullptr);
        listen_resume_ns_ = NowNs() + 100'000'000;
      } else if (errno != EAGAIN) {
        std::fprintf(stderr, "dsec-agent: accept: %s\n", std::strerror(errno));
      }
      return;
    }
    if (conns_.size() >= kMaxConnections) {
      ::close(fd);  // the client sees EOF; it may retry once others leave
      continue;
    }
    if (pid1_ && !FromOutside(fd)) {
      ::close(fd);  // the sandbox's own process: a forged request runs nothing
      continue;
    }
    if (!AddConn(fd)) ::close(fd);
  }
}

// As the sandbox's PID 1, the agent serves only peers outside its pid
// namespace (dsecd, the spawner): SO_PEERCRED gives their pid as 0 here. A
// process of the sandbox (root in it included) has a pid here, and its
// connection is closed unread, logged (DSec saw agents forge requests to
// their daemon's socket, to run as another user or to fake what the
// trainer reads).
bool Agent::FromOutside(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  if (cred.pid == 0) return true;
  // Logged 10 times, then every 1000th (a loop of connects is no way to
  // fill the host's log).
  static uint64_t refused = 0;
  if (++refused <= 10 || refused % 1000 == 0)
    std::fprintf(stderr,
                 "dsec-agent: refused a connection to the agent's socket from the sandbox's own pid %d (uid %u); "
                 "%llu so far\n",
                 static_cast<int>(cred.pid), static_cast<unsigned>(cred.uid), static_cast<unsigned long long>(refused));
  return false;
}

Conn* Agent::AddConn(int fd) {
  auto c = std::make_unique<Conn>();
  c->key = next_key_++;
  c->interest = EPOLLIN;
  epoll_event ev{};
  ev.events = c->interest;
  ev.data.u64 = (c->key << 3) | kConn;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) < 0) return nullptr;
  c->fd.Reset(fd);
  Conn* p = c.get();
  conns_[p->key] = std::move(c);
  return p;
}

Conn* Agent::FindConn(uint64_t key) {
  auto it = conns_.find(key);
  return it == conns_.end() || it->second->closing ? nullptr : it->second.get();
}

void Agent::OnConnEvent(Conn& c, uint32_t events) {
  if (events & EPOLLOUT) Flush(c);
  if (c.closing) return;
  if (events & EPOLLIN) OnConnReadable(c);
  else if ((events & (EPOLLHUP | EPOLLERR)) && c.vport) VportHangup();
  else if (events & (EPOLLHUP | EPOLLERR)) CloseConn(c);
}

void Agent::VportWatch(uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, vport_.get(), &ev) < 0)
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, vport_.get(), &ev);
}

void Agent::OnVportEvent(uint32_t events) {
  char buf[kReadChunk];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = ::read(vport_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      VportHangup();
      return;
    }
    VportScan(std::string(buf, static_cast<size_t>(n)));
    if (fd_conn_) return;  // a host synced; the conversation reads on
  }
  if ((events & (EPOLLHUP | EPOLLERR)) && !(events & EPOLLIN)) VportHangup();
}

void Agent::VportScan(std::string bytes) {
  vport_scan_ += bytes;
  size_t at = FindSync(vport_scan_, kSyncAsk);
  if (at == std::string::npos) {
    // Skipped, but a marker cut in two must still be found.
    if (vport_scan_.size() > kSyncBytes) vport_scan_.erase(0, vport_scan_.size() - (kSyncBytes - 1));
    return;
  }
  std::string answer(kSyncAnswer, sizeof kSyncAnswer);
  answer.append(vport_scan_, at + 8, 8);
  std::string rest = vport_scan_.substr(at + kSyncBytes);
  vport_scan_.clear();
  auto c = std::make_unique<Conn>();
  c->key = next_key_++;
  c->vport = true;
  c->interest = EPOLLIN;
  c->fd.Reset(vport_.get());
  c->out = std::move(answer);
  Conn* p = c.get();
  conns_[p->key] = std::move(c);
  fd_conn_ = p->key;
  VportWatch((p->key << 3) | kConn);
  dirty_.insert(p->key);
  if (!rest.empty()) {
    p->dec.Feed(rest.data(), rest.size());
    ProcessFrames(*p);
  }
}

void Agent::VportHangup() {
  if (Conn* c = FindConn(fd_conn_)) CloseConn(*c);
  fd_conn_ = 0;
  vport_scan_.clear();
  // A hung-up port reports EPOLLHUP whatever we ask for: leave the set and
  // look every 50 ms.
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, vport_.get(), nullptr);
  vport_poll_ns_ = NowNs() + 50'000'000;
}

void Agent::OnConnReadable(Conn& c) {
  char buf[kReadChunk];
  bool eof = false;
  // Bounded per wake-up so one busy client cannot starve the others.
  for (int i = 0; i < 16; ++i) {
    ssize_t n = ::read(c.fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      eof = true;
      break;
    }
    c.dec.Feed(buf, static_cast<size_t>(n));
  }
  ProcessFrames(c);
  // Requests that arrived before the close still take effect (their events
  // are dropped); execs go on running.
  if (eof && c.vport && !c.closing) {
    // The host went away; what it sent last is its own business.
    VportHangup();
    return;
  }
  if (eof && !c.closing) {
    while (!c.closing && c.dec.buffered() > 0) {
      std::string frame;
      if (c.dec.Next(&frame) != 1) break;
      OnFrame(c, frame);
    }
    CloseConn(c);
  }
}

void Agent::ProcessFrames(Conn& c) {
  std::string frame;
  while (!c.closing && c.pending() < kHighWater) {
    if (c.vport && c.dec.StartsWith(std::string_view(kSyncAsk, sizeof kSyncAsk))) {
      // A new host: this conversation ends here.
      std::string rest = c.dec.TakeRest();
      CloseConn(c);
      VportScan(std::move(rest));
      return;
    }
    int rc = c.dec.Next(&frame);
    if (rc == 0 && c.vport) {
      // A frame cut short by a host that went away unseen (no hang-up), and
      // a new host asking to sync, again and again (every 250 ms), in what
      // would be that frame's body: two asks in a row at the end is that.
      std::string_view pend = c.dec.Pending();
      std::string_view ask(kSyncAsk, sizeof kSyncAsk);
      if (pend.size() >= 2 * kSyncBytes && pend.substr(pend.size() - kSyncBytes, 8) == ask &&
          pend.substr(pend.size() - 2 * kSyncBytes, 8) == ask) {
        std::string last(pend.substr(pend.size() - kSyncBytes));
        (void)c.dec.TakeRest();  // what the old host sent before its sync: discarded
        CloseConn(c);
        VportScan(std::move(last));
      }
      return;
    }
    if (rc == 0) return;
    if (rc < 0 && c.vport) {
      // Not a frame and not a sync: a conversation cut short. Wait for the
      // host to sync again.
      std::string rest = c.dec.TakeRest();
      CloseConn(c);
      VportScan(std::move(rest));
      return;
    }
    if (rc < 0) {
      SendError(c, 0, EMSGSIZE,
                "frame length above the protocol's limit of " + std::to_string(kMaxFrameBytes) +
                    " bytes; closing the connection");
      // One best-effort write of that last word, then the stream is unusable.
      (void)!::write(c.fd.get(), c.out.data() + c.out_off, c.pending());
      CloseConn(c);
      return;
    }
    OnFrame(c, frame);
  }
  if (!c.closing && c.dec.buffered() > 0) dirty_.insert(c.key);  // the rest after we drain
}

void Agent::OnFrame(Conn& c, const std::string& frame) {
  Request req;
  if (!req.ParseFromString(frame)) {
    SendError(c, 0, EBADMSG,
              "malformed request: " + std::to_string(frame.size()) + " bytes that are not a dsec.agent.Request");
    return;
  }
  uint64_t id = req.id();
  if (id == 0) {
    SendError(c, 0, EINVAL, "request without an id (ids start at 1)");
    return;
  }
  switch (req.body_case()) {
    case Request::kExec: StartExec(c, id, *req.mutable_exec()); break;
    case Request::kSignal: OnSignalRequest(c, id, req.signal()); break;
    case Request::kReadFile: OnReadFile(c, id, req.read_file()); break;
    case Request::kWriteFile: OnWriteFile(c, id, req.write_file()); break;
    case Request::kStat: OnStat(c, id, req.stat()); break;
    case Request::kListDir: OnListDir(c, id, req.list_dir()); break;
    case Request::kPing: OnPing(c, id, req.ping().usage()); break;
    case Request::kChanges: OnChanges(c, id, req.changes()); break;
    case Request::kPathOp: OnPathOp(c, id, req.path_op()); break;
    case Request::kProc: OnProc(c, id, req.proc()); break;
    case Request::kWatch: OnWatch(c, id, req.watch()); break;
    default:
      SendError(c, id, EOPNOTSUPP,
                "request " + std::to_string(id) + " has no body or one this agent (" DSEC_VERSION
                ") does not know");
  }
}

void Agent::OnPing(Conn& c, uint64_t id, bool usage) {
  Event ev;
  ev.set_id(id);
  auto* p = ev.mutable_pong();
  p->set_pid(static_cast<uint32_t>(::getpid()));
  p->set_version(DSEC_VERSION);
  p->set_execs_running(execs_.size());
  p->set_uptime_ms(static_cast<uint64_t>((NowNs() - start_ns_) / 1000000));
  if (usage) SystemUsage(p);
  Send(c, ev);
}

void SystemUsage(Pong* p) {
  long cpus = ::sysconf(_SC_NPROCESSORS_ONLN), hz = ::sysconf(_SC_CLK_TCK);
  p->set_cpu_count(static_cast<uint32_t>(cpus > 0 ? cpus : 1));
  if (FILE* f = std::fopen("/proc/stat", "re")) {
    unsigned long long user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys, &idle, &iowait, &irq,
                    &softirq, &steal) >= 4 && hz > 0)
      p->set_cpu_ns((user + nice + sys + irq + softirq) * (1000000000ull / static_cast<unsigned long long>(hz)));
    std::fclose(f);
  }
  if (FILE* f = std::fopen("/proc/meminfo", "re")) {
    char key[64];
    unsigned long long kb = 0, cache = 0;
    while (std::fscanf(f, "%63s %llu kB\n", key, &kb) == 2) {
      if (!std::strcmp(key, "MemTotal:")) p->set_mem_total(kb << 10);
      else if (!std::strcmp(key, "MemAvailable:")) p->set_mem_available(kb << 10);
      else if (!std::strcmp(key, "Cached:") || !std::strcmp(key, "Buffers:")) cache += kb << 10;
    }
    p->set_mem_cache(cache);
    std::fclose(f);
  }
}

void Agent::Send(Conn& c, const Event& ev) {
  if (c.closing) return;
  AppendFrame(&c.out, ev.SerializeAsString());
  dirty_.insert(c.key);
}

void Agent::SendError(Conn& c, uint64_t id, int err, const std::string& message) {
  Event ev;
  ev.set_id(id);
  ev.mutable_error()->set_errno_value(err);
  ev.mutable_error()->set_message(message);
  Send(c, ev);
}

void Agent::Flush(Conn& c) {
  if (c.closing) return;
  while (c.pending() > 0) {
    ssize_t w = ::write(c.fd.get(), c.out.data() + c.out_off, c.pending());
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      CloseConn(c);  // the client is gone
      return;
    }
    c.out_off += static_cast<size_t>(w);
  }
  if (c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
  } else if (c.out_off > kHighWater && c.out_off * 2 > c.out.size()) {
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
  UpdateInterest(c);
  if (c.pending() < kLowWater) {
    ResumePaused(c);
    if (inotify_paused_) ResumeInotify();
    ProcessFrames(c);  // requests left waiting while we were backed up
  }
}

void Agent::UpdateInterest(Conn& c) {
  if (c.pending() >= kHighWater) c.in_paused = true;
  else if (c.pending() < kLowWater) c.in_paused = false;
  uint32_t want = (c.in_paused ? 0u : static_cast<uint32_t>(EPOLLIN)) |
                  (c.pending() ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  if (want == c.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = (c.key << 3) | kConn;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  c.interest = want;
}

void Agent::CloseConn(Conn& c) {
  if (c.closing) return;
  c.closing = true;
  if (c.vport) {
    (void)c.fd.Release();  // the port is vport_'s; the next host syncs on it
    if (fd_conn_ == c.key) fd_conn_ = 0;
    if (!vport_poll_ns_) VportWatch(kVport);
  } else {
    c.fd.Reset();  // also leaves the epoll set
  }
  std::string().swap(c.out);
  c.out_off = 0;
  // Its execs run on; what they print is read and dropped.
  for (auto& [id, key] : c.execs) {
    auto it = execs_.find(key);
    if (it == execs_.end()) continue;
    if (it->second->conn != c.key) {  // a waiter's or an attached client's entry: the run is another's
      Detach(*it->second, c.key);
      continue;
    }
    it->second->conn = 0;
    Resume(*it->second);
  }
  c.execs.clear();
  // Its watches end (nobody to tell).
  auto watches = std::move(c.watches);
  c.watches.clear();
  for (auto& [id, key] : watches) EndWatch(key, 0, {});
  c.paused.clear();
  closed_.push_back(c.key);
  if (c.key == fd_conn_ && !listen_ && !pid1_) stop_ = true;  // nothing left to serve
}

void Agent::CollectClosed() {
  for (uint64_t key : closed_) {
    conns_.erase(key);
    dirty_.erase(key);
  }
  closed_.clear();
}

void Agent::Shutdown() {
  // Not PID 1 (a test, or a host-side run): leave nothing behind. As PID 1
  // we only get here if epoll itself failed, and the sandbox dies with us.
  std::vector<pid_t> leaders;
  for (auto& [key, x] : execs_) {
    if (!x->reaped) {
      ::kill(-x->pid, SIGKILL);
      leaders.push_back(x->pid);
    }
  }
  // Orphans that left their exec's process group are our children too.
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/children");
      for (pid_t p; in >> p;) ::kill(p, SIGKILL);
    }
    ::closedir(d);
  }
  for (pid_t p : leaders) ::waitpid(p, nullptr, 0);
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  for (auto& [key, c] : conns_)
    if (c->vport) (void)c->fd.Release();
  conns_.clear();
  if (listen_) {
    struct stat st;
    if (::lstat(opts_.listen_path.c_str(), &st) == 0 && st.st_ino == listen_ino_)
      ::unlink(opts_.listen_path.c_str());
    listen_.Reset();
  }
}

}  // namespace internal

int RunAgent(const AgentOptions& options) {
  internal::Agent a(options);
  return a.Main();
}

}  // namespace dsec::agent
