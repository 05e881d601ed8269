#include "drivers/net/node_network.hpp"

#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "drivers/net/link.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::net {

Result<std::unique_ptr<NodeNetwork>> NodeNetwork::Start(NodeNetworkOptions options) {
  if (options.pool_prefix < 8 || options.pool_prefix > 29)
    return Status::InvalidArgument("the sandbox network pool " + NetText(options.pool, options.pool_prefix) +
                                   " needs a prefix of 8-29 (each sandbox takes a /30)");
  uint32_t mask = ~uint32_t{0} << (32 - options.pool_prefix);
  if ((options.pool & ~mask) != 0)
    return Status::InvalidArgument("the sandbox network pool " + NetText(options.pool, options.pool_prefix) +
                                   " has bits set past its prefix");
  std::unique_ptr<NodeNetwork> n(new NodeNetwork());
  n->opts_ = std::move(options);
  n->slots_ = uint32_t{1} << (30 - n->opts_.pool_prefix);
  auto nft = Nft::Open();
  if (!nft.ok()) return nft.status();
  n->nft_ = std::move(*nft);
  if (auto r = n->nft_->Run(NodeTable(n->opts_.rules)); !r.ok())
    return Status::FailedPrecondition("sandbox networking: the node's table: " + r.status().message());
  if (n->opts_.forward) {
    UniqueFd fd(::open("/proc/sys/net/ipv4/ip_forward", O_WRONLY | O_CLOEXEC));
    if (!fd || ::write(fd.get(), "1\n", 2) != 2)
      return Status::FromErrno(errno, "sandbox networking: turn on net.ipv4.ip_forward");
    n->Log(1, "sandbox networking: net.ipv4.ip_forward is on (sandboxes' traffic is routed through this host)");
  }
  if (n->opts_.serve_dns) {
    uint16_t port = n->opts_.rules.resolver_port;
    for (int type : {SOCK_DGRAM, SOCK_STREAM}) {
      int fd = ::socket(AF_INET, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      (type == SOCK_DGRAM ? n->dns_udp_ : n->dns_tcp_) = fd;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
          (type == SOCK_STREAM && ::listen(fd, 16) != 0))
        return Status::FromErrno(errno, "sandbox networking: the resolver's port " + std::to_string(port) +
                                            (type == SOCK_DGRAM ? "/udp" : "/tcp") +
                                            " (in use? dsecd --sandbox-dns-port another)");
    }
    n->dns_stop_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (n->dns_stop_ < 0) return Status::FromErrno(errno, "sandbox networking: eventfd");
    n->dns_thread_ = std::thread([p = n.get()] { p->ServeDns(); });
  }
  return n;
}

NodeNetwork::~NodeNetwork() {
  if (dns_thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(dns_stop_, &one, sizeof one);
    dns_thread_.join();
  }
  for (int fd : {dns_udp_, dns_tcp_, dns_stop_})
    if (fd >= 0) ::close(fd);
}

void NodeNetwork::ServeDns() {
  std::vector<uint8_t> buf(512);
  for (;;) {
    pollfd p[3] = {{dns_udp_, POLLIN, 0}, {dns_tcp_, POLLIN, 0}, {dns_stop_, POLLIN, 0}};
    if (::poll(p, 3, -1) < 0 && errno != EINTR) return;
    if (p[2].revents) return;
    if (p[1].revents) {
      // DNS over TCP: closed at once (a client falls back or fails fast).
      int c = ::accept4(dns_tcp_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) ::close(c);
    }
    if (!p[0].revents) continue;
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ssize_t n = ::recvfrom(dns_udp_, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
    // A query: a 12-byte header, one question (its name's labels, type and
    // class); anything else is dropped, costing nothing.
    if (n < 12 || (buf[2] & 0x80) || buf[4] != 0 || buf[5] != 1) continue;
    size_t at = 12;
    while (at < static_cast<size_t>(n) && buf[at] != 0 && buf[at] < 64) at += buf[at] + 1;
    if (at >= static_cast<size_t>(n) || buf[at] != 0 || at + 5 > static_cast<size_t>(n)) continue;
    size_t end = at + 5;  // the root label, type and class
    // The same id and question; QR, RD as asked, RA; NXDOMAIN; no records.
    buf[2] = static_cast<uint8_t>(0x80 | (buf[2] & 0x79));
    buf[3] = 0x80 | 3;
    std::memset(&buf[6], 0, 6);
    (void)::sendto(dns_udp_, buf.data(), end, 0, reinterpret_cast<sockaddr*>(&from), len);
  }
}

void NodeNetwork::Log(int level, const std::string& text) const {
  if (opts_.log) opts_.log(level, text);
}

SandboxNet NodeNetwork::ForSlot(uint32_t slot) const {
  SandboxNet s;
  s.slot = slot;
  s.ifname = opts_.rules.ifprefix + std::to_string(slot);
  s.gateway = opts_.pool + slot * 4 + 1;
  s.addr = s.gateway + 1;
  return s;
}

Result<SandboxNet> NodeNetwork::Reserve(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  if (by_id_.count(id)) return Status::AlreadyExists("sandbox " + id + " already has a network slot");
  if (used_.size() >= slots_)
    return Status::ResourceExhausted("the sandbox network pool " + NetText(opts_.pool, opts_.pool_prefix) + " is full (" +
                                     std::to_string(slots_) + " sandboxes with a network); dsecd --sandbox-net a larger one");
  uint32_t slot = next_;
  while (used_.count(slot)) slot = (slot + 1) % slots_;
  next_ = (slot + 1) % slots_;
  used_.insert(slot);
  Entry e;
  e.net = ForSlot(slot);
  by_id_[id] = e;
  return e.net;
}

Status NodeNetwork::Attached(const std::string& id, const Policy& policy) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& e = by_id_[id];
  e.policy = policy;
  e.attached = true;
  return Status::Ok();
}

