#include "drivers/net/node_network.hpp"

#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <cstring>

#include "drivers/net/link.hpp"
#include "runtime/metrics.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::net {

namespace {
int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

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
  auto wire = NftSocket::Open();
  if (!wire.ok()) return wire.status();
  n->wire_ = std::move(*wire);
  if (n->opts_.forward) {
    UniqueFd fd(::open("/proc/sys/net/ipv4/ip_forward", O_WRONLY | O_CLOEXEC));
    if (!fd || ::write(fd.get(), "1\n", 2) != 2)
      return Status::FromErrno(errno, "sandbox networking: turn on net.ipv4.ip_forward");
    n->Log(1, "sandbox networking: net.ipv4.ip_forward is on (sandboxes' traffic is routed through this host)");
  }
  if (n->opts_.serve_dns) {
    ResolverOptions r;
    r.port = n->opts_.rules.resolver_port;
    r.upstream = n->opts_.upstream;
    if (r.upstream.empty()) {
      std::ifstream in("/etc/resolv.conf");
      std::stringstream text;
      text << in.rdbuf();
      r.upstream = NameserversOf(text.str());
      if (r.upstream.empty())
        n->Log(2, "sandbox networking: /etc/resolv.conf names no IPv4 nameserver; listed names will get SERVFAIL "
                  "(dsecd --sandbox-dns-upstream)");
    }
    NodeNetwork* self = n.get();
    r.who = [self](uint32_t addr, std::string* id, std::vector<Rule>* rules, uint64_t* gen) {
      return self->Who(addr, id, rules, gen);
    };
    r.pin = [self](const std::string& id, uint64_t gen, size_t index, const std::vector<uint32_t>& addrs,
                   uint32_t ttl) { self->PinFor(id, gen, index, addrs, ttl); };
    r.refused = [self](const std::string& id, const std::string& name) {
      self->Refused(id, Refusal{NowMs(), "name " + name});
    };
    r.log = n->opts_.log;
    auto resolver = Resolver::Start(std::move(r));
    if (!resolver.ok()) return resolver.status();
    n->resolver_ = std::move(*resolver);
  }
  if (n->opts_.read_refusals && n->opts_.rules.log_group) {
    auto log = Nflog::Open(n->opts_.rules.log_group);
    if (!log.ok()) {
      n->Log(2, "sandbox networking: refusals are counted but not logged: " + log.status().message());
    } else {
      n->nflog_ = std::move(*log);
      n->stop_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (n->stop_ < 0) return Status::FromErrno(errno, "sandbox networking: eventfd");
      n->log_thread_ = std::thread([p = n.get()] { p->ReadLog(); });
    }
  }
  return n;
}

NodeNetwork::~NodeNetwork() {
  if (log_thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(stop_, &one, sizeof one);
    log_thread_.join();
  }
  if (stop_ >= 0) ::close(stop_);
  resolver_.reset();
  proxy_.reset();
}

void NodeNetwork::ReadLog() {
  for (;;) {
    pollfd p[2] = {{nflog_->fd(), POLLIN, 0}, {stop_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents) return;
    nflog_->Read([&](const LoggedPacket& pkt) {
      std::string id;
      {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = by_if_.find(pkt.ifname);
        if (it == by_if_.end()) return;
        id = it->second;
      }
      std::string what = pkt.proto + " " + Ipv4Text(pkt.daddr) + (pkt.dport ? ":" + std::to_string(pkt.dport) : "");
      Log(1, "sandbox " + id + ": refused " + what);
      Refused(id, Refusal{NowMs(), what});
    });
  }
}

bool NodeNetwork::Who(uint32_t addr, std::string* id, std::vector<Rule>* rules, uint64_t* gen) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return false;
  auto e = by_id_.find(it->second);
  if (e == by_id_.end() || !e->second.attached) return false;
  *id = it->second;
  *rules = e->second.policy.rules;
  *gen = e->second.gen;
  return true;
}

void NodeNetwork::PinFor(const std::string& id, uint64_t gen, size_t index, const std::vector<uint32_t>& addrs,
                         uint32_t ttl) {
  std::lock_guard<std::mutex> pin(pin_mu_);
  SandboxLink link;
  std::string entry;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    // Gone, or its policy changed since the question: the answer pins nothing.
    if (it == by_id_.end() || !it->second.attached || it->second.gen != gen) return;
    if (index >= it->second.policy.rules.size()) return;
    link = SandboxLink{it->second.net.ifname, it->second.net.addr};
    entry = it->second.policy.rules[index].text;
  }
  NftBatch b;
  WirePin(b, opts_.rules, link, index, addrs, ttl);
  (void)Commit(b, "sandbox " + id + ": pinning the addresses of " + entry,
               [&] { return Pin(opts_.rules, link, index, addrs, ttl); });
}

