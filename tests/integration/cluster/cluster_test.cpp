// The cluster with real processes: one dsecd --role controller and three
// dsecd --role node that join it over CAF (through the cluster door), each
// with the container image built into it. Trainers talk to the controller
// only; sandboxes land on nodes in proportion to their slots, and their
// calls go to the node that holds them. A node killed with -9 is marked
// down within 5 s and its sandboxes are reported lost, naming it; it
// rejoins and is reconciled. A controller killed with -9 comes back on its
// data dir with every sandbox reachable. A node with the wrong secret is
// refused and logged.
#include <gmock/gmock.h>

#include <chrono>
#include <map>
#include <thread>

#include "harness/daemon.hpp"
#include "runtime/files.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr int kNodes = 3;
const uint64_t kSlots[kNodes] = {100, 200, 300};

// Polls `pred` (an admin query, a file) every 50 ms until it holds or
// `timeout` passes: the condition is another process's state.
template <class Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

class Cluster : public ::testing::Test {
 protected:
  static TestDaemonOptions NodeOptions(uint64_t slots, const std::string& secret_file) {
    TestDaemonOptions o;
    o.extra_args = {"--role", "node", "--join", controller_->cluster_addr(), "--cluster-secret", secret_file,
                    "--slots", std::to_string(slots)};
    return o;
  }

  static void SetUpTestSuite() {
    if (auto gap = ContainerHostGap(); !gap.empty()) {
      skip_ = "container sandboxes unavailable on this host: " + gap;
      return;
    }
    TestDaemonOptions co;
    co.role = "controller";
    auto c = TestDaemon::Start(co);
    if (!c.ok()) return Fail("the controller did not start: " + c.status().ToString());
    controller_ = std::move(*c);
    char tmpl[] = "/tmp/dsec-test-rootfs-XXXXXX";
    if (!::mkdtemp(tmpl)) return Fail("mkdtemp");
    std::string rootfs = tmpl;
    Status made = MakeRootfs(rootfs);
    for (int i = 0; i < kNodes && made.ok(); ++i) {
      auto n = TestDaemon::Start(NodeOptions(kSlots[i], controller_->data_dir() + "/cluster.secret"));
      if (!n.ok()) {
        made = n.status();
        break;
      }
      auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", (*n)->data_dir(), "build", rootfs,
                               ContainerTest::kImage});
      if (built.exit_code != 0) made = Status::Internal("dsec-image build on node " + std::to_string(i) + ": " + built.err);
      nodes_[i] = std::move(*n);
    }
    RunProcess({"/bin/rm", "-rf", rootfs});
    if (made.code() == Status::Code::kFailedPrecondition) {
      skip_ = "cannot make the test rootfs on this host: " + made.ToString();
      return;
    }
    if (!made.ok()) return Fail(made.ToString());
    for (int i = 0; i < kNodes; ++i) ids_[i] = nodes_[i]->Admin("status").value("node", "");
    // Joined, each with its image in its heartbeat.
    if (!WaitUntil([] { return UpWithImage() == kNodes; }, std::chrono::seconds(20)))
      return Fail("the nodes did not all join with their image: " + controller_->Admin("nodes").dump());
    ClientOptions o;
    o.address = controller_->sdk_addr();
    o.data_dir = controller_->data_dir();
    auto cl = Client::Connect(o);
    if (!cl.ok()) return Fail("SDK cannot connect to the controller: " + cl.status().ToString());
    client_ = std::move(*cl);
  }
  static void TearDownTestSuite() {
    client_.reset();
    for (auto& n : nodes_) n.reset();
    controller_.reset();
  }
  static void Fail(const std::string& why) { failure_ = why; }

  void SetUp() override {
    ASSERT_TRUE(failure_.empty()) << failure_;
    if (!client_) GTEST_SKIP() << skip_;
  }

  // Nodes up (not draining) whose heartbeat lists the tools image.
  static int UpWithImage() {
    int n = 0;
    for (const auto& node : controller_->Admin("nodes").value("nodes", nlohmann::json::array())) {
      bool image = false;
      for (const auto& i : node["load"].value("images", nlohmann::json::array()))
        image = image || i.get<std::string>().rfind(std::string(ContainerTest::kImage) + "@", 0) == 0;
      n += node.value("state", "") == "up" && image;
    }
    return n;
  }
  static std::string NodeState(const std::string& id) {
    for (const auto& node : controller_->Admin("nodes").value("nodes", nlohmann::json::array()))
      if (node.value("id", "") == id) return node.value("state", "");
    return "";
  }
  static int IndexOf(const std::string& node_id) {
    for (int i = 0; i < kNodes; ++i)
      if (ids_[i] == node_id) return i;
    return -1;
  }
  static uint64_t Admitted(const TestDaemon& d) {
    return d.Admin("stats")["sdk_door"].value("admitted", uint64_t{0});
  }

  static inline std::unique_ptr<TestDaemon> controller_;
  static inline std::unique_ptr<TestDaemon> nodes_[kNodes];
  static inline std::string ids_[kNodes];
  static inline std::unique_ptr<Client> client_;
  static inline std::string skip_, failure_;
};

