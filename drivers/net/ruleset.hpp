// The nftables rules that enforce sandboxes' network policies (policy.hpp)
// on the host side of their links, in nft's syntax: the node's table is
// made from it (Nft::Run, once at start); each sandbox's batches are sent
// as netlink messages (nft_wire.hpp, the same rules: net_ruleset_test
// checks the kernel lists the same for both), and said in this syntax in
// a failure's log. The kernel side is proven by
// tests/integration/net/ruleset_test.cpp in network namespaces of its own.
//
// One table per node (`inet <table>`), its base chains keyed on the
// sandboxes' host-side interfaces (<ifprefix><n>: a container's veth, a
// VM's tap):
//   forward     a sandbox's packets go to its own chain (the `egress` map);
//               one sandbox never reaches another; nothing comes into a
//               sandbox but replies (and exposed ports, from the host).
//   input       from a sandbox the node takes replies and the resolver's
//               port only: dsecd's and every other host port stay shut.
//   prerouting  every DNS query (udp or tcp port 53, to any address) goes
//               to the node's resolver, which answers listed names only.
//   postrouting what a sandbox sends out is masqueraded.
// A sandbox's chain (s_<ifname>) accepts replies, then what its entries
// list, a rule each: an address entry's range, a name entry's set of the
// addresses the resolver answered (n<i>_<ifname>, with timeouts), each on
// the entry's protocol and ports (entries may overlap: rules, unlike one
// interval set, take that); mode open accepts any public address instead;
// the rest is logged (log group, rate-limited), counted (its counter
// r_<ifname>) and refused at once (a TCP reset, else ICMP admin-prohibited: a connect
// fails with ECONNREFUSED, never after a timeout).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "drivers/net/policy.hpp"

namespace dsec::net {

struct NodeNet {
  std::string table = "dsec";    // inet <table>
  std::string ifprefix = "dsv";  // sandboxes' host-side interfaces
  uint16_t resolver_port = 10053;  // where sandboxes' DNS is redirected (dsecd owns it)
  uint16_t log_group = 0;        // NFLOG group of refusals (0: counted only)
  uint32_t log_rate = 10;        // refusals logged per second per sandbox at most (a burst of 5)
};

struct SandboxLink {
  std::string ifname;  // its host-side interface, <ifprefix><n>
  uint32_t addr = 0;   // the sandbox's address
};

// The node's table from scratch: what a previous dsecd left of it goes.
std::string NodeTable(const NodeNet& node);
// Removes the node's table (dsecd stops and no sandbox is left).
std::string NodeTableRemove(const NodeNet& node);
// A new sandbox's chain, set and map entry, with `policy` in force.
std::string SandboxAdd(const NodeNet& node, const SandboxLink& link, const Policy& policy);
// Replaces a sandbox's policy `old` with `policy`: one batch, so no
// connection sees a mix or a moment of everything open. Its exposed ports
// stay those it was made with; the resolver's pins go with the old list.
std::string SandboxReplace(const NodeNet& node, const SandboxLink& link, const Policy& old, const Policy& policy);
// What SandboxAdd made with `policy` (its exposed ports), gone.
std::string SandboxRemove(const NodeNet& node, const SandboxLink& link, const Policy& policy);
// Lists the sandbox's refusals' counter ("packets N bytes M").
std::string CounterList(const NodeNet& node, const SandboxLink& link);
// Addresses the resolver answered for the name entry at `rule_index` of the
// sandbox's policy, reachable on its ports for `ttl_s` seconds (at least 1).
std::string Pin(const NodeNet& node, const SandboxLink& link, size_t rule_index, const std::vector<uint32_t>& addrs,
                uint32_t ttl_s);

}  // namespace dsec::net
