// DNS messages as the node's resolver (resolver.hpp) reads and writes
// them (RFC 1035): one question per message, A records only. Pure
// functions over bytes a stranger may have sent: every read is bounded by
// the message's own length, compression pointers are followed a bounded
// number of times, and whatever does not parse is refused (nullopt), never
// guessed at.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsec::net::dns {

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kClassIn = 1;
inline constexpr size_t kMaxUdp = 512;  // what a client without EDNS takes
enum Rcode : uint8_t { kNoError = 0, kServFail = 2, kNxDomain = 3, kRefused = 5 };

struct Query {
  uint16_t id = 0;
  bool rd = false;              // recursion desired, echoed
  std::string name;             // lower case, no trailing dot ("" for the root)
  uint16_t qtype = 0, qclass = 0;
  std::vector<uint8_t> question;  // the question as sent (its case kept), echoed in the answer
};

// A query: not a response, opcode QUERY, exactly one question.
std::optional<Query> ParseQuery(const uint8_t* data, size_t len);

// The answer to `q`: `rcode`, and an A record per address with `ttl`
// (as many as fit in kMaxUdp bytes; TC is never set).
std::vector<uint8_t> Answer(const Query& q, Rcode rcode, const std::vector<uint32_t>& addrs, uint32_t ttl);

// A recursive query (RD) for `name`'s A records, id `id`.
std::vector<uint8_t> AQuery(uint16_t id, const std::string& name);

struct Response {
  uint16_t id = 0;
  Rcode rcode = kNoError;
  std::string name;               // its question's, lower case
  std::vector<uint32_t> addrs;    // every A record of the answer section (host order, at most 32)
  uint32_t ttl = 0;               // the least of their TTLs
};
// A response to one A question.
std::optional<Response> ParseResponse(const uint8_t* data, size_t len);

}  // namespace dsec::net::dns
