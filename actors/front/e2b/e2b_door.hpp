// The E2B-compatible door (DESIGN.md section 15; docs/e2b.md): E2B's
// control-plane REST API on an HTTP server of its own (dsecd --e2b), so the
// unmodified `e2b` SDK drives dsec with E2B_API_URL and E2B_API_KEY. Each
// request is checked for an API key (api_keys.hpp; 401 in E2B's error
// shape before anything else) and turned into calls of the table
// (wire/calls.hpp) to the entry actor, as the SDK's would be: in a cluster
// the controller's entry routes each sandbox's calls to its node. Handlers
// never block: one actor of the door's own asks the entry and answers.
// E2B's error bodies are {"code": <HTTP status>, "message"}.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "actors/front/e2b/api_keys.hpp"
#include "runtime/http_server.hpp"
#include "wire/wire.hpp"

namespace dsec::e2b {

// The envd version the door reports (docs/e2b.md says which features it
// switches on in the SDK, and why this one).
inline constexpr const char* kEnvdVersion = "0.6.3";

class E2bDoor {
 public:
  // Adds the routes to `server` (before its Start); `server` and `keys`
  // outlive this. `secret` keys each sandbox's envd access token (an HMAC
  // of its id: nothing stored). `internet_open`: what E2B's internet
  // access is here (dsecd --network-open: mode open; else none).
  E2bDoor(caf::actor_system& sys, entry_actor entry, const ApiKeys& keys, std::string secret, HttpServer& server,
          bool internet_open);
  ~E2bDoor();  // Stop()
  E2bDoor(const E2bDoor&) = delete;
  E2bDoor& operator=(const E2bDoor&) = delete;
  // Ends the door's actor. Call after the server has stopped.
  void Stop();

 private:
  caf::actor actor_;
};

}  // namespace dsec::e2b
