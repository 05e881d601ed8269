#include "actors/sdk_entry.hpp"

#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/multiplexer.hpp>

namespace dsec {

SdkDoor::SdkDoor(caf::actor_system& sys, entry_actor entry, std::string token, std::string token_hint,
                 std::function<void(int, const std::string&)> log)
    : door::TokenDoor(
          door::kSdk, std::move(token), std::move(token_hint),
          [this](UniqueFd fd, const std::string& peer) { Hand(std::move(fd), peer); }, log),
      sys_(sys),
      // Looked up here, on the thread that starts dsecd: named_broker is not
      // safe to call from the door's thread.
      basp_(sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"))),
      entry_(caf::actor_cast<caf::strong_actor_ptr>(entry)),
      sigs_(sys.message_types(entry)) {}

void SdkDoor::Hand(UniqueFd fd, const std::string&) {
  // What BASP does for a connection its doorman accepted, through the
  // message it also takes from tests: the broker adopts the socket, writes
  // the server handshake and serves `entry_` on it. Making the scribe here
  // only wraps the socket; the broker registers it with the multiplexer.
  auto scribe = sys_.middleman().backend().new_scribe(fd.Release());
  caf::anon_send(basp_, caf::publish_atom::value, std::move(scribe), port_.load(), entry_, sigs_);
}

}  // namespace dsec
