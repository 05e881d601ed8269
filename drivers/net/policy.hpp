// A sandbox's network policy (spec.network, DESIGN.md section 12), parsed
// and checked once, where the node admits a spec: what the kernel side and
// the resolver are given. The text forms are docs/running.md's, "Network":
//
//   mode none   loopback only (the default)
//   mode allow  only what `allow` lists, each entry one of
//                 ADDRESS[/PREFIX][:PORTS][/tcp|/udp]   10.1.2.3:443, 10.0.0.0/8:80,443/tcp
//                 NAME[:PORTS][/tcp|/udp]               pypi.org:443, *.pythonhosted.org
//               PORTS: a port or a range (8000-8100), comma-separated;
//               none: every port. No protocol: tcp and udp. A NAME is
//               answered by dsec's resolver only; its answers' addresses
//               become reachable for their TTL. `*.suffix` matches every
//               name under suffix (not suffix itself).
//   mode open   any public address (the node's operator enables it)
//
// Whatever the mode: the node's own addresses, other sandboxes, loopback,
// link-local, private and multicast ranges are never reachable unless an
// address entry names them (Special).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"

namespace dsec::net {

// Bounds of a policy (InvalidArgument past them, naming the entry).
inline constexpr size_t kMaxRules = 256;         // entries in `allow`
inline constexpr size_t kMaxRuleBytes = 300;     // one entry's text
inline constexpr size_t kMaxPortRanges = 32;     // in one entry
inline constexpr size_t kMaxExposed = 16;        // ports in `expose`

enum class Proto : uint8_t { kAny, kTcp, kUdp };
const char* ProtoName(Proto p);  // "tcp+udp", "tcp", "udp"

struct PortRange {
  uint16_t first = 0, last = 0;  // inclusive
};

// One allow-list entry.
struct Rule {
  std::string text;  // as written: errors, refusals and the record name it
  // An address entry: an IPv4 network (host byte order) and its prefix.
  uint32_t addr = 0;
  uint8_t prefix = 32;
  // A name entry (lower case, no trailing dot); `wildcard`: every name
  // under `name`, not `name` itself.
  std::string name;
  bool wildcard = false;
  std::vector<PortRange> ports;  // empty: every port
  Proto proto = Proto::kAny;

  bool is_name() const { return !name.empty(); }
  // Whether DNS name `qname` (any case, a trailing dot allowed) is one this
  // name entry lists.
  bool MatchesName(std::string_view qname) const;
  // Whether this entry opens `port` for `proto` (kTcp or kUdp).
  bool OpensPort(Proto p, uint16_t port) const;
};

struct Policy {
  v1::NetworkMode mode = v1::NETWORK_MODE_NONE;  // never UNSPECIFIED
  std::vector<Rule> rules;
  std::vector<uint16_t> expose;
};

// One entry, or InvalidArgument naming it and what is wrong.
Result<Rule> ParseRule(std::string_view text);
// The whole policy: mode, entries, exposed ports. An `allow` list with a
// mode other than allow, or allow with an empty list, is refused (a list
// that is silently not applied, or a policy that silently allows nothing).
Result<Policy> ParsePolicy(const v1::NetworkPolicy& policy);

// Dotted quad, or InvalidArgument.
Result<uint32_t> ParseIpv4(std::string_view text);
std::string Ipv4Text(uint32_t addr);

// The ranges a sandbox never reaches unless an entry names them: 0/8,
// 10/8, 100.64/10, 127/8, 169.254/16, 172.16/12, 192.0.0/24, 192.168/16,
// 198.18/15, 224/3 (multicast and reserved).
struct SpecialRange {
  uint32_t net;
  uint8_t prefix;
  const char* why;
};
const std::vector<SpecialRange>& SpecialRanges();
// Why `addr` is in one of them, or "" for a public address.
const char* Special(uint32_t addr);
// "a.b.c.d" for a /32, else "a.b.c.d/p".
std::string NetText(uint32_t addr, uint8_t prefix);

}  // namespace dsec::net
