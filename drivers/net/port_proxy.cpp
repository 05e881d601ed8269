#include "drivers/net/port_proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "drivers/net/policy.hpp"

namespace dsec::net {

namespace {

constexpr size_t kBuf = 64 * 1024;

// Bytes read from one side, waiting to be written to the other. The
// buffer exists only while it holds bytes: an idle connection costs none.
struct Pipe {
  std::vector<char> data;
  size_t begin = 0, end = 0;
  bool eof = false;       // the reading side closed its end
  bool shut = false;      // and the writing side was told (SHUT_WR)
  size_t used() const { return end - begin; }
  bool room() const { return data.empty() || end < data.size(); }
  void Drained() {
    begin = end = 0;
    std::vector<char>().swap(data);
  }
};

}  // namespace

struct PortProxy::Impl {
  struct Listener {
    int fd = -1;
    std::string id;
    uint32_t addr = 0;
    uint16_t port = 0;
    std::string address;
  };
  struct Conn {
    int fd[2] = {-1, -1};        // 0: the host's client, 1: the sandbox
    uint64_t token[2] = {0, 0};
    std::string id;
    bool connected = false;       // fd[1]'s connect finished
    Pipe pipe[2];                 // pipe[i]: read from fd[i], written to fd[1 - i]
    bool done[2] = {false, false};  // fd[i] read to its end and shut for writing: out of epoll
  };
  struct Ref {
    Listener* listener = nullptr;
    Conn* conn = nullptr;
    int side = 0;
  };

  uint32_t listen_addr = 0;
  int ep = -1, stop = -1;
  std::thread thread;
  mutable std::mutex mu;
  uint64_t next_token = 1;
  std::unordered_map<uint64_t, Ref> refs;
  std::map<uint64_t, std::unique_ptr<Listener>> listeners;   // by token
  std::map<uint64_t, std::unique_ptr<Conn>> conns;           // by the token of its side 0
  std::map<std::string, size_t> conns_of;                     // relayed connections per sandbox

  uint64_t Add(int fd, uint32_t events, Ref ref) {
    uint64_t t = next_token++;
    refs[t] = ref;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = t;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    return t;
  }

  void CloseConn(Conn* c) {
    for (int i : {0, 1}) {
      refs.erase(c->token[i]);
      if (c->fd[i] >= 0) ::close(c->fd[i]);
    }
    if (--conns_of[c->id] == 0) conns_of.erase(c->id);
    conns.erase(c->token[0]);
  }

  // What fd[side] waits for now.
  void Arm(Conn* c, int side) {
    const Pipe& in = c->pipe[side];        // read from this side
    const Pipe& out = c->pipe[1 - side];   // written to this side
    if (c->done[side]) return;
    if (in.eof && out.shut) {
      // Nothing more in either direction: out of epoll, which would report
      // its hang-up on every wait, whatever the mask.
      ::epoll_ctl(ep, EPOLL_CTL_DEL, c->fd[side], nullptr);
      c->done[side] = true;
      return;
    }
    uint32_t ev = 0;
    if (side == 1 && !c->connected) {
      ev = EPOLLOUT;
    } else {
      if (!in.eof && in.room()) ev |= EPOLLIN;
      if (out.used()) ev |= EPOLLOUT;
    }
    epoll_event e{};
    e.events = ev;
    e.data.u64 = c->token[side];
    ::epoll_ctl(ep, EPOLL_CTL_MOD, c->fd[side], &e);
  }

  void Accept(Listener* l) {
    for (;;) {
      int a = ::accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (a < 0) return;
      if (conns.size() >= kMaxProxyConns || conns_of[l->id] >= kMaxProxyConnsPerSandbox) {
        ::close(a);
        continue;
      }
      int b = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = htonl(l->addr);
      to.sin_port = htons(l->port);
      if (b < 0 || (::connect(b, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS)) {
        if (b >= 0) ::close(b);
        ::close(a);
        continue;
      }
      int one = 1;
      ::setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ::setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>();
      c->fd[0] = a;
      c->fd[1] = b;
      c->id = l->id;
      Conn* p = c.get();
      c->token[0] = Add(a, 0, Ref{nullptr, p, 0});  // armed once connected
      c->token[1] = Add(b, EPOLLOUT, Ref{nullptr, p, 1});
      ++conns_of[l->id];
      conns[c->token[0]] = std::move(c);
    }
  }

  // fd[side] is ready: read into its pipe, write the other pipe out.
  // False when the connection is done (closed by the caller).
  bool Ready(Conn* c, int side, uint32_t events) {
    if (side == 1 && !c->connected) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(c->fd[1], SOL_SOCKET, SO_ERROR, &err, &len);
      if (err) return false;  // the sandbox's port is shut: the client's connection closes
      c->connected = true;
      Arm(c, 0);
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      Pipe& in = c->pipe[side];
      if (in.data.empty()) in.data.resize(kBuf);
      while (!in.eof && in.end < in.data.size()) {
        ssize_t n = ::read(c->fd[side], in.data.data() + in.end, in.data.size() - in.end);
        if (n > 0) in.end += static_cast<size_t>(n);
        else if (n == 0) in.eof = true;
        else if (errno == EAGAIN) break;
        else return false;
      }
    }
    // Both directions: what can be written now is.
    for (int from : {0, 1}) {
      Pipe& p = c->pipe[from];
      int to = c->fd[1 - from];
      if (from == 0 && !c->connected) continue;
      while (p.used()) {
        ssize_t n = ::send(to, p.data.data() + p.begin, p.used(), MSG_NOSIGNAL);
        if (n > 0) p.begin += static_cast<size_t>(n);
        else if (n < 0 && errno == EAGAIN) break;
        else return false;
      }
      if (p.begin == p.end) p.Drained();
      if (p.eof && !p.used() && !p.shut) {
        ::shutdown(to, SHUT_WR);
        p.shut = true;
      }
    }
    if (c->pipe[0].shut && c->pipe[1].shut) return false;
    Arm(c, 0);
    if (c->connected) Arm(c, 1);
    return true;
  }

