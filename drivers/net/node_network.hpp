// NodeNetwork: the node's side of sandbox networking, shared by the kinds:
// the ruleset's table (ruleset.hpp), the links' addresses and names, and
// each sandbox's link (link.hpp) and policy. A sandbox gets a slot, a /30 of
// the node's pool: the host end of its link (<ifprefix><slot>) is the
// gateway (.1), the sandbox is .2. Links outlive dsecd with their
// sandboxes; the table is made anew at start and each re-adopted sandbox
// adds its rules again. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

#include "drivers/net/nft.hpp"
#include "drivers/net/ruleset.hpp"

namespace dsec::net {

struct NodeNetworkOptions {
  NodeNet rules;                 // table, interface prefix, resolver port, log group
  uint32_t pool = 0x64600000;    // 100.96.0.0
  uint8_t pool_prefix = 12;      // /12: 262 144 slots of /30
  bool forward = true;           // net.ipv4.ip_forward=1 at Start (routing needs it)
  // Own rules.resolver_port (udp and tcp, every address) and answer every
  // query there NXDOMAIN, so that no other program of the host can take
  // sandboxes' DNS (the resolver of listed names replaces it).
  bool serve_dns = true;
  std::function<void(int level, const std::string& text)> log;
};

// What a sandbox's record keeps of its network.
struct SandboxNet {
  uint32_t slot = 0;
  std::string ifname;  // the host end
  uint32_t gateway = 0, addr = 0;
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
  // Its link into the namespace `netns_fd` and its policy's rules; on
  // failure neither is left (the slot stays reserved until Release).
  Status Attach(const std::string& id, int netns_fd, const Policy& policy);
  // After a restart: the link named in `net` is there (NotFound otherwise);
  // its slot is taken again and its rules added.
  Status Readopt(const std::string& id, const SandboxNet& net, const Policy& policy);
  // A new policy for an attached sandbox, in one batch.
  Status Replace(const std::string& id, const Policy& policy);
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
  };
  // Marks `id` attached with `policy` (its rules are in force).
  Status Attached(const std::string& id, const Policy& policy);
  void Log(int level, const std::string& text) const;

  // Answers sandboxes' DNS (serve_dns): NXDOMAIN for every name, for now.
  void ServeDns();
  NodeNetworkOptions opts_;
  std::unique_ptr<Nft> nft_;
  int dns_udp_ = -1, dns_tcp_ = -1, dns_stop_ = -1;  // sockets and an eventfd
  std::thread dns_thread_;
  uint32_t slots_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> by_id_;
  std::set<uint32_t> used_;
  uint32_t next_ = 0;  // where the search for a free slot starts
};

}  // namespace dsec::net