TEST_F(Cluster, ContainersLandOnEveryNodeInProportionToItsSlotsAndAnswerFromThere) {
  uint64_t admitted_before[kNodes];
  for (int i = 0; i < kNodes; ++i) admitted_before[i] = Admitted(*nodes_[i]);
  constexpr int kCount = 60;
  std::vector<Sandbox> made;
  std::map<std::string, int> per_node;
  for (int i = 0; i < kCount; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    auto rec = sb->Get();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    per_node[rec->node_id()]++;
    EXPECT_EQ(rec->node_address(), nodes_[IndexOf(rec->node_id())]->sdk_addr());
    made.push_back(*sb);
  }
  // 100 : 200 : 300 slots -> 10 : 20 : 30 of 60 (within one heartbeat's slack).
  for (int i = 0; i < kNodes; ++i)
    EXPECT_NEAR(per_node[ids_[i]], kCount * kSlots[i] / 600.0, 2) << "node " << ids_[i];
  for (const auto& sb : made) {
    auto r = sb.Exec(Command({"/bin/sh", "-c", "echo in-$0", sb.id()}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stdout(), "in-" + sb.id() + "\n");
  }
  // The SDK went to each node itself (the controller is not on the data path).
  for (int i = 0; i < kNodes; ++i) EXPECT_GT(Admitted(*nodes_[i]), admitted_before[i]) << "node " << ids_[i];
  // The controller lists them all, each with its node; --node narrows it.
  auto ls = controller_->Admin("ls --kind container --state running");
  ASSERT_TRUE(ls.value("ok", false)) << ls.dump();
  EXPECT_GE(ls["sandboxes"].size(), static_cast<size_t>(kCount));
  auto one = controller_->Admin("ls --node " + ids_[1]);
  for (const auto& row : one["sandboxes"]) EXPECT_EQ(row.value("node", ""), ids_[1]);
  EXPECT_GE(one["sandboxes"].size(), static_cast<size_t>(per_node[ids_[1]]));
  auto inspect = controller_->Admin("inspect " + made[0].id());
  EXPECT_TRUE(inspect.value("ok", false)) << inspect.dump();
  EXPECT_EQ(inspect["sandbox"].value("id", ""), made[0].id());
  for (const auto& sb : made) EXPECT_TRUE(sb.Destroy().ok());
}

TEST_F(Cluster, ASessionsStepsRunOnItsNodeAndTheLogIsThere) {
  std::string name = "cluster-" + std::to_string(::getpid());
  auto s = client_->OpenSession(name, ContainerSpec(ContainerTest::kImage));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  int at = IndexOf(s->record().node_id());
  ASSERT_GE(at, 0) << "the session names no node of the cluster: " << s->record().node_id();
  EXPECT_EQ(s->record().node_address(), nodes_[at]->sdk_addr());
  for (uint64_t i = 0; i < 3; ++i) {
    auto step = s->Step(i, Command({"/bin/sh", "-c", "echo step $0 >> /tmp/log; cat /tmp/log", std::to_string(i)}));
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_THAT(step->step().result().stdout(), HasSubstr("step " + std::to_string(i)));
  }
  // The node holds the session and its log; the controller lists it with its node.
  auto on_node = nodes_[at]->Admin("inspect " + name);
  EXPECT_EQ(on_node["session"].value("step_count", 0), 3) << on_node.dump();
  bool listed = false;
  auto sessions = controller_->Admin("sessions");
  for (const auto& row : sessions["sessions"])
    listed = listed || (row.value("name", "") == name && row.value("node", "") == ids_[at]);
  EXPECT_TRUE(listed) << sessions.dump();
  // Its agent sandbox is reachable by id through the controller too.
  auto agent = s->sandbox("agent");
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  auto other = client_->Attach(agent->id());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto r = other->Exec(Command({"cat", "/tmp/log"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "step 0\nstep 1\nstep 2\n");
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(Cluster, DrainStopsPlacementsAndItsSandboxesKeepWorking) {
  // One sandbox on each node first.
  std::map<std::string, Sandbox> on;
  for (int i = 0; i < 60 && on.size() < kNodes; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    auto id = sb->Get()->node_id();
    if (!on.count(id)) on.emplace(id, *sb);
    else (void)sb->Destroy();
  }
  ASSERT_EQ(on.size(), static_cast<size_t>(kNodes));
  auto drained = controller_->Ctl({"drain", ids_[2]});
  ASSERT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  EXPECT_EQ(NodeState(ids_[2]), "draining");
  std::vector<Sandbox> after;
  for (int i = 0; i < 12; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    EXPECT_NE(sb->Get()->node_id(), ids_[2]) << "placed on a draining node";
    after.push_back(*sb);
  }
  auto r = on.at(ids_[2]).Exec(Command({"true"}));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(on.at(ids_[2]).Destroy().ok());
  EXPECT_EQ(controller_->Ctl({"undrain", ids_[2]}).exit_code, 0);
  EXPECT_EQ(NodeState(ids_[2]), "up");
  for (auto& [id, sb] : on)
    if (id != ids_[2]) (void)sb.Destroy();
  for (auto& sb : after) (void)sb.Destroy();
}

TEST_F(Cluster, AKilledNodeIsDownWithinFiveSecondsItsSandboxesAreLostByNameAndItRejoinsReconciled) {
  // Sandboxes on node 0 (the smallest: place until it has two).
  std::vector<Sandbox> victims, others;
  for (int i = 0; i < 60 && victims.size() < 2; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    (sb->Get()->node_id() == ids_[0] ? victims : others).push_back(*sb);
  }
  ASSERT_EQ(victims.size(), 2u);
  auto killed = Clock::now();
  nodes_[0]->Kill9();
  ASSERT_TRUE(WaitUntil([&] { return NodeState(ids_[0]) == "down"; }, std::chrono::seconds(5)))
      << controller_->Admin("nodes").dump();
  auto took = std::chrono::duration<double>(Clock::now() - killed).count();
  std::printf("node marked down %.2f s after kill -9\n", took);
  EXPECT_LE(took, 5.0);
  // Its sandboxes: an error naming the node, not a timeout.
  auto t0 = Clock::now();
  auto r = victims[0].Exec(Command({"true"}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(ids_[0])) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("lost")) << r.status().ToString();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  auto got = client_->Attach(victims[1].id());
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr(ids_[0]));
  // New placements avoid it; the others keep answering.
  for (int i = 0; i < 6; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    EXPECT_NE(sb->Get()->node_id(), ids_[0]);
    others.push_back(*sb);
  }
  for (const auto& sb : others) EXPECT_TRUE(sb.Exec(Command({"true"})).ok());
  // Back on its data dir: it rejoins with its containers (re-adopted), and
  // the directory holds each once.
  ASSERT_TRUE(nodes_[0]->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return NodeState(ids_[0]) == "up"; }, std::chrono::seconds(20)))
      << controller_->Admin("nodes").dump();
  for (const auto& sb : victims) {
    auto again = sb.Exec(Command({"/bin/sh", "-c", "echo back"}));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->stdout(), "back\n");
  }
  auto ls = controller_->Admin("ls");
  for (const auto& sb : victims) {
    int rows = 0;
    for (const auto& row : ls["sandboxes"]) rows += row.value("id", "") == sb.id();
    EXPECT_EQ(rows, 1) << sb.id() << " listed " << rows << " times";
    EXPECT_EQ(controller_->Admin("inspect " + sb.id()).value("node", ""), ids_[0]);
  }
  for (const auto& sb : victims) EXPECT_TRUE(sb.Destroy().ok());
  for (const auto& sb : others) EXPECT_TRUE(sb.Destroy().ok());
}

