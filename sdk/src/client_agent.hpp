// The SDK's one actor: holds the connection to dsecd's entry actor,
// reconnects after a loss, and forwards calls with their timeouts. The first
// connection's outcome is final when it is a refusal (nothing listens, a
// wrong token, not a dsec port): calls waiting for it fail at once. Later
// losses are retried (dsecd restarting). Calls that
// arrive while disconnected wait (until their own deadline) for the next
// connection; calls in flight when the connection drops fail at once with
// Unavailable instead of waiting out their timeout.
#pragma once

#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "dsec/status.hpp"
#include "dsec/v1/service.pb.h"
#include "dsec/v1/types.pb.h"

namespace dsec::sdk {

// One call. The agent decides when it can be sent; `send` then issues the
// typed request from the agent to the entry actor with no CAF timeout and
// returns its message id. When the reply or error arrives, `send`'s handler
// delivers it only if `claim()` returns true (false: the agent already failed
// the call: its deadline passed, or the connection dropped). `fail` delivers
// the agent's own errors. All of them run on the agent's thread.
//
// Why no CAF timeout: CAF 0.17 does not cancel a request's timeout when the
// reply comes, so every call would leave an entry in the clock's map (600 000
// of them at 20 000 calls/s with a 30 s timeout), wake the clock thread, and
// come back as a stale message 30 s later. The agent keeps the deadlines
// itself instead, checked by its tick.
struct CallMsg {
  std::chrono::milliseconds timeout;
  // A streamed exec: its v1::ExecOutput pieces (by stream id) go to
  // on_output until the call ends.
  uint64_t stream_id = 0;
  std::function<void(const v1::ExecOutput&)> on_output;
  std::function<caf::message_id(caf::event_based_actor* self, const caf::actor& entry, std::function<bool()> claim)>
      send;
  std::function<void(const caf::error&)> fail;
  // An annotation instead of `send`: it goes to dsecd in a v1::AnnotateBatch
  // with the others issued at the same time (one message instead of one
  // each), and its answer comes in a v1::AnnotateResults, to `annotated`.
  std::shared_ptr<v1::AnnotateStepRequest> annotate;
  std::function<void(v1::StepReply&)> annotated;
  // A call to a cluster node: when the node cannot be reached, the call
  // (never sent) goes here instead of failing, to the controller, which
  // forwards it or says the node is down.
  std::function<void(CallMsg)> reroute;
};

struct AgentShared {
  std::atomic<bool> connected{false};
  std::atomic<uint64_t> connections{0};
};

// Connects through dsecd's front door (runtime/door_auth.hpp) with `token`,
// then hands the socket to CAF's BASP broker.
// `client_id` goes to dsecd in a v1::Hello first on every connection.
// `to_node`: an agent for a cluster node's address; calls it cannot send
// (the node is unreachable) go to their `reroute` at once.
caf::actor SpawnAgent(caf::actor_system& sys, std::string host, uint16_t port, std::string token,
                      std::string client_id, std::chrono::milliseconds connect_timeout, AgentShared* shared,
                      bool to_node = false);

// One connection through the door, blocking (for tools and tests that
// talk to the entry actor directly): the entry's handle, or why not.
// `service` kCluster: a controller's cluster port, `token` its secret.
Result<caf::actor> ConnectEntry(caf::actor_system& sys, const std::string& host, uint16_t port,
                                const std::string& token, std::chrono::milliseconds timeout,
                                uint8_t service = 1 /* door::kSdk */);

// The agent's own errors: a dsec Status carried in a caf::error (category
// "dsec"), and back.
caf::error ToCafError(const Status& st);
bool FromCafError(const caf::error& e, Status* out);
// Unavailable(why), for calls a lost connection or a closing client ends.
caf::error Disconnected(const std::string& why);

}  // namespace dsec::sdk

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::sdk::CallMsg)
