// Refused packets the node's rules log (ruleset.hpp: `log group`), read
// from nfnetlink_log in the network namespace of the thread that opens it.
// Each is the prefix the rule gave ("dsec <ifname> ") and the start of the
// packet: enough for its protocol, destination address and port.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dsec/status.hpp"

struct mnl_socket;

namespace dsec::net {

struct LoggedPacket {
  std::string ifname;    // from the prefix
  std::string proto;     // "tcp", "udp", "icmp" or the protocol's number
  uint32_t daddr = 0;    // host order
  uint16_t dport = 0;    // 0 for protocols without ports
};

class Nflog {
 public:
  // Binds group `group` (copying 64 bytes of each packet); AlreadyExists
  // when another program of this namespace has it.
  static Result<std::unique_ptr<Nflog>> Open(uint16_t group);
  ~Nflog();
  Nflog(const Nflog&) = delete;
  Nflog& operator=(const Nflog&) = delete;

  int fd() const;
  // Reads what is waiting (non-blocking) and calls `each` per packet of
  // ours; messages that are not (another prefix, a short payload) are
  // skipped.
  template <class F>
  void Read(F each) {
    char buf[8192];
    for (;;) {
      LoggedPacket p[64];
      int n = ReadSome(buf, sizeof buf, p, 64);
      if (n < 0) return;
      for (int i = 0; i < n; ++i) each(p[i]);
    }
  }

 private:
  Nflog() = default;
  // One datagram's packets into `out`; -1 when none is waiting.
  int ReadSome(char* buf, size_t size, LoggedPacket* out, int max);
  mnl_socket* nl_ = nullptr;
};

}  // namespace dsec::net
