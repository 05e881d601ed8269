#include "drivers/net/dns.hpp"

#include <algorithm>

namespace dsec::net::dns {

namespace {

uint16_t U16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t U32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}
void Put16(std::vector<uint8_t>* out, uint16_t v) {
  out->push_back(static_cast<uint8_t>(v >> 8));
  out->push_back(static_cast<uint8_t>(v));
}
void Put32(std::vector<uint8_t>* out, uint32_t v) {
  Put16(out, static_cast<uint16_t>(v >> 16));
  Put16(out, static_cast<uint16_t>(v));
}

// Reads the name at `*at` (following at most 16 compression pointers, each
// to an earlier offset); `*at` moves past it where it is written. The name
// in lower case with dots, or nullopt.
std::optional<std::string> ReadName(const uint8_t* d, size_t len, size_t* at) {
  std::string name;
  size_t p = *at;
  bool jumped = false;
  for (int jumps = 0;;) {
    if (p >= len) return std::nullopt;
    uint8_t l = d[p];
    if ((l & 0xC0) == 0xC0) {
      if (p + 1 >= len || ++jumps > 16) return std::nullopt;
      size_t to = (l & 0x3F) << 8 | d[p + 1];
      if (to >= p) return std::nullopt;  // only backwards: no loops
      if (!jumped) *at = p + 2;
      jumped = true;
      p = to;
      continue;
    }
    if (l & 0xC0) return std::nullopt;  // the reserved label kinds
    if (l == 0) {
      if (!jumped) *at = p + 1;
      return name;
    }
    if (p + 1 + l > len || name.size() + l + 1 > 254) return std::nullopt;
    if (!name.empty()) name += '.';
    for (size_t i = 0; i < l; ++i) {
      char c = static_cast<char>(d[p + 1 + i]);
      name += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    }
    p += 1 + l;
  }
}

void PutName(std::vector<uint8_t>* out, const std::string& name) {
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    out->push_back(static_cast<uint8_t>(dot - start));
    out->insert(out->end(), name.begin() + start, name.begin() + dot);
    start = dot + 1;
  }
  out->push_back(0);
}

}  // namespace

std::optional<Query> ParseQuery(const uint8_t* d, size_t len) {
  if (len < 12 || (d[2] & 0x80) || ((d[2] >> 3) & 0xF) != 0 || U16(d + 4) != 1) return std::nullopt;
  Query q;
  q.id = U16(d);
  q.rd = d[2] & 1;
  size_t at = 12;
  auto name = ReadName(d, len, &at);
  if (!name || at + 4 > len) return std::nullopt;
  q.name = std::move(*name);
  q.qtype = U16(d + at);
  q.qclass = U16(d + at + 2);
  q.question.assign(d + 12, d + at + 4);
  return q;
}

std::vector<uint8_t> Answer(const Query& q, Rcode rcode, const std::vector<uint32_t>& addrs, uint32_t ttl) {
  std::vector<uint8_t> out;
  Put16(&out, q.id);
  out.push_back(static_cast<uint8_t>(0x80 | (q.rd ? 1 : 0)));  // QR, opcode 0, RD as asked
  out.push_back(static_cast<uint8_t>(0x80 | rcode));            // RA
  size_t fit = (kMaxUdp - 12 - std::min(q.question.size(), kMaxUdp - 12)) / 16;
  uint16_t n = static_cast<uint16_t>(std::min(addrs.size(), fit));
  Put16(&out, 1);
  Put16(&out, n);
  Put16(&out, 0);
  Put16(&out, 0);
  out.insert(out.end(), q.question.begin(), q.question.end());
  for (uint16_t i = 0; i < n; ++i) {
    Put16(&out, 0xC00C);  // the question's name
    Put16(&out, kTypeA);
    Put16(&out, kClassIn);
    Put32(&out, ttl);
    Put16(&out, 4);
    Put32(&out, addrs[i]);
  }
  return out;
}

std::vector<uint8_t> AQuery(uint16_t id, const std::string& name) {
  std::vector<uint8_t> out;
  Put16(&out, id);
  out.push_back(1);  // RD
  out.push_back(0);
  Put16(&out, 1);
  Put16(&out, 0);
  Put16(&out, 0);
  Put16(&out, 0);
  PutName(&out, name);
  Put16(&out, kTypeA);
  Put16(&out, kClassIn);
  return out;
}

std::optional<Response> ParseResponse(const uint8_t* d, size_t len) {
  if (len < 12 || !(d[2] & 0x80) || U16(d + 4) != 1) return std::nullopt;
  Response r;
  r.id = U16(d);
  r.rcode = static_cast<Rcode>(d[3] & 0xF);
  size_t at = 12;
  auto name = ReadName(d, len, &at);
  if (!name || at + 4 > len || U16(d + at) != kTypeA || U16(d + at + 2) != kClassIn) return std::nullopt;
  r.name = std::move(*name);
  at += 4;
  uint16_t answers = U16(d + 6);
  bool any = false;
  for (uint16_t i = 0; i < answers; ++i) {
    if (!ReadName(d, len, &at) || at + 10 > len) return std::nullopt;
    uint16_t type = U16(d + at), cls = U16(d + at + 2), rdlen = U16(d + at + 8);
    uint32_t ttl = U32(d + at + 4);
    at += 10;
    if (at + rdlen > len) return std::nullopt;
    if (type == kTypeA && cls == kClassIn && rdlen == 4 && r.addrs.size() < 32) {
      r.addrs.push_back(U32(d + at));
      r.ttl = any ? std::min(r.ttl, ttl) : ttl;
      any = true;
    }
    at += rdlen;
  }
  // RFC 2181: a TTL with the top bit set is read as 0.
  if (r.ttl & 0x80000000u) r.ttl = 0;
  return r;
}

}  // namespace dsec::net::dns
