#include "tests/support/actor_node.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "actors/node/cluster_link.hpp"
#include "runtime/files.hpp"
#include "runtime/log.hpp"
#include "wire/wire.hpp"

namespace dsec::testing {

namespace {

// The registry's one kind: the fake, on the test's world and options.
class TestFakeKind : public drivers::Kind {
 public:
  explicit TestFakeKind(drivers::FakeOptions o) : o_(std::move(o)) {}
  v1::Kind kind() const override { return v1::KIND_FAKE; }
  const char* name() const override { return "fake"; }
  const drivers::KindTraits& traits() const override { return o_.traits; }
  void AddFlags(CLI::App&) override {}
  Result<std::unique_ptr<drivers::Driver>> Start(const drivers::DriverEnv& env) override {
    drivers::FakeOptions o = o_;
    o.lost = env.lost;
    return std::unique_ptr<drivers::Driver>(std::make_unique<drivers::FakeDriver>(std::move(o)));
  }

 private:
  drivers::FakeOptions o_;
};

}  // namespace

NodeOptions ActorNodeOptions::Defaults() {
  NodeOptions o;
  o.node_id = "node-test";
  o.test_hooks = true;
  // image_root: empty, a dir of the ActorNode's own (the fake needs no
  // image, but the image worker makes its root)
  o.max_restarts = 3;
  o.restart_window_s = 10;
  return o;
}

ActorNode::ActorNode(ActorNodeOptions o) : o_(std::move(o)) {
  // The actors' lines only when asked ($DSEC_TEST_LOG=info): a test says what failed.
  static const bool logging = [] {
    const char* level = std::getenv("DSEC_TEST_LOG");
    return InitLogging(LogOptions{level ? level : "error", ""}).empty();
  }();
  (void)logging;
  char tmpl[] = "/tmp/dsec-actortest-XXXXXX";
  if (::mkdtemp(tmpl)) dir_ = tmpl;
  else ADD_FAILURE() << "mkdtemp " << tmpl << ": " << std::strerror(errno);
  if (o_.node.image_root.empty()) o_.node.image_root = dir_ + "/images";
  world_ = o_.fake.world ? o_.fake.world : std::make_shared<drivers::FakeWorld>();
  o_.fake.world = world_;
  mem_ = state::NewMemStore();
  faults_ = std::make_unique<state::FaultStore>(mem_.get());
  if (o_.controller) controller_mem_ = state::NewMemStore();
  Start();
}

ActorNode::~ActorNode() {
  Stop();
  if (!dir_.empty()) (void)RemoveTree(dir_);  // best effort: leak_check reports what stays
}

void ActorNode::Start(const std::function<void(drivers::FaultDriver&)>& arm) {
  ++boot_;
  committer_ = std::make_unique<state::GroupCommitter>(faults_.get());
  std::vector<std::unique_ptr<drivers::Kind>> kinds;
  kinds.push_back(std::make_unique<TestFakeKind>(o_.fake));
  kinds_ = std::make_unique<drivers::Registry>(std::move(kinds));
  ctx_ = std::make_shared<NodeContext>();
  ctx_->options = o_.node;
  ctx_->options.boot = boot_;
  ctx_->store = faults_.get();
  ctx_->committer = committer_.get();
  ctx_->log = Logger("node");
  drivers::DriverEnv env;
  env.data_dir = dir_;
  // A box that vanished goes to the node of this start (a driver thread
  // calls it; the sink outlives both, and is emptied by Stop).
  env.lost = [sink = lost_](const std::string& id, const std::string& why) {
    std::lock_guard<std::mutex> lk(sink->mu);
    if (sink->node) caf::anon_send(sink->node, lost_atom::value, id, why);
  };
  kinds_->StartAll(env, [](const std::string& why) { ADD_FAILURE() << "the fake kind did not start: " << why; });
  kinds_->WrapForFaults();
  if (arm) arm(driver_faults());
  ctx_->kinds = kinds_.get();
  cfg_ = std::make_unique<caf::actor_system_config>();
  CafOptions co;
  ConfigureCaf(*cfg_, co);
  sys_ = std::make_unique<caf::actor_system>(*cfg_);
  trainer_ = std::make_unique<caf::scoped_actor>(*sys_);
  node_ = SpawnNode(*sys_, ctx_);
  {
    std::lock_guard<std::mutex> lk(lost_->mu);
    lost_->node = node_;
  }
  // The restore is done before the node's first answer.
  (*trainer_)
      ->request(node_, std::chrono::seconds(30), admin_atom::value, std::string("status"), std::vector<std::string>{})
      .receive([](const std::string&) {}, [](caf::error& e) { ADD_FAILURE() << "the node did not answer: " << to_string(e); });
  entry_ = caf::actor_cast<entry_actor>(node_);
  if (!o_.controller) return;
  controller_committer_ = std::make_unique<state::GroupCommitter>(controller_mem_.get());
  auto cctx = std::make_shared<ControllerContext>();
  cctx->id = o_.node.node_id;
  cctx->store = controller_mem_.get();
  cctx->committer = controller_committer_.get();
  cctx->log = Logger("controller");
  controller_ = SpawnController(*sys_, cctx);
  auto joined = std::make_shared<std::promise<void>>();
  auto once = std::make_shared<std::once_flag>();
  LinkOptions lo;
  lo.in_process = caf::actor_cast<caf::actor>(controller_);
  lo.on_joined = [joined, once] { std::call_once(*once, [&] { joined->set_value(); }); };
  link_ = SpawnClusterLink(*sys_, node_, ctx_, std::move(lo));
  if (joined->get_future().wait_for(std::chrono::seconds(10)) != std::future_status::ready)
    ADD_FAILURE() << "the node did not join the controller in this process";
  entry_ = caf::actor_cast<entry_actor>(controller_);
}

void ActorNode::Stop() {
  if (!sys_) return;
  {
    std::lock_guard<std::mutex> lk(lost_->mu);
    lost_->node = nullptr;
  }
  if (link_) caf::anon_send_exit(link_, caf::exit_reason::user_shutdown);
  if (controller_) caf::anon_send_exit(controller_, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(node_, caf::exit_reason::user_shutdown);
  kinds_->StopAll();
  trainer_.reset();
  link_ = nullptr;
  controller_ = nullptr;
  node_ = nullptr;
  entry_ = nullptr;
  sys_.reset();  // waits for every actor
  cfg_.reset();
  kinds_->Release();
  kinds_.reset();
  if (controller_committer_) controller_committer_->Stop();
  committer_->Stop();
}

void ActorNode::Restart(std::function<void(drivers::FaultDriver&)> arm) {
  Stop();
  Start(arm);
}

drivers::FaultDriver& ActorNode::driver_faults() { return **kinds_->Faults("fake"); }

v1::SandboxSpec ActorNode::Fake() {
  v1::SandboxSpec spec;
  spec.set_kind(v1::KIND_FAKE);
  return spec;
}

Result<v1::SandboxRecord> ActorNode::Create(v1::SandboxSpec spec, const std::string& id) {
  v1::CreateRequest req;
  *req.mutable_spec() = std::move(spec);
  req.set_id(id);
  auto r = Call(std::move(req));
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_sandbox());
}

Result<v1::ExecResult> ActorNode::Exec(const std::string& id, const std::string& script, v1::Limits limits) {
  v1::ExecRequest req;
  req.set_sandbox_id(id);
  for (const char* a : {"sh", "-c"}) req.add_argv(a);
  req.add_argv(script);
  *req.mutable_limits() = std::move(limits);
  auto r = Call(std::move(req));
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_result());
}