Status NodeNetwork::Attach(const std::string& id, int netns_fd, const Policy& policy) {
  SandboxNet net;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return Status::FailedPrecondition("sandbox " + id + " has no network slot (Reserve first)");
    if (it->second.attached) return Status::AlreadyExists("sandbox " + id + " is attached already");
    net = it->second.net;
  }
  VethSpec spec;
  spec.host_if = net.ifname;
  spec.gateway = net.gateway;
  spec.addr = net.addr;
  spec.netns_fd = netns_fd;
  DSEC_RETURN_IF_ERROR(MakeVeth(spec).Annotate("sandbox " + id));
  SandboxLink link{net.ifname, net.addr};
  if (auto r = nft_->Run(SandboxAdd(opts_.rules, link, policy)); !r.ok()) {
    (void)RemoveLink(net.ifname);  // the rules' failure is the answer
    return r.status().Annotate("sandbox " + id + ": its rules");
  }
  return Attached(id, policy);
}

Status NodeNetwork::Readopt(const std::string& id, const SandboxNet& net, const Policy& policy) {
  if (net.slot >= slots_ || net.ifname != ForSlot(net.slot).ifname)
    return Status::FailedPrecondition("sandbox " + id + ": network slot " + std::to_string(net.slot) + " (" +
                                      net.ifname + ") is not one of this node's pool");
  if (!if_nametoindex(net.ifname.c_str()))
    return Status::NotFound("sandbox " + id + ": its link " + net.ifname + " is gone");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (by_id_.count(id) || used_.count(net.slot))
      return Status::AlreadyExists("sandbox " + id + ": network slot " + std::to_string(net.slot) + " is taken");
    used_.insert(net.slot);
    Entry e;
    e.net = ForSlot(net.slot);
    by_id_[id] = e;
  }
  if (auto r = nft_->Run(SandboxAdd(opts_.rules, SandboxLink{net.ifname, net.addr}, policy)); !r.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    by_id_.erase(id);
    used_.erase(net.slot);
    return r.status().Annotate("sandbox " + id + ": its rules");
  }
  return Attached(id, policy);
}

Status NodeNetwork::Replace(const std::string& id, const Policy& policy) {
  SandboxNet net;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end() || !it->second.attached)
      return Status::FailedPrecondition("sandbox " + id + " has no network link on this node");
    net = it->second.net;
  }
  if (auto r = nft_->Run(SandboxReplace(opts_.rules, SandboxLink{net.ifname, net.addr}, policy)); !r.ok())
    return r.status().Annotate("sandbox " + id);
  std::lock_guard<std::mutex> lk(mu_);
  by_id_[id].policy = policy;
  return Status::Ok();
}

Status NodeNetwork::Release(const std::string& id) {
  Entry e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return Status::Ok();
    e = it->second;
  }
  if (e.attached)
    if (auto r = nft_->Run(SandboxRemove(opts_.rules, SandboxLink{e.net.ifname, e.net.addr}, e.policy)); !r.ok())
      return r.status().Annotate("sandbox " + id + ": removing its rules");
  // Its link goes even when it was never attached: a creation cut short
  // may have made it.
  DSEC_RETURN_IF_ERROR(RemoveLink(e.net.ifname).Annotate("sandbox " + id));
  std::lock_guard<std::mutex> lk(mu_);
  by_id_.erase(id);
  used_.erase(e.net.slot);
  return Status::Ok();
}

size_t NodeNetwork::attached() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& [id, e] : by_id_) n += e.attached;
  return n;
}

}  // namespace dsec::net
