// The admin console: a line protocol on a TCP port (loopback by default) for
// operators, usable with nc or telnet. The first command must be
// `AUTH <token>` (the token is in <data-dir>/admin.token, mode 0600). Every
// reply is one JSON object on one line; errors are {"ok":false,"error":...}.
// See docs/console.md.
#pragma once

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdint>
#include <string>

#include "actors/node.hpp"

namespace dsec {

struct ConsoleOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 7401;          // 0: any free port
  std::string token;
  size_t max_line = 4096;        // longer lines are refused and the connection closed
  size_t max_connections = 64;
};

// Spawns the console broker; the bound port, or an error naming the address.
caf::expected<std::pair<caf::actor, uint16_t>> SpawnConsole(caf::actor_system& sys, node_actor node,
                                                             const ConsoleOptions& options);

}  // namespace dsec
