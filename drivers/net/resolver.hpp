// The node's resolver for its sandboxes: every DNS query a sandbox sends,
// to any address, is redirected here (ruleset.hpp's prerouting). It knows
// the sandbox by the query's source address and answers:
//   - a name one of its name entries lists (policy.hpp), type A: the
//     upstream's addresses, pinned in the sandbox's set for their TTL
//     before the answer leaves (the sandbox reaches those addresses, on
//     that entry's ports, and no others);
//   - a listed name, any other type: no records (NOERROR; AAAA too, as
//     sandboxes have IPv4 only);
//   - any other name: NXDOMAIN, counted as a refusal;
//   - a query from an address that is no sandbox's: REFUSED.
// DNS cannot carry data to an unlisted name: such a name never reaches the
// upstream. Answers are cached (at most `cache_names` names, for their TTL,
// at most max_ttl_s; NXDOMAIN for 10 s); at most `max_pending` names wait
// for the upstream at once, and 32 queries of one sandbox: the rest get
// SERVFAIL (a sandbox asking random names of a slow domain starves no
// other). Each query to the upstream leaves from a socket of its own (a
// random port and a random id), connected to the server asked. DNS over TCP is closed
// at once (answers fit in UDP: at most 29 addresses). One thread.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drivers/net/policy.hpp"

namespace dsec::net {

struct ResolverOptions {
  uint16_t port = 10053;                 // udp and tcp, every address
  std::vector<sockaddr_in> upstream;     // tried in turn; none: listed names get SERVFAIL
  size_t cache_names = 4096;
  size_t max_pending = 256;
  uint32_t timeout_ms = 1500;            // per upstream try (two tries per server)
  uint32_t max_ttl_s = 3600;
  // What the resolver asks of the node (called on its thread):
  // `who`: the sandbox at `addr` (false: none): its id, its policy's
  // entries and the policy's generation (a change makes a new one).
  std::function<bool(uint32_t addr, std::string* id, std::vector<Rule>* rules, uint64_t* gen)> who;
  // `pin`: addresses reachable for sandbox `id` on the entry at `index` of
  // its policy of generation `gen` (nothing when it has changed since).
  std::function<void(const std::string& id, uint64_t gen, size_t index, const std::vector<uint32_t>& addrs,
                     uint32_t ttl_s)>
      pin;
  // `refused`: sandbox `id` asked for unlisted `name`.
  std::function<void(const std::string& id, const std::string& name)> refused;
  std::function<void(int level, const std::string& text)> log;
};

// The upstream servers of /etc/resolv.conf-style `text` (IPv4 nameserver
// lines, port 53).
std::vector<sockaddr_in> NameserversOf(const std::string& text);

class Resolver {
 public:
  // Binds its port and starts its thread; the error names the port.
  static Result<std::unique_ptr<Resolver>> Start(ResolverOptions options);
  ~Resolver();
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  // Cached addresses of names `rule` lists, each with its remaining TTL:
  // what a sandbox whose policy now has `rule` may be given again.
  std::vector<std::pair<std::vector<uint32_t>, uint32_t>> Cached(const Rule& rule) const;

  struct Stats {
    uint64_t queries = 0, answered_cached = 0, answered_upstream = 0, nxdomain = 0, refused = 0, servfail = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  explicit Resolver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsec::net
