#include "runtime/front_door.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

namespace dsec {

bool SplitHostPort(const std::string& s, std::string* host, uint16_t* port) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= s.size()) return false;
  unsigned long p = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    p = p * 10 + static_cast<unsigned long>(s[i] - '0');
    if (p > 65535) return false;
  }
  *host = s.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  *port = static_cast<uint16_t>(p);
  return true;
}

namespace {

using Clock = std::chrono::steady_clock;

// Tags of epoll events: listeners by index, the wake-up eventfd, and
// connections by a number never reused (an fd is, a stale event must not
// reach a new connection).
constexpr uint64_t kWakeTag = ~0ull;
constexpr uint64_t kListenerBit = 1ull << 63;

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return ss.ss_family == AF_INET6 ? "[" + std::string(host) + "]:" + serv : std::string(host) + ":" + serv;
}

Result<UniqueFd> Listen(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string where = host + ":" + std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return Status::InvalidArgument("cannot listen on " + where + ": " + ::gai_strerror(rc));
  Status last = Status::Unavailable("cannot listen on " + where + ": no address");
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last = Status::FromErrno(errno, "cannot listen on " + where + ": socket");
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) < 0) {
      last = Status::FromErrno(errno, "cannot listen on " + where);
      continue;
    }
    // The kernel caps the backlog at net.core.somaxconn (4096 on current
    // kernels): a storm of trainers connecting at once waits there, not in
    // SYN retries.
    if (::listen(fd.get(), 4096) < 0) {
      last = Status::FromErrno(errno, "cannot listen on " + where);
      continue;
    }
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

uint16_t BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

}  // namespace

struct FrontDoor::Impl {
  struct Conn;
  struct Listener {
    FrontDoorListener opts;
    UniqueFd fd;
    uint16_t port = 0;
    std::list<Conn*> pending;  // in accept order, which is deadline order
    FrontDoorStats stats;
  };
  struct Conn {
    uint64_t tag = 0;
    size_t listener = 0;
    UniqueFd fd;
    std::string peer;
    std::string input;
    std::unique_ptr<Handshake> hs;
    Clock::time_point deadline;
    std::list<Conn*>::iterator pos;
  };

  std::vector<Listener> listeners;
  LogFn log;
  UniqueFd epoll, wake, reserve;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_tag = 1;
  mutable std::mutex stats_mu;

  void Log(int level, const std::string& text) const {
    if (log) log(level, text);
  }