void NodeNetwork::Refused(const std::string& id, Refusal r) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Refusals& f = it->second.refused;
  bool name = r.what.rfind("name ", 0) == 0;
  metrics::NetworkRefusals().At(name ? "what=\"name\"" : "what=\"packet\"").Add();
  if (name) ++f.names;
  if (f.recent.size() >= kRecentRefusals) f.recent.pop_front();
  f.recent.push_back(std::move(r));
}

Result<v1::NetworkReport> NodeNetwork::Report(const std::string& id) const {
  v1::NetworkReport out;
  std::string ifname;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end() || !it->second.attached)
      return Status::NotFound("sandbox " + id + " has no network link on this node");
    ifname = it->second.net.ifname;
    out.set_address(Ipv4Text(it->second.net.addr));
    out.set_refused_names(it->second.refused.names);
    for (const auto& r : it->second.refused.recent) {
      auto* x = out.add_recent();
      x->set_at_ms(r.at_ms);
      x->set_what(r.what);
    }
  }
  {
    std::lock_guard<std::mutex> lk(proxy_mu_);
    if (proxy_)
      for (const auto& e : proxy_->Of(id)) {
        auto* x = out.add_exposed();
        x->set_port(e.port);
        x->set_address(e.address);
      }
  }
  auto packets = wire_->CounterPackets(opts_.rules.table, "r_" + ifname);
  if (!packets.ok()) return packets.status().Annotate("sandbox " + id + ": its refusals' counter");
  out.set_refused_packets(*packets);
  return out;
}

Resolver::Stats NodeNetwork::dns_stats() const { return resolver_ ? resolver_->stats() : Resolver::Stats{}; }

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
  // A slot whose link exists is taken: after a restart, by a sandbox not
  // re-adopted yet (or left by a crash, until its kind's sweep removes it).
  uint32_t slot = next_;
  for (uint32_t tried = 0; used_.count(slot) || if_nametoindex(ForSlot(slot).ifname.c_str()); ++tried) {
    if (tried >= slots_)
      return Status::ResourceExhausted("the sandbox network pool " + NetText(opts_.pool, opts_.pool_prefix) +
                                       " has no slot without a link left");
    slot = (slot + 1) % slots_;
  }
  next_ = (slot + 1) % slots_;
  used_.insert(slot);
  Entry e;
  e.net = ForSlot(slot);
  by_id_[id] = e;
  by_addr_[e.net.addr] = id;
  by_if_[e.net.ifname] = id;
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
  return AttachWith(id, policy, [netns_fd](const SandboxNet& net) {
    VethSpec spec;
    spec.host_if = net.ifname;
    spec.gateway = net.gateway;
    spec.addr = net.addr;
    spec.netns_fd = netns_fd;
    return MakeVeth(spec);
  });
}

Status NodeNetwork::AttachTap(const std::string& id, const Policy& policy) {
  return AttachWith(id, policy, [](const SandboxNet& net) {
    VethSpec spec;
    spec.host_if = net.ifname;
    spec.gateway = net.gateway;
    return MakeTap(spec);
  });
}

Status NodeNetwork::AttachWith(const std::string& id, const Policy& policy,
                               const std::function<Status(const SandboxNet&)>& make) {
  SandboxNet net;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return Status::FailedPrecondition("sandbox " + id + " has no network slot (Reserve first)");
    if (it->second.attached) return Status::AlreadyExists("sandbox " + id + " is attached already");
    net = it->second.net;
  }
  DSEC_RETURN_IF_ERROR(make(net).Annotate("sandbox " + id));
  SandboxLink link{net.ifname, net.addr};
  if (Status st = AddRules(id, link, policy); !st.ok()) {
    (void)RemoveLink(net.ifname);  // the rules' failure is the answer
    return st;
  }
  if (Status st = Expose(id, net, policy); !st.ok()) {
    (void)RemoveRules(id, link, policy);
    (void)RemoveLink(net.ifname);
    return st;
  }
  return Attached(id, policy);
}

