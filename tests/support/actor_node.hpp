// A node in the test's own process, on the fake kind: a real actor system,
// the node actor over a MemStore (behind a FaultStore, for store faults),
// its group committer, and a registry with the fake kind alone (wrapped in
// a FaultDriver, for driver faults). Calls go to the node's entry as a
// trainer's would, from the harness's own trainer actor. Restart() is what
// a dsecd restart keeps: the store and the fake world; the actors, the
// committer and the driver are made anew. With `controller`, a controller
// stands in front of the node, joined in-process as in role all.
//
// No root, no processes, no sockets: a test of the actors' logic runs in
// milliseconds (tests/unit/actors/).
#pragma once

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/controller/controller.hpp"
#include "actors/node/context.hpp"
#include "actors/node/node.hpp"
#include "drivers/fake/fake_driver.hpp"
#include "drivers/registry.hpp"
#include "dsec/status_proto.hpp"
#include "state/fault_store.hpp"
#include "state/group_commit.hpp"
#include "state/store.hpp"

namespace dsec::testing {

struct ActorNodeOptions {
  NodeOptions node = Defaults();
  drivers::FakeOptions fake;  // its world is kept across Restart
  bool controller = false;  // a controller in front, in this process (role all)
  static NodeOptions Defaults();
};

class ActorNode {
 public:
  explicit ActorNode(ActorNodeOptions o = {});
  ~ActorNode();
  ActorNode(const ActorNode&) = delete;
  ActorNode& operator=(const ActorNode&) = delete;

  // A request to the entry (the controller's, with `controller`), from the
  // harness's trainer actor; the reply's status as a Status, the reply as
  // the value. A CAF error (no answer in time) is Unavailable naming it.
  template <class Req>
  Result<calls::ReplyOf<Req>> Call(Req req, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    return Ask(*trainer_, entry_, std::move(req), timeout);
  }
  // The same from an actor of the caller's (another trainer, a client
  // whose connection the test ends).
  template <class Req>
  Result<calls::ReplyOf<Req>> CallAs(caf::scoped_actor& as, Req req,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    return Ask(as, entry_, std::move(req), timeout);
  }
  // The same to the node itself, past a controller in front of it.
  template <class Req>
  Result<calls::ReplyOf<Req>> CallNode(Req req, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    return Ask(*trainer_, caf::actor_cast<entry_actor>(node_), std::move(req), timeout);
  }

  // Conveniences over Call.
  Result<v1::SandboxRecord> Create(v1::SandboxSpec spec, const std::string& id = "");
  Result<v1::ExecResult> Exec(const std::string& id, const std::string& script, v1::Limits limits = {});
  Result<v1::SandboxRecord> Get(const std::string& id);
  // Session `session`'s step `index`: `script` under sh -c, in sandbox role
  // `role` ("": the agent's).
  static v1::StepRequest StepOf(const std::string& session, uint64_t index, const std::string& script,
                                const std::string& role = "");
  Result<v1::StepReply> Step(const std::string& session, uint64_t index, const std::string& script,
                             const std::string& role = "");
  Result<v1::SessionRecord> GetSession(const std::string& name);
  // A console command's reply (one JSON object).
  nlohmann::json Admin(const std::string& line);
  // A spec of the fake kind (its `traits` as ActorNodeOptions::fake says).
  static v1::SandboxSpec Fake();

  // A dsecd restart: the actors, the committer and the driver go (the
  // sandboxes' runs and jobs with them); the store and the fake world stay,
  // and a new node restores from them (and, with `controller`, a new
  // controller it joins). `arm` gets the new driver's faults before the
  // restore (to hold or fail its re-adoptions).
  void Restart(std::function<void(drivers::FaultDriver&)> arm = nullptr);

  caf::actor_system& sys() { return *sys_; }
  caf::scoped_actor& trainer() { return *trainer_; }
  state::FaultStore& store_faults() { return *faults_; }
  drivers::FaultDriver& driver_faults();
  const std::shared_ptr<drivers::FakeWorld>& world() const { return world_; }
  NodeContext& ctx() { return *ctx_; }
  state::Store* store() { return faults_.get(); }
  node_actor node() const { return node_; }
  entry_actor entry() const { return entry_; }                        // the controller's, with `controller`
  state::Store* controller_store() { return controller_mem_.get(); }  // null without `controller`
  // Waits (polling the node, at most `timeout`) until `done()` holds.
  bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  void Start(const std::function<void(drivers::FaultDriver&)>& arm = nullptr);
  void Stop();
  template <class Req>
  Result<calls::ReplyOf<Req>> Ask(caf::scoped_actor& as, const entry_actor& to, Req req,
                                  std::chrono::milliseconds timeout) {
    Result<calls::ReplyOf<Req>> out = Status::Unavailable("no answer");
    as->request(to, timeout, std::move(req))
        .receive(
            [&](calls::ReplyOf<Req>& r) {
              if (r.status().code() != v1::Status::OK) out = FromProto(r.status());
              else out = std::move(r);
            },
            [&](caf::error& e) { out = Status::Unavailable("no answer: " + sys_->render(e)); });
    return out;
  }

  ActorNodeOptions o_;
  std::string dir_;  // /tmp/dsec-actortest-*: the image root, removed with the node (not dsec-test-*: leak_check may run meanwhile)
  std::shared_ptr<drivers::FakeWorld> world_;
  std::unique_ptr<state::Store> mem_;
  std::unique_ptr<state::FaultStore> faults_;
  std::unique_ptr<state::Store> controller_mem_;
  std::unique_ptr<state::GroupCommitter> committer_, controller_committer_;
  std::unique_ptr<drivers::Registry> kinds_;
  std::shared_ptr<NodeContext> ctx_;
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::unique_ptr<caf::scoped_actor> trainer_;
  node_actor node_;
  controller_actor controller_;
  caf::actor link_;
  entry_actor entry_;
  uint64_t boot_ = 0;
  struct LostSink {
    std::mutex mu;
    node_actor node;
  };
  std::shared_ptr<LostSink> lost_ = std::make_shared<LostSink>();
};

}  // namespace dsec::testing