  void Close(Conn* c) {
    auto& l = listeners[c->listener];
    l.pending.erase(c->pos);
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      l.stats.pending = l.pending.size();
    }
    ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
    conns.erase(c->tag);  // closes the socket
  }

  void Count(Listener& l, uint64_t FrontDoorStats::*field) {
    std::lock_guard<std::mutex> lk(stats_mu);
    ++(l.stats.*field);
  }

  // A short reply in one write: the socket buffer always takes it; a peer
  // that lets it fill has gone.
  static bool WriteAll(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // The connection to push out for a new one: the oldest that has sent
  // nothing yet (a real client answers its challenge within a round trip;
  // one that sits silent is the cheap way to crowd the door), else the oldest.
  static Conn* Victim(Listener& l) {
    int looked = 0;
    for (Conn* c : l.pending) {
      if (c->input.empty()) return c;
      if (++looked >= 64) break;
    }
    return l.pending.front();
  }

  // Handles every pending connection that has bytes waiting, without
  // blocking. Listener events are left: they are level-triggered and come
  // back in the next round of Loop.
  void ServeReadable() {
    epoll_event evs[256];
    int n = ::epoll_wait(epoll.get(), evs, 256, 0);
    for (int i = 0; i < n; ++i) {
      uint64_t tag = evs[i].data.u64;
      if (tag == kWakeTag || (tag & kListenerBit)) continue;
      auto it = conns.find(tag);
      if (it != conns.end()) OnReadable(it->second.get());
    }
  }

  void AcceptAll(size_t li) {
    auto& l = listeners[li];
    if (!reserve) reserve.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    for (int round = 0; round < 512; ++round) {
      int fd = ::accept4(l.fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: take the connection with the reserve and
          // close it, or the listener stays readable and this spins.
          Log(3, std::string(l.opts.protocol->name()) + ": out of file descriptors; refusing a connection");
          reserve.Reset();
          UniqueFd drop(::accept4(l.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
          reserve.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
          continue;
        }
        return;  // EAGAIN: all taken
      }
      Count(l, &FrontDoorStats::accepted);
      // Full: first hear what the pending have sent (while this loop accepts,
      // a real client's answer waits unread and would look like silence;
      // garbage is refused and frees its place), then push one out if still full.
      if (l.pending.size() >= l.opts.max_pending) ServeReadable();
      if (l.pending.size() >= l.opts.max_pending) {
        Count(l, &FrontDoorStats::evicted);
        Close(Victim(l));
      }
      auto c = std::make_unique<Conn>();
      c->tag = next_tag++;
      c->listener = li;
      c->fd.Reset(fd);
      c->peer = PeerName(fd);
      c->deadline = Clock::now() + std::chrono::milliseconds(l.opts.timeout_ms);
      std::string greeting;
      c->hs = l.opts.protocol->Begin(c->peer, &greeting);
      if (!greeting.empty() && !WriteAll(fd, greeting)) {
        Count(l, &FrontDoorStats::rejected);
        continue;  // c and its socket go
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = c->tag;
      if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) < 0) {
        Log(3, std::string("front door: epoll_ctl: ") + std::strerror(errno));
        continue;
      }
      l.pending.push_back(c.get());
      c->pos = std::prev(l.pending.end());
      {
        std::lock_guard<std::mutex> lk(stats_mu);
        l.stats.pending = l.pending.size();
      }
      conns.emplace(c->tag, std::move(c));
    }
  }

  void OnReadable(Conn* c) {
    auto& l = listeners[c->listener];
    bool eof = false;
    for (;;) {
      size_t want = c->hs->Wants(c->input);
      if (want == 0 || c->input.size() >= l.opts.max_input) break;
      want = std::min(want, l.opts.max_input - c->input.size());
      char buf[4096];
      ssize_t n = ::recv(c->fd.get(), buf, std::min(want, sizeof buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {
        eof = true;
        break;
      }
      c->input.append(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < std::min(want, sizeof buf)) break;  // drained for now
    }
    for (;;) {
      Handshake::Step step = c->hs->OnInput(c->input, eof);
      if (step.consumed) c->input.erase(0, std::min(step.consumed, c->input.size()));
      if (!step.reply.empty() && !WriteAll(c->fd.get(), step.reply)) {
        Count(l, &FrontDoorStats::rejected);
        Close(c);
        return;
      }
      if (step.kind == Handshake::Step::kReject) {
        Count(l, &FrontDoorStats::rejected);
        Close(c);
        return;
      }
      if (step.kind == Handshake::Step::kAdmit) {
        Count(l, &FrontDoorStats::admitted);
        ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
        UniqueFd fd = std::move(c->fd);
        std::string leftover = std::move(c->input), peer = std::move(c->peer);
        Close(c);
        l.opts.protocol->Admit(std::move(fd), std::move(leftover), peer);
        return;
      }
      // More is needed: a step that used input may be followed by another
      // (pipelined lines); one that used none waits for bytes.
      if (step.consumed == 0 || c->input.empty()) break;
    }
    if (eof) {
      Count(l, &FrontDoorStats::rejected);
      Close(c);
    } else if (c->input.size() >= l.opts.max_input) {
      // The protocol let its buffer fill without deciding: nothing more fits.
      Count(l, &FrontDoorStats::rejected);
      Close(c);
    }
  }

  // Closes what is past its deadline; the time until the next one (ms), -1: none.
  int Expire() {
    auto now = Clock::now();
    int next = -1;
    for (auto& l : listeners) {
      while (!l.pending.empty() && l.pending.front()->deadline <= now) {
        Count(l, &FrontDoorStats::timed_out);
        Close(l.pending.front());
      }
      if (l.pending.empty()) continue;
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(l.pending.front()->deadline - now).count() + 1;
      if (next < 0 || ms < next) next = static_cast<int>(ms);
    }
    return next;
  }

  void Loop() {
    epoll_event evs[256];
    while (!stopping.load()) {
      int timeout = Expire();
      int n = ::epoll_wait(epoll.get(), evs, 256, timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        // Nothing would answer on dsecd's ports any more while they stay
        // bound: better to stop dsecd (its supervisor starts it again).
        Log(3, std::string("front door: epoll_wait: ") + std::strerror(errno) + "; stopping dsecd");
        std::abort();
      }
      for (int i = 0; i < n; ++i) {
        uint64_t tag = evs[i].data.u64;
        if (tag == kWakeTag) continue;
        if (tag & kListenerBit) {
          AcceptAll(static_cast<size_t>(tag & ~kListenerBit));
          continue;
        }
        auto it = conns.find(tag);
        if (it == conns.end()) continue;  // closed earlier in this round
        OnReadable(it->second.get());
      }
    }
  }
};

FrontDoor::FrontDoor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FrontDoor::~FrontDoor() { Stop(); }

namespace {

template <class Listeners>
auto* Named(Listeners& all, const std::string& name) {
  for (auto& l : all)
    if (l.opts.name == name) return &l;
  return static_cast<decltype(&all[0])>(nullptr);
}

}  // namespace

Result<std::unique_ptr<FrontDoor>> FrontDoor::Start(std::vector<FrontDoorListener> listeners, LogFn log) {
  auto impl = std::make_unique<Impl>();
  impl->log = std::move(log);
  impl->epoll.Reset(::epoll_create1(EPOLL_CLOEXEC));
  impl->wake.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  impl->reserve.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!impl->epoll || !impl->wake) return Status::FromErrno(errno, "front door: epoll/eventfd");
  epoll_event wev{};
  wev.events = EPOLLIN;
  wev.data.u64 = kWakeTag;
  ::epoll_ctl(impl->epoll.get(), EPOLL_CTL_ADD, impl->wake.get(), &wev);
  for (size_t i = 0; i < listeners.size(); ++i) {
    Impl::Listener l;
    l.opts = listeners[i];
    if (!l.opts.protocol) return Status::InvalidArgument("front door: listener without a protocol");
    if (l.opts.name.empty() || Named(impl->listeners, l.opts.name))
      return Status::InvalidArgument("front door: listener '" + l.opts.name + "' needs a name of its own");
    auto fd = Listen(l.opts.host, l.opts.port);
    if (!fd.ok()) return fd.status();
    l.fd = std::move(*fd);
    l.port = BoundPort(l.fd.get());
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerBit | i;
    if (::epoll_ctl(impl->epoll.get(), EPOLL_CTL_ADD, l.fd.get(), &ev) < 0)
      return Status::FromErrno(errno, "front door: epoll_ctl");
    impl->listeners.push_back(std::move(l));
  }
  auto* p = impl.get();
  impl->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<FrontDoor>(new FrontDoor(std::move(impl)));
}

uint16_t FrontDoor::port(const std::string& name) const {
  const auto* l = Named(impl_->listeners, name);
  return l ? l->port : 0;
}

std::string FrontDoor::address(const std::string& name) const {
  const auto* l = Named(impl_->listeners, name);
  return l ? l->opts.host + ":" + std::to_string(l->port) : "";
}

bool FrontDoor::has(const std::string& name) const { return Named(impl_->listeners, name) != nullptr; }

void FrontDoor::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->conns.clear();
  for (auto& l : impl_->listeners) {
    l.pending.clear();
    l.fd.Reset();
  }
}

FrontDoorStats FrontDoor::stats(const std::string& name) const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  const auto* l = Named(impl_->listeners, name);
  return l ? l->stats : FrontDoorStats{};
}

}  // namespace dsec
