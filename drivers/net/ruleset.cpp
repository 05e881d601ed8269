#include "drivers/net/ruleset.hpp"

#include <algorithm>

namespace dsec::net {

namespace {

std::string Chain(const SandboxLink& l) { return "s_" + l.ifname; }
std::string Set(const SandboxLink& l) { return "a_" + l.ifname; }
std::string Counter(const SandboxLink& l) { return "r_" + l.ifname; }
std::string Table(const NodeNet& n) { return "inet " + n.table; }
std::string Ifs(const NodeNet& n) { return "\"" + n.ifprefix + "*\""; }

// `rule`'s elements for `addr`: address . protocol . ports, each protocol
// and port range it opens, with a timeout when `ttl_s` > 0.
void AddElements(const Rule& rule, const std::string& addr, uint32_t ttl_s, std::vector<std::string>* out) {
  std::vector<const char*> protos;
  if (rule.proto != Proto::kUdp) protos.push_back("tcp");
  if (rule.proto != Proto::kTcp) protos.push_back("udp");
  std::vector<PortRange> ranges = rule.ports;
  if (ranges.empty()) ranges.push_back({1, 65535});
  std::string timeout = ttl_s ? " timeout " + std::to_string(ttl_s) + "s" : "";
  for (const char* proto : protos)
    for (const auto& r : ranges) {
      std::string ports = r.first == r.last ? std::to_string(r.first)
                                            : std::to_string(r.first) + "-" + std::to_string(r.last);
      out->push_back(addr + " . " + proto + " . " + ports + timeout);
    }
}

// "add element ..." for `elements`, in batches nft takes comfortably.
std::string AddToSet(const NodeNet& n, const std::string& set, const std::vector<std::string>& elements) {
  std::string out;
  constexpr size_t kPerLine = 512;
  for (size_t i = 0; i < elements.size(); i += kPerLine) {
    out += "add element " + Table(n) + " " + set + " { ";
    for (size_t j = i; j < std::min(elements.size(), i + kPerLine); ++j) out += (j > i ? ", " : "") + elements[j];
    out += " }\n";
  }
  return out;
}

// The sandbox chain's rules and its set's address entries for `p`.
std::string Fill(const NodeNet& n, const SandboxLink& l, const Policy& p) {
  std::string t = Table(n), c = Chain(l), s = Set(l);
  std::string out;
  out += "add rule " + t + " " + c + " ct state established,related accept\n";
  out += "add rule " + t + " " + c + " ip daddr . meta l4proto . th dport @" + s + " accept\n";
  if (p.mode == v1::NETWORK_MODE_OPEN) out += "add rule " + t + " " + c + " ip daddr != @special ip protocol { tcp, udp } accept\n";
  if (n.log_group)
    out += "add rule " + t + " " + c + " limit rate " + std::to_string(n.log_rate) + "/second log group " +
           std::to_string(n.log_group) + " prefix \"dsec " + l.ifname + " \"\n";
  // Refused at once (a connect fails with ECONNREFUSED, not after a timeout).
  out += "add rule " + t + " " + c + " counter name " + Counter(l) + " jump refuse\n";
  std::vector<std::string> elements;
  for (const auto& r : p.rules)
    if (!r.is_name()) AddElements(r, NetText(r.addr, r.prefix), 0, &elements);
  return out + AddToSet(n, s, elements);
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
  std::string out = "add chain " + t + " " + Chain(l) + "\n" + "add counter " + t + " " + Counter(l) + "\n" +
                    "add set " + t + " " + Set(l) +
                    " { type ipv4_addr . inet_proto . inet_service; flags interval, timeout; }\n";
  out += Fill(n, l, p);
  for (uint16_t port : p.expose)
    out += "add element " + t + " exposed { " + Ipv4Text(l.addr) + " . " + std::to_string(port) + " }\n";
  // Last: until here the forward chain drops the sandbox's packets.
  return out + "add element " + t + " egress { \"" + l.ifname + "\" : jump " + Chain(l) + " }\n";
}

std::string SandboxReplace(const NodeNet& n, const SandboxLink& l, const Policy& p) {
  std::string t = Table(n);
  return "flush chain " + t + " " + Chain(l) + "\n" + "flush set " + t + " " + Set(l) + "\n" + Fill(n, l, p);
}

std::string SandboxAddEntries(const NodeNet& n, const SandboxLink& l, const std::vector<Rule>& extra) {
  std::vector<std::string> elements;
  for (const auto& r : extra)
    if (!r.is_name()) AddElements(r, NetText(r.addr, r.prefix), 0, &elements);
  return AddToSet(n, Set(l), elements);
}

std::string SandboxRemove(const NodeNet& n, const SandboxLink& l, const Policy& p) {
  std::string t = Table(n);
  // The map entry first: nothing jumps to the chain while it goes.
  std::string out = "delete element " + t + " egress { \"" + l.ifname + "\" }\n" + "delete chain " + t + " " +
                    Chain(l) + "\n" + "delete set " + t + " " + Set(l) + "\n" + "delete counter " + t + " " +
                    Counter(l) + "\n";
  for (uint16_t port : p.expose)
    out += "delete element " + t + " exposed { " + Ipv4Text(l.addr) + " . " + std::to_string(port) + " }\n";
  return out;
}

std::string Pin(const NodeNet& n, const SandboxLink& l, const Rule& rule, const std::vector<uint32_t>& addrs,
                uint32_t ttl_s) {
  std::vector<std::string> elements;
  for (uint32_t a : addrs) AddElements(rule, Ipv4Text(a), std::max<uint32_t>(ttl_s, 1), &elements);
  return AddToSet(n, Set(l), elements);
}

std::string CounterList(const NodeNet& n, const SandboxLink& l) {
  return "list counter " + Table(n) + " " + Counter(l) + "\n";
}

}  // namespace dsec::net
