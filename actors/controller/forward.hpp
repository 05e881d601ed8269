// Internal to the controller: how a call reaches the node that holds what
// it names (a sandbox, a session), with an error naming the node when it
// cannot; and what a reply gets on the way back (the node's address).
#pragma once

#include <type_traits>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "actors/controller/state.hpp"
#include "actors/error_reply.hpp"
#include "actors/node/node.hpp"

namespace dsec::controller_detail {

// Ends call `call` to node `node`: true when it was still waiting (its
// answer is to be delivered), false when it was failed already.
bool Settle(Self self, const std::string& node, uint64_t call);

// How long a forwarded exec may take: its own limit and a margin.
std::chrono::milliseconds ExecTimeout(const v1::ExecRequest& req);
inline constexpr std::chrono::milliseconds kCallTimeout{std::chrono::minutes(5)};

// The SDK address of node `node`, or null when it is not known.
const std::string* SdkAddress(Self self, const std::string& node);

// The node in this process (role all) when it is up and `node` is it (or
// `node` is empty): calls for it are delegated, so the trainer stays their
// sender. The node then tracks its owner Hello, its session leases and
// its streamed output as it would without a controller, and answers with
// its own errors. Null otherwise.
node_actor InProcess(Self self, const std::string& node = "");

// What a reply from node `node` gets on its way to the trainer: where the
// sandbox or session is (its node's SDK address; none for a restartable
// session, whose steps come here).
void Decorate(Self self, const std::string& node, v1::SandboxReply* r);
void Decorate(Self self, const std::string& node, v1::SessionReply* r);

// Sends `req` to node `node` and hands its reply to `done` (exactly once):
// the node's answer, or an error naming the node.
template <class Reply, class Request>
void Forward(Self self, const std::string& node, const std::string& what, Request req,
             std::chrono::milliseconds timeout, std::function<void(Reply)> done) {
  auto it = self->state.nodes.find(node);
  if (it == self->state.nodes.end() || !it->second.up()) return done(ErrorReply<Reply>(NodeGone(self, node, what)));
  uint64_t call = ++self->state.next_call;
  auto shared = std::make_shared<std::function<void(Reply)>>(std::move(done));
  it->second.waiting[call] = [shared](const Status& s) { (*shared)(ErrorReply<Reply>(s)); };
  self->request(it->second.entry, timeout, std::move(req))
      .then(
          [self, node, call, shared](Reply& r) {
            if (Settle(self, node, call)) (*shared)(std::move(r));
          },
          [self, node, call, shared, what](caf::error& e) {
            if (Settle(self, node, call))
              (*shared)(ErrorReply<Reply>(
                  Status::Unavailable("node " + node + " did not answer for " + what + ": " + caf::to_string(e))));
          });
}

template <class Reply>
void Decorate(Self, const std::string&, Reply*) {}

// Calls whose answer comes in pieces to their sender before the reply (a
// streamed exec's output, a watch's events): delegated to the node, so the
// pieces reach the caller (the E2B door's streams through a controller).
template <class R>
constexpr bool kMayStream = std::is_same_v<R, v1::ExecRequest> || std::is_same_v<R, v1::WatchRequest>;
inline bool Streams(const v1::ExecRequest& r) { return r.stream(); }
inline bool Streams(const v1::WatchRequest&) { return true; }

// A call naming a sandbox or session (`what` and `key`, found in `dir`):
// to the node that holds it.
template <class Reply, class Request>
caf::result<Reply> ToHolder(Self self, const std::unordered_map<std::string, std::string>& dir, const std::string& what,
                            const std::string& key, Request& req, std::chrono::milliseconds timeout) {
  auto it = dir.find(key);
  // The node in this process answers for what the directory has not yet
  // heard of from its heartbeat.
  if (auto local = InProcess(self, it == dir.end() ? "" : it->second)) return self->delegate(local, std::move(req));
  if (it == dir.end())
    return ErrorReply<Reply>(Status::NotFound("no " + what + " '" + key + "' in this cluster (dsecctl " +
                                              (what == "session" ? "sessions" : "ls") + " lists them)"));
  std::string node = it->second;
  if constexpr (kMayStream<Request>) {
    if (Streams(req)) {  // a node that goes down meanwhile: the caller's own timeout ends it
      auto n = self->state.nodes.find(node);
      if (n == self->state.nodes.end() || !n->second.up())
        return ErrorReply<Reply>(NodeGone(self, node, what + " " + key));
      return self->delegate(caf::actor_cast<entry_actor>(n->second.entry), std::move(req));
    }
  }
  auto rp = self->template make_response_promise<Reply>();
  Forward<Reply>(self, node, what + " " + key, std::move(req), timeout, [self, rp, node](Reply r) mutable {
    Decorate(self, node, &r);
    rp.deliver(std::move(r));
  });
  return rp;
}

template <class Reply, class Request>
caf::result<Reply> ToSandboxNode(Self self, const std::string& id, Request& req,
                                 std::chrono::milliseconds timeout = kCallTimeout) {
  return ToHolder<Reply>(self, self->state.sandbox_node, "sandbox", id, req, timeout);
}

template <class Reply, class Request>
caf::result<Reply> ToSessionNode(Self self, const std::string& name, Request& req,
                                 std::chrono::milliseconds timeout = kCallTimeout) {
  // A restartable session whose node died: on its way to another node, or stopped.
  if (auto r = self->state.restartable.find(name); r != self->state.restartable.end()) {
    if (!r->second.restarting_on.empty())
      return ErrorReply<Reply>(Status::Unavailable("session " + name + " is being restarted on node " +
                                                   r->second.restarting_on +
                                                   " (its node went down); call again in a moment"));
    if (!r->second.failed.empty())
      return ErrorReply<Reply>(Status::FailedPrecondition("session " + name + " " + r->second.failed));
  }
  return ToHolder<Reply>(self, self->state.session_node, "session", name, req, timeout);
}

// Image calls to a controller without a registry of its own (role all):
// the in-process node's registry answers them.
template <class Reply, class Request>
caf::result<Reply> NoRegistry(Self self, Request& req) {
  if (auto local = InProcess(self)) return self->delegate(local, std::move(req));
  return ErrorReply<Reply>(Status::Unimplemented("no image registry here"));
}

}  // namespace dsec::controller_detail
