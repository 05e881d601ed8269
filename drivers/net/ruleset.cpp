#include "drivers/net/ruleset.hpp"

#include <algorithm>

namespace dsec::net {

namespace {

std::string Chain(const SandboxLink& l) { return "s_" + l.ifname; }
std::string Counter(const SandboxLink& l) { return "r_" + l.ifname; }
// The addresses the resolver answered for name entry `i`, with timeouts.
std::string NameSet(const SandboxLink& l, size_t i) { return "n" + std::to_string(i) + "_" + l.ifname; }
std::string Table(const NodeNet& n) { return "inet " + n.table; }
std::string Ifs(const NodeNet& n) { return "\"" + n.ifprefix + "*\""; }

// What `rule` opens beyond its addresses: its protocol and ports.
std::string Transport(const Rule& rule) {
  std::string out = rule.proto == Proto::kTcp   ? "meta l4proto tcp"
                    : rule.proto == Proto::kUdp ? "meta l4proto udp"
                                                : "meta l4proto { tcp, udp }";
  if (rule.ports.empty()) return out;
  std::string ports;
  for (const auto& r : rule.ports)
    ports += (ports.empty() ? "" : ", ") +
             (r.first == r.last ? std::to_string(r.first) : std::to_string(r.first) + "-" + std::to_string(r.last));
  return out + " th dport { " + ports + " }";
}

// `verb` ("add", "flush", "delete") for the name sets of `p`'s name entries.
std::string NameSets(const NodeNet& n, const SandboxLink& l, const Policy& p, const char* verb) {
  std::string out;
  for (size_t i = 0; i < p.rules.size(); ++i) {
    if (!p.rules[i].is_name()) continue;
    out += std::string(verb) + " set " + Table(n) + " " + NameSet(l, i);
    out += std::string(verb) == "add" ? " { type ipv4_addr; flags timeout; }\n" : "\n";
  }
  return out;
}

// The sandbox chain's rules for `p`: one per entry (entries may overlap:
// an address inside an allowed range, two names on one address), each
// its addresses (or its name set) and its transport.
std::string Fill(const NodeNet& n, const SandboxLink& l, const Policy& p) {
  std::string t = Table(n), c = Chain(l);
  std::string out;
  out += "add rule " + t + " " + c + " ct state established,related accept\n";
  for (size_t i = 0; i < p.rules.size(); ++i) {
    const Rule& r = p.rules[i];
    std::string dst = r.is_name() ? "ip daddr @" + NameSet(l, i) : "ip daddr " + NetText(r.addr, r.prefix);
    out += "add rule " + t + " " + c + " " + dst + " " + Transport(r) + " accept\n";
  }
  if (p.mode == v1::NETWORK_MODE_OPEN)
    out += "add rule " + t + " " + c + " ip daddr != @special meta l4proto { tcp, udp } accept\n";
  if (n.log_group)
    out += "add rule " + t + " " + c + " limit rate " + std::to_string(n.log_rate) + "/second log group " +
           std::to_string(n.log_group) + " prefix \"dsec " + l.ifname + " \"\n";
  // Refused at once (a connect fails with ECONNREFUSED, not after a timeout).
  return out + "add rule " + t + " " + c + " counter name " + Counter(l) + " jump refuse\n";
}

}  // namespace

std::string NodeTable(const NodeNet& n) {
  std::string t = Table(n), ifs = Ifs(n);
  std::string special;
  for (const auto& r : SpecialRanges()) special += (special.empty() ? "" : ", ") + NetText(r.net, r.prefix);
  std::string port = std::to_string(n.resolver_port);
  // "add table" first: the delete then always has something to delete.
  return "add table " + t + "\n" +
         "delete table " + t + "\n" +
         "add table " + t + "\n" +
         "add map " + t + " egress { type ifname : verdict; }\n" +
         "add set " + t + " special { type ipv4_addr; flags interval; elements = { " + special + " } }\n" +
         "add set " + t + " exposed { type ipv4_addr . inet_service; }\n" +
         // TCP gets a reset (the kernel rate-limits ICMP errors to about one a
         // second per peer: a burst of refused connects would wait for it).
         "add chain " + t + " refuse\n" +
         "add rule " + t + " refuse meta l4proto tcp reject with tcp reset\n" +
         "add rule " + t + " refuse reject with icmpx type admin-prohibited\n" +
         "add chain " + t + " forward { type filter hook forward priority filter - 10; policy accept; }\n" +
         "add rule " + t + " forward iifname " + ifs + " oifname " + ifs +
         " counter jump refuse\n" +
         "add rule " + t + " forward iifname " + ifs + " iifname vmap @egress\n" +
         "add rule " + t + " forward iifname " + ifs + " counter jump refuse\n" +
         "add rule " + t + " forward oifname " + ifs + " ct state established,related accept\n" +
         "add rule " + t + " forward oifname " + ifs + " counter drop\n" +
         "add chain " + t + " input { type filter hook input priority filter - 10; policy accept; }\n" +
         "add rule " + t + " input iifname " + ifs + " ct state established,related accept\n" +
         "add rule " + t + " input iifname " + ifs + " meta l4proto { tcp, udp } th dport " + port + " accept\n" +
         "add rule " + t + " input iifname " + ifs + " counter jump refuse\n" +
         "add chain " + t + " output { type filter hook output priority filter - 10; policy accept; }\n" +
         "add rule " + t + " output oifname " + ifs + " ct state established,related accept\n" +
         "add rule " + t + " output oifname " + ifs + " ip daddr . tcp dport @exposed accept\n" +
         "add rule " + t + " output oifname " + ifs + " counter drop\n" +
         "add chain " + t + " prerouting { type nat hook prerouting priority dstnat - 10; policy accept; }\n" +
         "add rule " + t + " prerouting iifname " + ifs + " meta l4proto { tcp, udp } th dport 53 redirect to :" +
         port + "\n" +
         "add chain " + t + " postrouting { type nat hook postrouting priority srcnat - 10; policy accept; }\n" +
         "add rule " + t + " postrouting iifname " + ifs + " oifname != " + ifs + " masquerade\n";
}

std::string NodeTableRemove(const NodeNet& n) {
  return "add table " + Table(n) + "\ndelete table " + Table(n) + "\n";
}

std::string SandboxAdd(const NodeNet& n, const SandboxLink& l, const Policy& p) {
  std::string t = Table(n);
  std::string out = "add chain " + t + " " + Chain(l) + "\n" + "add counter " + t + " " + Counter(l) + "\n";
  out += NameSets(n, l, p, "add");
  out += Fill(n, l, p);
  for (uint16_t port : p.expose)
    out += "add element " + t + " exposed { " + Ipv4Text(l.addr) + " . " + std::to_string(port) + " }\n";
  // Last: until here the forward chain drops the sandbox's packets.
  return out + "add element " + t + " egress { \"" + l.ifname + "\" : jump " + Chain(l) + " }\n";
}

std::string SandboxReplace(const NodeNet& n, const SandboxLink& l, const Policy& old, const Policy& p) {
  std::string t = Table(n);
  std::string out = "flush chain " + t + " " + Chain(l) + "\n";
  // The name sets go with the list they were pinned for (a new entry at
  // the same place may name something else).
  out += NameSets(n, l, old, "delete");
  out += NameSets(n, l, p, "add");
  return out + Fill(n, l, p);
}

std::string SandboxRemove(const NodeNet& n, const SandboxLink& l, const Policy& p) {
  std::string t = Table(n);
  // The map entry first: nothing jumps to the chain while it goes.
  std::string out = "delete element " + t + " egress { \"" + l.ifname + "\" }\n" + "delete chain " + t + " " +
                    Chain(l) + "\n" + "delete counter " + t + " " + Counter(l) + "\n";
  out += NameSets(n, l, p, "delete");
  for (uint16_t port : p.expose)
    out += "delete element " + t + " exposed { " + Ipv4Text(l.addr) + " . " + std::to_string(port) + " }\n";
  return out;
}

std::string Pin(const NodeNet& n, const SandboxLink& l, size_t rule_index, const std::vector<uint32_t>& addrs,
                uint32_t ttl_s) {
  if (addrs.empty()) return "";
  std::string out = "add element " + Table(n) + " " + NameSet(l, rule_index) + " { ";
  for (size_t i = 0; i < addrs.size(); ++i)
    out += (i ? ", " : "") + Ipv4Text(addrs[i]) + " timeout " + std::to_string(std::max<uint32_t>(ttl_s, 1)) + "s";
  return out + " }\n";
}

std::string CounterList(const NodeNet& n, const SandboxLink& l) {
  return "list counter " + Table(n) + " " + Counter(l) + "\n";
}

}  // namespace dsec::net
