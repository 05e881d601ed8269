// NodeNetwork: the node's side of sandbox networking, shared by the kinds:
// the ruleset's table (ruleset.hpp), the links' addresses and names, and
// each sandbox's link (link.hpp) and policy. A sandbox gets a slot, a /30 of
// the node's pool: the host end of its link (<ifprefix><slot>) is the
// gateway (.1), the sandbox is .2. Links outlive dsecd with their
// sandboxes; the table is made anew at start and each re-adopted sandbox
// adds its rules again. Thread-safe.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "drivers/net/nflog.hpp"
#include "drivers/net/nft.hpp"
#include "drivers/net/nft_wire.hpp"
#include "drivers/net/port_proxy.hpp"
#include "drivers/net/resolver.hpp"
#include "drivers/net/ruleset.hpp"

namespace dsec::net {

struct NodeNetworkOptions {
  NodeNet rules;                 // table, interface prefix, resolver port, log group
  uint32_t pool = 0x64600000;    // 100.96.0.0
  uint8_t pool_prefix = 12;      // /12: 262 144 slots of /30
  bool forward = true;           // net.ipv4.ip_forward=1 at Start (routing needs it)
  // Serve rules.resolver_port (udp and tcp, every address) with the
  // resolver of listed names (resolver.hpp), asking `upstream` (empty: the
  // node's /etc/resolv.conf), so no other program of the host can answer
  // sandboxes' DNS.
  bool serve_dns = true;
  std::vector<sockaddr_in> upstream;
  // Read refusals from rules.log_group (when not 0): the recent ones per
  // sandbox (at most kRecentRefusals each) and the log.
  bool read_refusals = true;
  // Where exposed ports are served on the host (port_proxy.hpp).
  uint32_t expose_addr = 0x7f000001;  // 127.0.0.1
  std::function<void(int level, const std::string& text)> log;
};

// What a sandbox's record keeps of its network.
struct SandboxNet {
  uint32_t slot = 0;
  std::string ifname;  // the host end
  uint32_t gateway = 0, addr = 0;
};

// What a sandbox was refused: totals since dsecd started, and the latest
// few, each "tcp 198.51.100.3:80" or "name pypi.org" at a unix time.
inline constexpr size_t kRecentRefusals = 32;
struct Refusal {
  int64_t at_ms = 0;
  std::string what;
};
struct Refusals {
  uint64_t names = 0;    // names its resolver answered NXDOMAIN as unlisted
  std::deque<Refusal> recent;  // oldest first; packets sampled (rules.log_rate a second)
};

class NodeNetwork {
 public:
  // The table from scratch and forwarding on, in the calling thread's
  // network namespace; FailedPrecondition saying why when this host cannot
  // (not root, no nf_tables).
  static Result<std::unique_ptr<NodeNetwork>> Start(NodeNetworkOptions options);
  // Leaves the table and the links: sandboxes outlive dsecd.
  ~NodeNetwork();

  // A slot for sandbox `id`, its addresses known before its link exists
  // (its resolv.conf names the gateway); ResourceExhausted when the pool
  // is used up. The same id twice: AlreadyExists.
  Result<SandboxNet> Reserve(const std::string& id);
  // Its link into the namespace `netns_fd`, its policy's rules and its
  // exposed ports' listeners; on failure none is left (the slot stays
  // reserved until Release).
  Status Attach(const std::string& id, int netns_fd, const Policy& policy);
  // The same for a VM: its link is a tap (link.hpp, MakeTap) its QEMU
  // opens by the reserved interface name.
  Status AttachTap(const std::string& id, const Policy& policy);
  // After a restart: the link named in `net` is there (NotFound otherwise);
  // its slot is taken again and its rules added.
  Status Readopt(const std::string& id, const SandboxNet& net, const Policy& policy);
  // A new policy for an attached sandbox, in one batch (its exposed ports
  // stay); the resolver's cached answers for names it lists are pinned
  // again.
  Status Replace(const std::string& id, const Policy& policy);
  // Its address and refusals, as its record shows them (NotFound when it
  // has no link here).
  Result<v1::NetworkReport> Report(const std::string& id) const;
  // The resolver's counters (zero without one).
  Resolver::Stats dns_stats() const;
  // Its rules, its link and its slot, gone; Ok when there were none.
  Status Release(const std::string& id);

  // The link and addresses of slot `slot`.
  SandboxNet ForSlot(uint32_t slot) const;
  size_t attached() const;
  // The pool's size in slots.
  uint32_t slots() const { return slots_; }

 private:
  NodeNetwork() = default;
  struct Entry {
    SandboxNet net;
    Policy policy;
    bool attached = false;
    uint64_t gen = 0;  // its policy's generation (Replace makes a new one)
    Refusals refused;  // refused packets the kernel counts (CounterList)
  };
  // Attach's work, with the link `make` makes for the reserved slot.
  Status AttachWith(const std::string& id, const Policy& policy, const std::function<Status(const SandboxNet&)>& make);
  // Marks `id` attached with `policy` (its rules are in force).
  Status Attached(const std::string& id, const Policy& policy);
  void Log(int level, const std::string& text) const;

  // The resolver's questions (ResolverOptions' who, pin, refused).
  bool Who(uint32_t addr, std::string* id, std::vector<Rule>* rules, uint64_t* gen);
  void PinFor(const std::string& id, uint64_t gen, size_t index, const std::vector<uint32_t>& addrs, uint32_t ttl_s);
  void Refused(const std::string& id, Refusal r);
  // Reads the refusals' log until stop_.
  void ReadLog();
  NodeNetworkOptions opts_;
  std::unique_ptr<Nft> nft_;        // the node's table, once (nft's syntax)
  std::unique_ptr<NftSocket> wire_;  // every sandbox's rules (nft_wire.hpp)
  // Commits `b`; a failure is annotated with `what` and logged with the
  // same batch in nft's syntax (`text`, made only then).
  Status Commit(const NftBatch& b, const std::string& what, const std::function<std::string()>& text) const;
  Status AddRules(const std::string& id, const SandboxLink& link, const Policy& policy) const;
  Status RemoveRules(const std::string& id, const SandboxLink& link, const Policy& policy) const;
  std::unique_ptr<Resolver> resolver_;
  std::unique_ptr<Nflog> nflog_;
  // Listeners of exposed ports: made with the first sandbox that has one.
  Status Expose(const std::string& id, const SandboxNet& net, const Policy& policy);
  mutable std::mutex proxy_mu_;
  std::unique_ptr<PortProxy> proxy_;
  int stop_ = -1;  // an eventfd: the log reader ends
  std::thread log_thread_;
  uint32_t slots_ = 0;
  // A pin and a policy change never interleave: a pin of an answer given
  // under the old policy never lands after the change (PinFor, Replace).
  std::mutex pin_mu_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> by_id_;
  std::unordered_map<uint32_t, std::string> by_addr_;  // sandbox address -> id
  std::unordered_map<std::string, std::string> by_if_;  // host interface -> id
  std::set<uint32_t> used_;
  uint32_t next_ = 0;  // where the search for a free slot starts
};

}  // namespace dsec::net