Result<v1::SandboxRecord> ActorNode::Get(const std::string& id) {
  v1::GetSandboxRequest req;
  req.set_sandbox_id(id);
  auto r = Call(std::move(req));
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_sandbox());
}

v1::StepRequest ActorNode::StepOf(const std::string& session, uint64_t index, const std::string& script,
                                  const std::string& role) {
  v1::StepRequest req;
  req.set_session(session);
  req.set_index(index);
  req.set_sandbox(role);
  for (const char* a : {"sh", "-c"}) req.mutable_exec()->add_argv(a);
  req.mutable_exec()->add_argv(script);
  return req;
}

Result<v1::StepReply> ActorNode::Step(const std::string& session, uint64_t index, const std::string& script,
                                      const std::string& role) {
  return Call(StepOf(session, index, script, role));
}

Result<v1::SessionRecord> ActorNode::GetSession(const std::string& name) {
  v1::GetSessionRequest req;
  req.set_name(name);
  auto r = Call(std::move(req));
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_session());
}

nlohmann::json ActorNode::Admin(const std::string& line) {
  std::vector<std::string> words;
  std::string w;
  for (char c : line + " ") {
    if (c != ' ') w += c;
    else if (!w.empty()) words.push_back(std::move(w)), w.clear();
  }
  std::string cmd = words.empty() ? "" : words[0];
  words.erase(words.begin());
  nlohmann::json out;
  caf::actor to = o_.controller ? caf::actor_cast<caf::actor>(controller_) : caf::actor_cast<caf::actor>(node_);
  (*trainer_)
      ->request(to, std::chrono::seconds(10), admin_atom::value, cmd, words)
      .receive([&](const std::string& j) { out = nlohmann::json::parse(j, nullptr, false); },
               [&](caf::error& e) { out = {{"ok", false}, {"error", to_string(e)}}; });
  return out;
}

bool ActorNode::WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling an asynchronous end, bounded
  }
  return done();
}

}  // namespace dsec::testing
