// Internal to the C++ SDK (client.cpp, handles.cpp): the client's
// state and how a call reaches dsecd (its agent, a node's route), and the
// helpers that turn callback forms into blocking ones.
#pragma once

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dsec/client.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/front_door.hpp"
#include "sdk/src/client_agent.hpp"
#include "wire/wire.hpp"

namespace dsec {

struct Client::Impl {
  ClientOptions options;
  std::string client_id;  // owner of the sandboxes this client makes
  std::string host;
  uint16_t port = 0;
  sdk::AgentShared shared;
  std::atomic<uint64_t> next_stream{1};
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor agent;
  // In a cluster: an agent per node address the controller named (the
  // SDK talks to the node that holds a sandbox or session directly).
  struct Route {
    caf::actor agent;
    std::unique_ptr<sdk::AgentShared> shared;
  };
  std::mutex routes_mu;
  std::unordered_map<std::string, Route> routes;

  ~Impl() {
    // The agents answer everything still pending (Unavailable) and quit;
    // the actor system's destructor waits for that.
    {
      std::lock_guard<std::mutex> lk(routes_mu);
      for (auto& [addr, r] : routes) caf::anon_send(r.agent, caf::close_atom::value);
    }
    if (agent) caf::anon_send(agent, caf::close_atom::value);
    agent = nullptr;
    sys.reset();
  }

  // The agent for calls routed to `route` (a node's SDK address): the
  // client's own for "" or the address it dialed.
  caf::actor AgentFor(const std::string& route) {
    if (route.empty() || route == options.address) return agent;
    std::lock_guard<std::mutex> lk(routes_mu);
    auto it = routes.find(route);
    if (it != routes.end()) return it->second.agent;
    std::string h;
    uint16_t p = 0;
    if (!SplitHostPort(route, &h, &p) || p == 0) return agent;  // not an address: the controller answers
    Route r;
    r.shared = std::make_unique<sdk::AgentShared>();
    r.agent = sdk::SpawnAgent(*sys, h, p, options.token, client_id, options.connect_timeout, r.shared.get(),
                              /*to_node=*/true);
    auto a = r.agent;
    routes.emplace(route, std::move(r));
    return a;
  }

  // Sends `call` to the agent for `route`; one a node's agent cannot send
  // goes to the client's own agent (the controller) instead.
  void Send(const std::string& route, sdk::CallMsg call) {
    caf::actor to = AgentFor(route);
    if (to != agent) call.reroute = [main = agent](sdk::CallMsg c) { caf::anon_send(main, std::move(c)); };
    caf::anon_send(to, std::move(call));
  }

  Status ToStatus(const caf::error& e, std::chrono::milliseconds timeout) const {
    std::string where = host + ":" + std::to_string(port);
    if (Status own; sdk::FromCafError(e, &own)) return own;
    if (e == caf::sec::request_timeout)
      return Status::DeadlineExceeded("no reply from dsecd at " + where + " within " +
                                      std::to_string(timeout.count()) + " ms");
    if (e.category() == caf::atom("system") &&
        static_cast<caf::sec>(e.code()) == caf::sec::request_receiver_down &&
        e.context().match_elements<std::string>())
      return Status::Unavailable(e.context().get_as<std::string>(0));
    if (e == caf::sec::unexpected_message)
      return Status::Internal("dsecd at " + where + " did not understand the request (version mismatch?)");
    return Status::Unavailable("dsecd at " + where + ": " + caf::to_string(e));
  }

  // A reply as the caller sees it: its status as an error, else the reply.
  template <class Reply>
  static void Deliver(const std::function<void(Result<Reply>)>& done, Reply& r) {
    if (r.status().code() != v1::Status::OK) return done(FromProto(r.status()));
    done(std::move(r));
  }

  // With `on_output`, v1::ExecOutput messages for req.stream_id() go there
  // until the reply arrives.
  template <class Reply, class Request>
  void Call(Request req, std::chrono::milliseconds timeout, std::function<void(Result<Reply>)> done,
            std::function<void(const v1::ExecOutput&)> on_output = nullptr) {
    CallVia<Reply>("", std::move(req), timeout, std::move(done), std::move(on_output));
  }

