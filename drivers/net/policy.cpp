#include "drivers/net/policy.hpp"

#include <algorithm>
#include <cctype>
#include <set>

namespace dsec::net {

namespace {

Status Bad(std::string_view entry, const std::string& why) {
  return Status::InvalidArgument("network entry '" + std::string(entry) + "': " + why);
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A decimal number of at most 9 digits, or -1.
long Number(std::string_view s) {
  if (!AllDigits(s) || s.size() > 9) return -1;
  long n = 0;
  for (char c : s) n = n * 10 + (c - '0');
  return n;
}

Result<uint16_t> ParsePort(std::string_view entry, std::string_view s) {
  long n = Number(s);
  if (n < 1 || n > 65535)
    return Bad(entry, "'" + std::string(s) + "' is not a port (1-65535)");
  return static_cast<uint16_t>(n);
}

Status ParsePorts(std::string_view entry, std::string_view s, std::vector<PortRange>* out) {
  size_t start = 0;
  for (;;) {
    size_t comma = s.find(',', start);
    std::string_view one = s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (one.empty()) return Bad(entry, "an empty port in the list (ports are comma-separated: 80,443)");
    PortRange r;
    size_t dash = one.find('-');
    auto first = ParsePort(entry, one.substr(0, dash));
    if (!first.ok()) return first.status();
    r.first = r.last = *first;
    if (dash != std::string_view::npos) {
      auto last = ParsePort(entry, one.substr(dash + 1));
      if (!last.ok()) return last.status();
      if (*last < *first) return Bad(entry, "the range " + std::string(one) + " ends before it starts");
      r.last = *last;
    }
    out->push_back(r);
    if (out->size() > kMaxPortRanges)
      return Bad(entry, "more than " + std::to_string(kMaxPortRanges) + " ports or ranges (use a range: 8000-8100)");
    if (comma == std::string_view::npos) return Status::Ok();
    start = comma + 1;
  }
}

Status ParseName(std::string_view entry, std::string_view s, Rule* r) {
  if (s.size() >= 2 && s[0] == '*' && s[1] == '.') {
    r->wildcard = true;
    s.remove_prefix(2);
  }
  if (s.find('*') != std::string_view::npos)
    return Bad(entry, "a wildcard goes only at the front, as *.example.com");
  if (!s.empty() && s.back() == '.') s.remove_suffix(1);
  if (s.empty()) return Bad(entry, r->wildcard ? "*. needs a name after it (*.example.com)" : "an empty name");
  if (s.size() > 253) return Bad(entry, "a name is at most 253 characters");
  std::string name;
  name.reserve(s.size());
  size_t label = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      if (label == 0) return Bad(entry, "an empty label in the name (two dots, or a leading dot)");
      if (label > 63) return Bad(entry, "a label of the name is longer than 63 characters");
      if (name.back() == '-') return Bad(entry, "a label of the name ends with '-'");
      if (i < s.size()) name.push_back('.');
      label = 0;
      continue;
    }
    char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) return Bad(entry, "'" + std::string(1, s[i]) + "' is not allowed in a name (letters, digits, '-', '_', '.')");
    if (label == 0 && c == '-') return Bad(entry, "a label of the name starts with '-'");
    name.push_back(c);
    ++label;
  }
  r->name = std::move(name);
  return Status::Ok();
}

}  // namespace

const char* ProtoName(Proto p) {
  switch (p) {
    case Proto::kTcp:
      return "tcp";
    case Proto::kUdp:
      return "udp";
    case Proto::kAny:
      break;
  }
  return "tcp+udp";
}

Result<uint32_t> ParseIpv4(std::string_view s) {
  uint32_t addr = 0;
  int parts = 0;
  size_t start = 0;
  while (start <= s.size()) {
    size_t dot = s.find('.', start);
    std::string_view part = s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    long n = Number(part);
    if (n < 0 || n > 255 || (part.size() > 1 && part[0] == '0'))
      return Status::InvalidArgument("'" + std::string(s) + "' is not an IPv4 address (four numbers 0-255: 10.1.2.3)");
    addr = addr << 8 | static_cast<uint32_t>(n);
    ++parts;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (parts != 4)
    return Status::InvalidArgument("'" + std::string(s) + "' is not an IPv4 address (four numbers 0-255: 10.1.2.3)");
  return addr;
}

std::string Ipv4Text(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string(a >> 16 & 255) + "." + std::to_string(a >> 8 & 255) + "." +
         std::to_string(a & 255);
}

const std::vector<SpecialRange>& SpecialRanges() {
  static const std::vector<SpecialRange> kRanges = {
      {0x00000000, 8, "'this network' (0.0.0.0/8)"},
      {0x0A000000, 8, "private (10.0.0.0/8)"},
      {0x64400000, 10, "shared address space (100.64.0.0/10)"},
      {0x7F000000, 8, "loopback (127.0.0.0/8)"},
      {0xA9FE0000, 16, "link-local (169.254.0.0/16)"},
      {0xAC100000, 12, "private (172.16.0.0/12)"},
      {0xC0000000, 24, "IETF protocol assignments (192.0.0.0/24)"},
      {0xC0A80000, 16, "private (192.168.0.0/16)"},
      {0xC6120000, 15, "benchmarking (198.18.0.0/15)"},
      {0xE0000000, 3, "multicast or reserved (224.0.0.0 and above)"},
  };
  return kRanges;
}

std::string NetText(uint32_t addr, uint8_t prefix) {
  return prefix == 32 ? Ipv4Text(addr) : Ipv4Text(addr) + "/" + std::to_string(prefix);
}

const char* Special(uint32_t a) {
  for (const auto& r : SpecialRanges()) {
    uint32_t mask = ~uint32_t{0} << (32 - r.prefix);
    if ((a & mask) == r.net) return r.why;
  }
  return "";
}

bool Rule::MatchesName(std::string_view q) const {
  if (name.empty()) return false;
  if (!q.empty() && q.back() == '.') q.remove_suffix(1);
  auto eq = [](std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == y;
           });
  };
  if (!wildcard) return eq(q, name);
  // Under `name`: at least one more label, then a dot, then name.
  if (q.size() < name.size() + 2) return false;
  return q[q.size() - name.size() - 1] == '.' && eq(q.substr(q.size() - name.size()), name);
}

