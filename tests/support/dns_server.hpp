// A DNS server in a test's "internet" namespace: answers A queries for the
// names it is given (one address each, with a TTL), NXDOMAIN for the rest,
// and counts what it was asked. Written apart from dsec's own DNS code
// (drivers/net/dns.hpp), so a test does not check dsec against itself.
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/netns.hpp"

namespace dsec::testing {

class DnsServer {
 public:
  struct Record {
    std::string addr;
    uint32_t ttl = 60;
  };
  // Listens on ip:port (udp) in `ns`; ok() false when it cannot.
  DnsServer(const std::string& ns, const std::string& ip, uint16_t port, std::map<std::string, Record> names)
      : names_(std::move(names)) {
    sock_ = InNs(ns, [&] {
      UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      sockaddr_in a = Ipv4Addr(ip, port);
      if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return UniqueFd();
      return s;
    });
    stop_ = UniqueFd(::eventfd(0, EFD_CLOEXEC));
    if (sock_) thread_ = std::thread([this] { Serve(); });
  }
  ~DnsServer() {
    uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    if (thread_.joinable()) thread_.join();
  }
  bool ok() const { return static_cast<bool>(sock_); }
  // Every name asked, in order (lower case).
  std::vector<std::string> asked() const {
    std::lock_guard<std::mutex> lk(mu_);
    return asked_;
  }

 private:
  void Serve() {
    unsigned char b[512];
    for (;;) {
      pollfd p[2] = {{sock_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0 || p[1].revents) return;
      sockaddr_in from{};
      socklen_t len = sizeof from;
      ssize_t n = ::recvfrom(sock_.get(), b, sizeof b, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 17) continue;
      std::string name;
      size_t at = 12;
      while (at < static_cast<size_t>(n) && b[at] && b[at] < 64 && at + 1 + b[at] < static_cast<size_t>(n)) {
        if (!name.empty()) name += '.';
        for (int i = 1; i <= b[at]; ++i) name += static_cast<char>(std::tolower(b[at + i]));
        at += 1 + b[at];
      }
      if (at + 5 > static_cast<size_t>(n)) continue;
      bool type_a = b[at + 1] == 0 && b[at + 2] == 1;
      size_t qend = at + 5;
      {
        std::lock_guard<std::mutex> lk(mu_);
        asked_.push_back(name);
      }
      std::vector<unsigned char> r(b, b + qend);
      r[2] = 0x81;  // QR, RD
      auto it = names_.find(name);
      r[3] = it == names_.end() ? 0x83 : 0x80;  // RA; NXDOMAIN or NOERROR
      r[6] = 0, r[7] = (it != names_.end() && type_a) ? 1 : 0;
      r[8] = r[9] = r[10] = r[11] = 0;
      if (r[7]) {
        in_addr a{};
        ::inet_pton(AF_INET, it->second.addr.c_str(), &a);
        const auto* ab = reinterpret_cast<const unsigned char*>(&a.s_addr);
        uint32_t t = it->second.ttl;
        unsigned char rr[] = {0xC0, 0x0C, 0, 1, 0, 1, static_cast<unsigned char>(t >> 24),
                              static_cast<unsigned char>(t >> 16), static_cast<unsigned char>(t >> 8),
                              static_cast<unsigned char>(t), 0, 4, ab[0], ab[1], ab[2], ab[3]};
        r.insert(r.end(), rr, rr + sizeof rr);
      }
      ::sendto(sock_.get(), r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
    }
  }

  std::map<std::string, Record> names_;
  UniqueFd sock_, stop_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<std::string> asked_;
};

// Asks `server`:53 from namespace `ns` for `name` (type 1 = A, 28 = AAAA):
// the rcode and the A addresses of the answer, or rcode -1 with no answer
// within 3 s.
struct DnsAnswer {
  int rcode = -1;
  std::vector<std::string> addrs;
};
inline DnsAnswer AskDns(const std::string& ns, const std::string& server, const std::string& name, int type = 1) {
  return InNs(ns, [&] {
    DnsAnswer out;
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    std::vector<unsigned char> q = {0x51, 0x7a, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0};
    size_t start = 0;
    while (start <= name.size()) {
      size_t dot = name.find('.', start);
      if (dot == std::string::npos) dot = name.size();
      q.push_back(static_cast<unsigned char>(dot - start));
      q.insert(q.end(), name.begin() + start, name.begin() + dot);
      start = dot + 1;
    }
    q.insert(q.end(), {0, 0, static_cast<unsigned char>(type), 0, 1});
    sockaddr_in to = Ipv4Addr(server, 53);
    ::sendto(s.get(), q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
    pollfd p{s.get(), POLLIN, 0};
    unsigned char r[512];
    ssize_t n;
    if (::poll(&p, 1, 3000) != 1 || (n = ::recv(s.get(), r, sizeof r, 0)) < 12 || r[0] != 0x51 || r[1] != 0x7a)
      return out;
    out.rcode = r[3] & 0x0f;
    size_t at = q.size();
    for (int i = 0; i < r[7] && at + 16 <= static_cast<size_t>(n); ++i, at += 16)
      if (r[at + 2] == 0 && r[at + 3] == 1 && r[at + 11] == 4)
        out.addrs.push_back(std::to_string(r[at + 12]) + "." + std::to_string(r[at + 13]) + "." +
                            std::to_string(r[at + 14]) + "." + std::to_string(r[at + 15]));
    return out;
  });
}

}  // namespace dsec::testing