TEST_F(Cluster, AKilledControllerComesBackWithEverySandboxReachable) {
  std::vector<Sandbox> made;
  for (int i = 0; i < 9; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    made.push_back(*sb);
  }
  controller_->Kill9();
  // Calls go to the nodes themselves: they go on without the controller.
  for (const auto& sb : made) EXPECT_TRUE(sb.Exec(Command({"true"})).ok());
  ASSERT_TRUE(controller_->Restart().ok());
  ASSERT_TRUE(WaitUntil([] { return UpWithImage() == kNodes; }, std::chrono::seconds(20)))
      << controller_->Admin("nodes").dump();
  // The same client reconnects by itself; each sandbox is found by id.
  for (const auto& sb : made) {
    auto again = client_->Attach(sb.id());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(again->Exec(Command({"true"})).ok());
  }
  auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made.push_back(*sb);
  for (const auto& s : made) EXPECT_TRUE(s.Destroy().ok());
}

TEST_F(Cluster, ANodeWithTheWrongSecretIsRefusedAndLogged) {
  std::string wrong = controller_->data_dir() + ".wrong-secret";
  ASSERT_TRUE(WriteFileAtomic(wrong, "not-the-secret\n", 0600).ok());
  auto n = TestDaemon::Start(NodeOptions(10, wrong));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  std::string id = (*n)->Admin("status").value("node", "");
  auto logged = [](const std::string& path) {
    return WaitUntil(
        [&] {
          auto log = ReadFileToString(path);
          return log.ok() && log->find("wrong cluster secret") != std::string::npos;
        },
        std::chrono::seconds(10));
  };
  EXPECT_TRUE(logged(controller_->log_path())) << "the controller did not log the refusal";
  EXPECT_TRUE(logged((*n)->log_path())) << "the node did not log why it cannot join";
  EXPECT_EQ(NodeState(id), "") << "a node with the wrong secret was admitted";
  n->reset();
  ::unlink(wrong.c_str());
}

}  // namespace
}  // namespace dsec::testing