bool Rule::OpensPort(Proto p, uint16_t port) const {
  if (proto != Proto::kAny && proto != p) return false;
  if (ports.empty()) return true;
  return std::any_of(ports.begin(), ports.end(), [&](const PortRange& r) { return port >= r.first && port <= r.last; });
}

Result<Rule> ParseRule(std::string_view text) {
  if (text.empty()) return Status::InvalidArgument("network entry '': an empty entry");
  if (text.size() > kMaxRuleBytes)
    return Status::InvalidArgument("network entry '" + std::string(text.substr(0, 40)) + "...': " +
                                   std::to_string(text.size()) + " bytes, above the maximum of " +
                                   std::to_string(kMaxRuleBytes));
  Rule r;
  r.text = std::string(text);
  std::string_view s = text;
  auto strip = [&](std::string_view suffix) {
    if (s.size() <= suffix.size() || s.substr(s.size() - suffix.size()) != suffix) return false;
    s.remove_suffix(suffix.size());
    return true;
  };
  if (strip("/tcp")) r.proto = Proto::kTcp;
  else if (strip("/udp")) r.proto = Proto::kUdp;
  if (!s.empty() && s[0] == '[')
    return Bad(text, "IPv6 entries are not supported: sandboxes reach IPv4 addresses only");
  std::string_view target = s;
  size_t colon = s.rfind(':');
  if (colon != std::string_view::npos) {
    target = s.substr(0, colon);
    if (target.find(':') != std::string_view::npos)
      return Bad(text, "IPv6 entries are not supported: sandboxes reach IPv4 addresses only");
    std::string_view ports = s.substr(colon + 1);
    if (ports.empty()) return Bad(text, "':' with no port after it");
    DSEC_RETURN_IF_ERROR(ParsePorts(text, ports, &r.ports));
  }
  if (target.empty()) return Bad(text, "no address or name before the ports");
  bool numeric = std::all_of(target.begin(), target.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.' || c == '/'; });
  if (!numeric) {
    if (target.find('/') != std::string_view::npos)
      return Bad(text, "'/' in a name (a protocol goes last, as /tcp or /udp; a prefix only after an address)");
    DSEC_RETURN_IF_ERROR(ParseName(text, target, &r));
    return r;
  }
  size_t slash = target.find('/');
  auto addr = ParseIpv4(target.substr(0, slash));
  if (!addr.ok()) return Bad(text, addr.status().message());
  r.addr = *addr;
  if (slash != std::string_view::npos) {
    long prefix = Number(target.substr(slash + 1));
    if (prefix < 0 || prefix > 32) return Bad(text, "the prefix after '/' is 0-32");
    r.prefix = static_cast<uint8_t>(prefix);
    uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
    if ((r.addr & ~mask) != 0)
      return Bad(text, "the address has bits set past its prefix: did you mean " + Ipv4Text(r.addr & mask) + "/" +
                           std::to_string(prefix) + "?");
  }
  return r;
}

Result<Policy> ParsePolicy(const v1::NetworkPolicy& p) {
  Policy out;
  if (!v1::NetworkMode_IsValid(p.mode()))
    return Status::InvalidArgument("network: mode " + std::to_string(p.mode()) + " is not none, allow or open");
  out.mode = p.mode() == v1::NETWORK_MODE_UNSPECIFIED ? v1::NETWORK_MODE_NONE : p.mode();
  const char* mode = out.mode == v1::NETWORK_MODE_OPEN ? "open" : out.mode == v1::NETWORK_MODE_ALLOW ? "allow" : "none";
  if (p.allow_size() > 0 && out.mode != v1::NETWORK_MODE_ALLOW)
    return Status::InvalidArgument(std::string("network: an allow list needs mode allow (the mode is ") + mode +
                                   ", which would not apply it)");
  if (out.mode == v1::NETWORK_MODE_ALLOW && p.allow_size() == 0)
    return Status::InvalidArgument(
        "network: mode allow with an empty list allows nothing: list what to allow, or use mode none");
  if (static_cast<size_t>(p.allow_size()) > kMaxRules)
    return Status::InvalidArgument("network: " + std::to_string(p.allow_size()) + " allow entries, above the maximum of " +
                                   std::to_string(kMaxRules));
  for (const auto& text : p.allow()) {
    auto r = ParseRule(text);
    if (!r.ok()) return r.status();
    out.rules.push_back(std::move(*r));
  }
  if (static_cast<size_t>(p.expose_size()) > kMaxExposed)
    return Status::InvalidArgument("network: " + std::to_string(p.expose_size()) + " exposed ports, above the maximum of " +
                                   std::to_string(kMaxExposed));
  std::set<uint32_t> seen;
  for (uint32_t port : p.expose()) {
    if (port < 1 || port > 65535)
      return Status::InvalidArgument("network: exposed port " + std::to_string(port) + " is not a port (1-65535)");
    if (!seen.insert(port).second)
      return Status::InvalidArgument("network: port " + std::to_string(port) + " is exposed twice");
    out.expose.push_back(static_cast<uint16_t>(port));
  }
  return out;
}

}  // namespace dsec::net
