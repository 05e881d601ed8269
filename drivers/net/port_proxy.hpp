// Exposed ports (spec.network.expose): a TCP port inside a sandbox made
// reachable from the host. Each is a listener of dsecd's on the host
// (`listen_addr`, 127.0.0.1 by default, a port the kernel picks) whose
// connections are relayed to the sandbox's address and port, one thread
// for all (epoll). The sandbox gains no way out: the relay's connections
// come from the host to the sandbox, which the node's rules let through
// for exposed ports only (ruleset.hpp: the `exposed` set).
//
// Bounds: at most kMaxProxyConns relayed connections at once, and
// kMaxProxyConnsPerSandbox to one sandbox (the next ones are closed at
// accept); up to 64 KiB buffered per direction each, only while bytes wait.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::net {

inline constexpr size_t kMaxProxyConns = 4096;
inline constexpr size_t kMaxProxyConnsPerSandbox = 512;

struct ExposedPort {
  uint16_t port = 0;       // inside the sandbox
  std::string address;     // where the host reaches it: "127.0.0.1:41234"
};

class PortProxy {
 public:
  // `listen_addr`: the host address listeners bind (IPv4, host order).
  static Result<std::unique_ptr<PortProxy>> Start(uint32_t listen_addr);
  ~PortProxy();
  PortProxy(const PortProxy&) = delete;
  PortProxy& operator=(const PortProxy&) = delete;

  // Listeners for `ports` of sandbox `id` at `addr`, or none (the error
  // names the port) when one cannot be made.
  Result<std::vector<ExposedPort>> Open(const std::string& id, uint32_t addr, const std::vector<uint16_t>& ports);
  // Its listeners and relayed connections, gone.
  void Close(const std::string& id);
  std::vector<ExposedPort> Of(const std::string& id) const;
  size_t connections() const;

 private:
  struct Impl;
  explicit PortProxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsec::net
