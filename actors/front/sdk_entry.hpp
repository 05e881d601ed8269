// The SDK entry behind the front door (runtime/front_door.hpp): a
// connection that passed the door's token handshake (runtime/door_auth.hpp)
// is handed to CAF's BASP broker as if BASP's own doorman had accepted it,
// with the entry actor published on it. BASP never sees a byte of a peer
// that did not prove it holds the SDK token.
#pragma once

#include <caf/all.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "wire/wire.hpp"
#include "runtime/door_auth.hpp"

namespace dsec {

// The door protocol for FrontDoor. Build it with the actor system up
// (it looks up BASP's broker once); `set_port` once the door is bound.
class SdkDoor : public door::TokenDoor {
 public:
  SdkDoor(caf::actor_system& sys, entry_actor entry, std::string token, std::string token_hint,
          std::function<void(int, const std::string&)> log);
  // Any door of this kind: `served` is published on every admitted
  // connection with the interface `sigs` (the cluster port serves the
  // controller to nodes that hold the cluster secret).
  SdkDoor(caf::actor_system& sys, door::Service service, caf::strong_actor_ptr served, std::set<std::string> sigs,
          std::string token, std::string token_hint, std::function<void(int, const std::string&)> log);
  void set_port(uint16_t port) { port_ = port; }
  // dsecd --tls: admitted connections become TLS sessions (wire/tls.hpp).
  void set_tls(bool on) { set_flags(on ? door::kFlagTls : 0); }

 private:
  void Hand(UniqueFd fd, const std::string& peer);
  caf::actor_system& sys_;
  caf::actor basp_;
  caf::strong_actor_ptr entry_;
  std::set<std::string> sigs_;
  std::atomic<uint16_t> port_{0};
  std::function<void(int, const std::string&)> log_;
};

}  // namespace dsec