Status NodeNetwork::Commit(const NftBatch& b, const std::string& what,
                           const std::function<std::string()>& text) const {
  Status st = wire_->Commit(b);
  if (st.ok()) return st;
  Log(2, what + ": " + st.message() + "; the batch, in nft's syntax:\n" + text());
  return st.Annotate(what);
}

Status NodeNetwork::AddRules(const std::string& id, const SandboxLink& link, const Policy& policy) const {
  NftBatch b;
  WireSandboxAdd(b, opts_.rules, link, policy);
  return Commit(b, "sandbox " + id + ": its rules", [&] { return SandboxAdd(opts_.rules, link, policy); });
}

Status NodeNetwork::RemoveRules(const std::string& id, const SandboxLink& link, const Policy& policy) const {
  NftBatch b;
  WireSandboxRemove(b, opts_.rules, link, policy);
  return Commit(b, "sandbox " + id + ": removing its rules", [&] { return SandboxRemove(opts_.rules, link, policy); });
}

Status NodeNetwork::Expose(const std::string& id, const SandboxNet& net, const Policy& policy) {
  if (policy.expose.empty()) return Status::Ok();
  PortProxy* proxy;
  {
    std::lock_guard<std::mutex> lk(proxy_mu_);
    if (!proxy_) {
      auto p = PortProxy::Start(opts_.expose_addr);
      if (!p.ok()) return p.status();
      proxy_ = std::move(*p);
    }
    proxy = proxy_.get();
  }
  auto opened = proxy->Open(id, net.addr, policy.expose);
  if (!opened.ok()) return opened.status();
  for (const auto& e : *opened)
    Log(1, "sandbox " + id + ": its port " + std::to_string(e.port) + " is served at " + e.address);
  return Status::Ok();
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
    by_addr_[e.net.addr] = id;
    by_if_[e.net.ifname] = id;
  }
  SandboxLink link{net.ifname, net.addr};
  Status st = AddRules(id, link, policy);
  if (st.ok() && !(st = Expose(id, ForSlot(net.slot), policy)).ok()) (void)RemoveRules(id, link, policy);
  if (!st.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    by_id_.erase(id);
    by_addr_.erase(net.addr);
    by_if_.erase(net.ifname);
    used_.erase(net.slot);
    return st;
  }
  return Attached(id, policy);
}

Status NodeNetwork::Replace(const std::string& id, const Policy& policy) {
  std::lock_guard<std::mutex> pin(pin_mu_);
  SandboxNet net;
  Policy old;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end() || !it->second.attached)
      return Status::FailedPrecondition("sandbox " + id +
                                        " has no network link on this node (a link is made at creation only: "
                                        "create the sandbox with network mode allow or open)");
    net = it->second.net;
    old = it->second.policy;
  }
  // The new rules and the cached answers of the names it lists, in one
  // batch: a name it could reach before the change and still lists stays
  // reachable without a new query.
  SandboxLink link{net.ifname, net.addr};
  NftBatch b;
  WireSandboxReplace(b, opts_.rules, link, old, policy);
  std::vector<std::pair<size_t, std::pair<std::vector<uint32_t>, uint32_t>>> pins;
  if (resolver_)
    for (size_t i = 0; i < policy.rules.size(); ++i)
      if (policy.rules[i].is_name())
        for (auto& cached : resolver_->Cached(policy.rules[i])) {
          WirePin(b, opts_.rules, link, i, cached.first, cached.second);
          pins.push_back({i, std::move(cached)});
        }
  DSEC_RETURN_IF_ERROR(Commit(b, "sandbox " + id + ": its new policy", [&] {
    std::string text = SandboxReplace(opts_.rules, link, old, policy);
    for (const auto& [i, pin] : pins) text += Pin(opts_.rules, link, i, pin.first, pin.second);
    return text;
  }));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return Status::NotFound("sandbox " + id + " was released during its policy change");
  it->second.policy = policy;
  ++it->second.gen;
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
  {
    std::lock_guard<std::mutex> lk(proxy_mu_);
    if (proxy_) proxy_->Close(id);
  }
  if (e.attached) DSEC_RETURN_IF_ERROR(RemoveRules(id, SandboxLink{e.net.ifname, e.net.addr}, e.policy));
  // Its link goes even when it was never attached: a creation cut short
  // may have made it.
  DSEC_RETURN_IF_ERROR(RemoveLink(e.net.ifname).Annotate("sandbox " + id));
  std::lock_guard<std::mutex> lk(mu_);
  by_id_.erase(id);
  by_addr_.erase(e.net.addr);
  by_if_.erase(e.net.ifname);
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
