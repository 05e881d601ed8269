// Network namespaces a test makes (named, under /run/netns) and what runs
// in them: a function on a thread of its own inside one, TCP listeners and
// connects. A test's "internet" is such a namespace; no packet leaves them.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>

#include "harness/daemon.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::testing {

// Runs `f` on a thread of its own in network namespace `ns`; what it
// returns. A thread that cannot enter it stops the test binary: `f` must
// never touch the host's own network.
template <class F>
auto InNs(const std::string& ns, F f) -> decltype(f()) {
  return std::async(std::launch::async, [&]() -> decltype(f()) {
           UniqueFd fd(::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
           if (!fd || ::setns(fd.get(), CLONE_NEWNET) != 0) {
             std::fprintf(stderr, "netns: cannot enter network namespace %s: %s\n", ns.c_str(), std::strerror(errno));
             std::abort();
           }
           return f();
         })
      .get();
}

// `cmd` through /bin/sh: true when it exits 0; its output in *out.
inline bool Sh(const std::string& cmd, std::string* out = nullptr) {
  auto r = RunProcess({"/bin/sh", "-c", cmd});
  if (out) *out = r.out + r.err;
  return r.exit_code == 0;
}

inline sockaddr_in Ipv4Addr(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// A TCP connect from `ns` to ip:port: 0 once connected, else the errno
// (ECONNREFUSED for a policy's refusal; ETIMEDOUT after 3 s of silence).
inline int ConnectFrom(const std::string& ns, const std::string& ip, uint16_t port) {
  return InNs(ns, [&] {
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in a = Ipv4Addr(ip, port);
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return 0;
    if (errno != EINPROGRESS) return errno;
    pollfd p{s.get(), POLLOUT, 0};
    if (::poll(&p, 1, 3000) != 1) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    return err;
  });
}

// A listening TCP socket in `ns` (the kernel completes connections to it
// without an accept); invalid when it cannot listen (errno in *err).
inline UniqueFd ListenIn(const std::string& ns, const std::string& ip, uint16_t port, int* err = nullptr) {
  return InNs(ns, [&] {
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = Ipv4Addr(ip, port);
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s.get(), 64) != 0) {
      if (err) *err = errno;
      return UniqueFd();
    }
    return s;
  });
}

}  // namespace dsec::testing
