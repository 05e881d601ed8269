// The admin console: a line protocol on a TCP port (loopback by default) for
// operators, usable with nc or telnet. The first command must be
// `AUTH <token>` (the token is in <data-dir>/admin.token, mode 0600). Every
// reply is one JSON object on one line; errors are {"ok":false,"error":...}.
// See docs/console.md.
//
// Two halves: the gate, a protocol of dsecd's front door
// (runtime/front_door.hpp), serves a connection until its AUTH (help, quit
// and the errors before it) on the door's thread, with the door's bounds on
// connections not yet authenticated; the broker gets only connections that
// passed and runs their commands against the node.
#pragma once

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "actors/admin.hpp"
#include "runtime/front_door.hpp"

namespace dsec {

struct ConsoleOptions {
  std::string token;
  size_t max_line = 4096;        // longer lines are refused and the connection closed
  size_t max_connections = 64;   // authenticated ones; more are refused
};

struct Console {
  caf::actor broker;
  // For the front door's console listener; hands what passes to `broker`.
  std::unique_ptr<HandshakeProtocol> gate;
};

// `node`: the node or the controller whose commands it serves.
Console SpawnConsole(caf::actor_system& sys, admin_actor node, const ConsoleOptions& options);

}  // namespace dsec