  // The same, to the node at `route` (see AgentFor).
  template <class Reply, class Request>
  void CallVia(const std::string& route, Request req, std::chrono::milliseconds timeout,
               std::function<void(Result<Reply>)> done, std::function<void(const v1::ExecOutput&)> on_output = nullptr) {
    auto shared_done = std::make_shared<std::function<void(Result<Reply>)>>(std::move(done));
    sdk::CallMsg call;
    call.timeout = timeout;
    if constexpr (std::is_same<Request, v1::ExecRequest>::value || std::is_same<Request, v1::WatchRequest>::value)
      call.stream_id = req.stream_id();
    call.on_output = std::move(on_output);
    call.fail = [this, timeout, shared_done](const caf::error& e) { (*shared_done)(ToStatus(e, timeout)); };
    // Called once: the request moves into the message.
    call.send = [this, timeout, shared_done, req = std::move(req)](
                    caf::event_based_actor* self, const caf::actor& entry, std::function<bool()> claim) mutable {
      auto handle = self->request(entry, caf::infinite, std::move(req));
      handle.then(
              [shared_done, claim](Reply& r) {
                if (claim()) Deliver(*shared_done, r);
              },
              [this, timeout, shared_done, claim](caf::error& e) {
                if (claim()) (*shared_done)(ToStatus(e, timeout));
              });
      return handle.id();
    };
    Send(route, std::move(call));
  }

  // An annotation: batched with the others issued at the same time (see
  // CallMsg::annotate).
  void Annotate(const std::string& route, v1::AnnotateStepRequest req,
                std::function<void(Result<v1::StepReply>)> done) {
    auto timeout = options.rpc_timeout;
    auto shared_done = std::make_shared<std::function<void(Result<v1::StepReply>)>>(std::move(done));
    sdk::CallMsg call;
    call.timeout = timeout;
    call.fail = [this, timeout, shared_done](const caf::error& e) { (*shared_done)(ToStatus(e, timeout)); };
    call.annotate = std::make_shared<v1::AnnotateStepRequest>(std::move(req));
    call.annotated = [shared_done](v1::StepReply& r) { Deliver(*shared_done, r); };
    Send(route, std::move(call));
  }

  template <class Reply, class Request>
  Result<Reply> CallSync(Request req, std::chrono::milliseconds timeout) {
    std::promise<Result<Reply>> p;
    auto f = p.get_future();
    Call<Reply>(std::move(req), timeout, [&p](Result<Reply> r) { p.set_value(std::move(r)); });
    return f.get();
  }

  // Runs wait for their own time limit, plus the RPC margin.
  std::chrono::milliseconds ExecTimeout(const v1::SandboxSpec& spec, const v1::ExecRequest& exec) const {
    // Attached to a running process: as long as it runs, unless limited.
    if (exec.attach_pid() && !exec.limits().timeout_ms()) return std::chrono::hours(24 * 365);
    uint32_t limit = exec.limits().timeout_ms() ? exec.limits().timeout_ms()
                     : spec.limits().timeout_ms() ? spec.limits().timeout_ms()
                                                  : 30'000;
    return std::chrono::milliseconds(limit) + options.rpc_timeout;
  }
};

// The synchronous form of a callback form: `start(done)`, waited for.

template <class T, class Start>
Result<T> Wait(Start&& start) {
  std::promise<Result<T>> p;
  auto f = p.get_future();
  start([&p](Result<T> r) { p.set_value(std::move(r)); });
  return f.get();
}

template <class Start>
Status WaitStatus(Start&& start) {
  std::promise<Status> p;
  auto f = p.get_future();
  start([&p](Status s) { p.set_value(std::move(s)); });
  return f.get();
}

// A reply's `pick(reply)` to `done`, or its error.
template <class Reply, class T, class Pick>
Done<Reply> Then(Done<T> done, Pick pick) {
  return [done = std::move(done), pick = std::move(pick)](Result<Reply> r) {
    if (!r.ok()) return done(r.status());
    done(pick(*r));
  };
}

template <class Reply>
Done<Reply> StatusOnly(DoneStatus done) {
  return [done = std::move(done)](Result<Reply> r) { done(r.status()); };
}

}  // namespace dsec