  void Run() {
    epoll_event evs[64];
    for (;;) {
      int n = ::epoll_wait(ep, evs, 64, -1);
      if (n < 0 && errno != EINTR) return;
      std::lock_guard<std::mutex> lk(mu);
      for (int i = 0; i < n; ++i) {
        uint64_t t = evs[i].data.u64;
        if (t == 0) return;  // stop
        auto it = refs.find(t);
        if (it == refs.end()) continue;  // closed meanwhile
        Ref r = it->second;
        if (r.listener) Accept(r.listener);
        else if (!Ready(r.conn, r.side, evs[i].events)) CloseConn(r.conn);
      }
    }
  }
};

PortProxy::PortProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<PortProxy>> PortProxy::Start(uint32_t listen_addr) {
  auto impl = std::make_unique<Impl>();
  impl->listen_addr = listen_addr;
  impl->ep = ::epoll_create1(EPOLL_CLOEXEC);
  impl->stop = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->ep < 0 || impl->stop < 0) return Status::FromErrno(errno, "exposed ports: epoll");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  ::epoll_ctl(impl->ep, EPOLL_CTL_ADD, impl->stop, &ev);
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->Run(); });
  return std::unique_ptr<PortProxy>(new PortProxy(std::move(impl)));
}

PortProxy::~PortProxy() {
  uint64_t one = 1;
  (void)!::write(impl_->stop, &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
  std::lock_guard<std::mutex> lk(impl_->mu);
  while (!impl_->conns.empty()) impl_->CloseConn(impl_->conns.begin()->second.get());
  for (auto& [t, l] : impl_->listeners) ::close(l->fd);
  ::close(impl_->ep);
  ::close(impl_->stop);
}

Result<std::vector<ExposedPort>> PortProxy::Open(const std::string& id, uint32_t addr,
                                                 const std::vector<uint16_t>& ports) {
  std::vector<std::unique_ptr<Impl::Listener>> made;
  std::vector<ExposedPort> out;
  for (uint16_t port : ports) {
    auto l = std::make_unique<Impl::Listener>();
    l->fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(impl_->listen_addr);
    socklen_t len = sizeof a;
    if (l->fd < 0 || ::bind(l->fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l->fd, 128) != 0 ||
        ::getsockname(l->fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      Status s = Status::FromErrno(errno, "sandbox " + id + ": a listener for its exposed port " + std::to_string(port) +
                                              " on " + Ipv4Text(impl_->listen_addr));
      if (l->fd >= 0) ::close(l->fd);
      for (auto& m : made) ::close(m->fd);
      return s;
    }
    l->id = id;
    l->addr = addr;
    l->port = port;
    l->address = Ipv4Text(impl_->listen_addr) + ":" + std::to_string(ntohs(a.sin_port));
    out.push_back({port, l->address});
    made.push_back(std::move(l));
  }
  std::lock_guard<std::mutex> lk(impl_->mu);
  for (auto& l : made) {
    uint64_t t = impl_->Add(l->fd, EPOLLIN, Impl::Ref{l.get(), nullptr, 0});
    impl_->listeners[t] = std::move(l);
  }
  return out;
}

void PortProxy::Close(const std::string& id) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  for (auto it = impl_->listeners.begin(); it != impl_->listeners.end();) {
    if (it->second->id != id) {
      ++it;
      continue;
    }
    impl_->refs.erase(it->first);
    ::close(it->second->fd);
    it = impl_->listeners.erase(it);
  }
  std::vector<Impl::Conn*> gone;
  for (auto& [t, c] : impl_->conns)
    if (c->id == id) gone.push_back(c.get());
  for (auto* c : gone) impl_->CloseConn(c);
}

std::vector<ExposedPort> PortProxy::Of(const std::string& id) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<ExposedPort> out;
  for (const auto& [t, l] : impl_->listeners)
    if (l->id == id) out.push_back({l->port, l->address});
  return out;
}

size_t PortProxy::connections() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->conns.size();
}

}  // namespace dsec::net
