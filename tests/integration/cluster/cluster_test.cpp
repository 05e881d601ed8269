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

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <netinet/in.h>
#include <sys/socket.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "actors/controller/controller.hpp"
#include "dsec/report.hpp"
#include "dsec/snapshot.hpp"
#include "harness/daemon.hpp"
#include "sdk/src/client_agent.hpp"
#include "wire/wire.hpp"
#include "runtime/files.hpp"
#include "tests/support/e2b_sdk.hpp"
#include "tests/support/chromium.hpp"
#include "tests/support/cluster_probes.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/http_probe.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr int kNodes = 3;
constexpr const char* kControllerImage = "cimg";
const uint64_t kSlots[kNodes] = {1000, 2000, 3000};
constexpr double kAllSlots = 6000;

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
    // An image only the controller has: nodes fetch it when they get a sandbox on it.
    if (made.ok()) {
      auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", controller_->data_dir(), "build", rootfs,
                               kControllerImage});
      if (built.exit_code != 0) made = Status::Internal("dsec-image build on the controller: " + built.err);
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
    if (auto e = ConnectClient(*controller_, &client_); !e.empty()) return Fail("the controller: " + e);
  }
  static void TearDownTestSuite() {
    // What a failed test left: containers outlive their dsecd.
    if (client_ && controller_ && controller_->running())
      for (const auto& row : controller_->Admin("ls").value("sandboxes", nlohmann::json::array()))
        if (auto sb = client_->Attach(row.value("id", "")); sb.ok()) (void)sb->Destroy();
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
  static std::string NodeState(const std::string& id) { return StateOf(*controller_, id); }
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
  // 1 : 2 : 3 slots -> 10 : 20 : 30 of 60 (within one heartbeat's slack).
  for (int i = 0; i < kNodes; ++i)
    EXPECT_NEAR(per_node[ids_[i]], kCount * kSlots[i] / kAllSlots, 2) << "node " << ids_[i];
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

// ListSandboxes through the controller, as an operator pages through it:
// `dsecctl ls --label k=v --state running --limit 10` and then
// --page-token, page after page, lists every match once, in id order, from
// every node, and nothing else.
TEST_F(Cluster, DsecctlLsPagesThroughAThousandSandboxesOfEveryNode) {
  constexpr int kCount = 1000, kOthers = 40;
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::string> want;
  std::vector<Sandbox> made;
  int answered = 0;
  std::vector<std::string> errors;
  for (int i = 0; i < kCount + kOthers; ++i) {
    v1::SandboxSpec spec = FncallSpec();
    (*spec.mutable_labels())["batch"] = i < kCount ? "paged" : "other";
    client_->CreateAsync(spec, CreateOptions{}, [&, i](Result<Sandbox> sb) {
      std::lock_guard<std::mutex> lk(mu);
      if (sb.ok()) {
        made.push_back(*sb);
        if (i < kCount) want.insert(sb->id());
      } else {
        errors.push_back(sb.status().ToString());
      }
      ++answered;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return answered == kCount + kOthers; });
  }
  ASSERT_TRUE(errors.empty()) << errors.size() << " creations failed, first: " << errors[0];
  std::vector<std::string> listed;
  std::set<std::string> nodes;
  std::string token;
  int pages = 0;
  for (; pages < 200; ++pages) {
    std::vector<std::string> argv = {BinDir() + "/dsecctl", "--data-dir", controller_->data_dir(), "ls",
                                     "--label", "batch=paged", "--state", "running", "--limit", "10"};
    if (!token.empty()) argv.insert(argv.end(), {"--page-token", token});
    auto r = RunProcess(argv);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    std::getline(lines, line);
    EXPECT_EQ(line.rfind("ID ", 0), 0u) << "a table with its header: " << line;
    int rows = 0;
    while (std::getline(lines, line)) {
      std::istringstream cols(line);
      std::string id, kind, image, state, node;
      cols >> id >> kind >> image >> state >> node;
      EXPECT_EQ(state, "running") << line;
      EXPECT_NE(line.find("batch=paged"), std::string::npos) << line;
      listed.push_back(id);
      nodes.insert(node);
      ++rows;
    }
    EXPECT_LE(rows, 10);
    auto at = r.err.find("--page-token ");
    if (at == std::string::npos) break;
    token = r.err.substr(at + 13);
    while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
  }
  EXPECT_EQ(pages + 1, kCount / 10) << "pages of 10";
  EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end())) << "in id order across pages";
  EXPECT_EQ(std::set<std::string>(listed.begin(), listed.end()).size(), listed.size()) << "each once";
  EXPECT_EQ(std::set<std::string>(listed.begin(), listed.end()), want);
  EXPECT_GE(nodes.size(), 2u) << "the controller lists every node's";
  std::atomic<int> destroyed{0};
  for (const auto& sb : made) sb.DestroyAsync([&](Status st) {
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::lock_guard<std::mutex> lk(mu);
    ++destroyed;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return destroyed == static_cast<int>(made.size()); });
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
  // Its forks go on from step 3 on its node (their logs begin with its
  // steps there, their agents from a snapshot there), even while that node
  // takes no new placements (drained: placement would send them elsewhere).
  ASSERT_TRUE(controller_->Admin("drain " + ids_[at]).value("ok", false));
  auto forks = ForkSession(*client_, *s, 2);
  EXPECT_TRUE(controller_->Admin("undrain " + ids_[at]).value("ok", false));
  ASSERT_TRUE(forks.ok()) << forks.status().ToString();
  for (size_t i = 0; i < forks->size(); ++i) {
    Session& f = (*forks)[i];
    EXPECT_EQ(f.record().node_id(), s->record().node_id()) << "fork " << i;
    EXPECT_EQ(f.record().step_count(), 3u) << "fork " << i;
    auto step = f.Step(3, Command({"/bin/sh", "-c", "echo fork $0 >> /tmp/log; cat /tmp/log", std::to_string(i)}));
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(step->step().result().stdout(), "step 0\nstep 1\nstep 2\nfork " + std::to_string(i) + "\n");
    EXPECT_TRUE(f.Close().ok());
  }
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(Cluster, DrainStopsPlacementsAndItsSandboxesKeepWorking) {
  // One sandbox on each node first, each put there by draining the others
  // (placement follows the heartbeats' loads, which the suite's earlier
  // tests leave behind the truth for a second).
  std::map<std::string, Sandbox> on;
  for (int i = 0; i < kNodes; ++i) {
    for (int j = 0; j < kNodes; ++j)
      if (j != i) {
        ASSERT_TRUE(controller_->Admin("drain " + ids_[j]).value("ok", false));
      }
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    ASSERT_EQ(sb->Get()->node_id(), ids_[i]);
    on.emplace(ids_[i], *sb);
    for (int j = 0; j < kNodes; ++j)
      if (j != i) {
        ASSERT_TRUE(controller_->Admin("undrain " + ids_[j]).value("ok", false));
      }
  }
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
  // Two sandboxes on node 0 (the others drained meanwhile), one on each other.
  std::vector<Sandbox> victims, others;
  for (int i : {1, 2}) ASSERT_TRUE(controller_->Admin("drain " + ids_[i]).value("ok", false));
  for (int i = 0; i < 2; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    ASSERT_EQ(sb->Get()->node_id(), ids_[0]);
    victims.push_back(*sb);
  }
  for (int i : {1, 2}) ASSERT_TRUE(controller_->Admin("undrain " + ids_[i]).value("ok", false));
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

// An image built with dsec-image against the controller lives there only;
// the node a sandbox on it is placed on fetches its file (whole, checked
// against its digest) first, once.
// (Lazily, as the controller takes images by default: docs/images.md.)
TEST_F(Cluster, AnImageOnTheControllerIsFetchedByTheNodeThatGetsASandboxOnIt) {
  auto listed = client_->GetImage(kControllerImage);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  std::map<std::string, int> per_node;
  std::vector<Sandbox> made;
  for (int i = 0; i < 6; ++i) {
    auto sb = client_->Create(ContainerSpec(kControllerImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    auto r = sb->Exec(Command({"/bin/sh", "-c", "echo from-$0", sb->id()}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stdout(), "from-" + sb->id() + "\n");
    per_node[sb->Get()->node_id()]++;
    made.push_back(*sb);
  }
  for (const auto& [node, n] : per_node) {
    int i = IndexOf(node);
    ASSERT_GE(i, 0);
    auto ls = RunProcess({BinDir() + "/dsec-image", "--data-dir", nodes_[i]->data_dir(), "ls", "--json"});
    EXPECT_THAT(ls.out, HasSubstr(listed->digest())) << "node " << node << " holds no copy: " << ls.out << ls.err;
    // Its log says so once (the log is written as it goes: wait for the line).
    size_t fetches = 0;
    WaitUntil(
        [&] {
          auto log = ReadFileToString(nodes_[i]->log_path());
          fetches = 0;
          for (size_t at = 0; log.ok() && (at = log->find("image cimg taken lazily", at)) != std::string::npos; ++at)
            ++fetches;
          return fetches > 0;
        },
        std::chrono::seconds(10));
    EXPECT_EQ(fetches, 1u) << "node " << node << " took " << n << " sandboxes on it";
  }
  for (const auto& sb : made) EXPECT_TRUE(sb.Destroy().ok());
}

// A session whose extra sandbox is on an image only the controller has:
// its node fetches that image too before the session opens there.
TEST_F(Cluster, ASessionsExtraSandboxOnAControllerImageIsFetchedToo) {
  SessionOptions so;
  so.more_sandboxes.emplace_back("eval", ContainerSpec(kControllerImage));
  auto s = client_->OpenSession("more-" + std::to_string(::getpid()), ContainerSpec(ContainerTest::kImage), so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto step = s->Step(0, Command({"/bin/sh", "-c", "echo in-eval"}), [] {
    StepOptions o;
    o.sandbox = "eval";
    return o;
  }());
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(step->step().result().stdout(), "in-eval\n");
  int i = IndexOf(s->record().node_id());
  ASSERT_GE(i, 0);
  auto ls = RunProcess({BinDir() + "/dsec-image", "--data-dir", nodes_[i]->data_dir(), "ls", "--json"});
  EXPECT_THAT(ls.out, HasSubstr(kControllerImage));
  EXPECT_TRUE(s->Close().ok());
}

// A session outlives its trainer by its lease, in a cluster too: the
// controller forwarding its open (and a restartable one's steps) is not a
// trainer that holds it open for as long as the controller lives. Each
// closes within a few seconds of its 2 s lease once its trainer is gone.
TEST_F(Cluster, ASessionsLeaseRunsOutWhenItsTrainerIsGone) {
  std::unique_ptr<Client> trainer;
  ASSERT_EQ(ConnectClient(*controller_, &trainer), "");
  std::string tag = std::to_string(::getpid());
  std::vector<std::pair<std::string, std::string>> opened;  // name, node
  for (bool restartable : {false, true}) {
    SessionOptions so;
    so.lease_s = 2;
    so.restartable = restartable;
    std::string name = std::string(restartable ? "lease-r-" : "lease-") + tag;
    auto s = trainer->OpenSession(name, ContainerSpec(ContainerTest::kImage), so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(s->Step(0, Command({"true"})).ok());
    opened.emplace_back(name, s->record().node_id());
  }
  trainer.reset();
  for (const auto& [name, node] : opened) {
    int i = IndexOf(node);
    ASSERT_GE(i, 0);
    std::string why;
    EXPECT_TRUE(WaitUntil(
        [&, name = name] {
          auto rec = nodes_[i]->Admin("inspect " + name);
          why = rec.dump();
          return rec.contains("session") && rec["session"].is_object() &&
                 rec["session"].value("close_reason", "").find("lease expired") != std::string::npos;
        },
        std::chrono::seconds(20)))
        << name << " is still open after its trainer left: " << why;
  }
  // The controller forgets them with the node's next heartbeat (the
  // restartable one's log copy too): a node that dies later restarts nothing.
  for (const auto& [name, node] : opened)
    EXPECT_TRUE(WaitUntil(
        [&, name = name] {
          return controller_->Admin("inspect " + name).value("error", "").find("no sandbox or session") !=
                 std::string::npos;
        },
        std::chrono::seconds(10)))
        << controller_->Admin("inspect " + name).dump();
}

// The controller's HTTP endpoint shows the whole cluster: /status.json
// lists every node with its state and the sandboxes on it, /metrics counts
// nodes by state and the directory; a node marked down says why.
TEST_F(Cluster, TheControllersStatusAndMetricsShowEveryNode) {
  auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  std::string holder = sb->Get()->node_id();
  auto status = HttpGet(controller_->http_addr(), "/status.json");
  ASSERT_EQ(status.code, 200) << status.raw;
  auto j = nlohmann::json::parse(status.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << status.body;
  EXPECT_EQ(j.value("role", ""), "controller");
  ASSERT_EQ(j["nodes"].size(), static_cast<size_t>(kNodes)) << status.body;
  bool listed = false;
  for (const auto& node : j["nodes"]) {
    EXPECT_EQ(node.value("state", ""), "up") << node.dump();
    if (node.value("node", "") != holder) continue;
    for (const auto& row : node["sandbox_list"]) listed = listed || row.value("id", "") == sb->id();
  }
  EXPECT_TRUE(listed) << "sandbox " << sb->id() << " not shown on node " << holder << ": " << status.body;
  auto metrics = HttpGet(controller_->http_addr(), "/metrics");
  ASSERT_EQ(metrics.code, 200);
  std::string bad;
  auto m = ParseMetrics(metrics.body, &bad);
  EXPECT_TRUE(bad.empty()) << bad;
  EXPECT_EQ(m["dsec_cluster_nodes{state=\"up\"}"], kNodes);
  EXPECT_GE(m["dsec_cluster_directory_entries{kind=\"sandbox\"}"], 1);
  EXPECT_GE(m["dsec_placements_total"], 1);
  // The page itself comes from the controller too.
  auto page = HttpGet(controller_->http_addr(), "/");
  EXPECT_EQ(page.code, 200);
  EXPECT_TRUE(sb->Destroy().ok());
}

// The controller's status page in headless Chromium: its script draws
// every node (one draining says so) and the sandboxes on each; a
// screenshot is written next to the test.
TEST_F(Cluster, ChromiumShowsEveryNodeAndTheSandboxesOnThem) {
  HeadlessChromium chromium;
  if (auto why = chromium.Open(); !why.empty()) GTEST_SKIP() << why;
  std::vector<Sandbox> made;
  for (int i = 0; i < 4; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    made.push_back(*sb);
  }
  ASSERT_TRUE(controller_->Admin("drain " + ids_[2]).value("ok", false));
  const std::string url = "http://" + controller_->http_addr() + "/";
  auto dom = chromium.Dom(url);
  ASSERT_TRUE(controller_->Admin("undrain " + ids_[2]).value("ok", false));
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_THAT(dom.out, HasSubstr("data-ready=\"1\"")) << "the page's script did not draw /status.json";
  EXPECT_THAT(dom.out, HasSubstr(std::to_string(kNodes) + " node(s)"));
  for (const auto& id : ids_) EXPECT_THAT(dom.out, HasSubstr("data-node=\"" + id + "\""));
  EXPECT_THAT(dom.out, HasSubstr("state-draining\">draining<"));
  for (auto& sb : made) EXPECT_THAT(dom.out, HasSubstr("data-sandbox=\"" + sb.id() + "\""));
  std::string shot;
  EXPECT_EQ(chromium.Screenshot(url, "cluster-status-page-screenshot.png", &shot), "");
  std::printf("# cluster status page screenshot: %s\n", shot.c_str());
  ::testing::Test::RecordProperty("screenshot", shot);
  for (auto& sb : made) EXPECT_TRUE(sb.Destroy().ok());
}

// A session opened restartable goes on on another node when its node dies:
// the controller opens it there and re-runs its logged steps into the fresh
// sandbox (the sandbox's state is back), the trainer's next step runs
// there, and the log reads as before. A session with a step marked not
// replayable is not re-run past it: its steps fail with an error that says
// so. A grade in the log is graded again there. The node, back, closes its
// stale copy.
TEST_F(Cluster, ARestartableSessionGoesOnOnAnotherNodeAndANotReplayableStepStopsThat) {
  std::string tag = std::to_string(::getpid());
  SessionOptions so;
  so.restartable = true;
  // Both sessions on node 0 (the others drained while they open).
  for (int i : {1, 2}) ASSERT_TRUE(controller_->Admin("drain " + ids_[i]).value("ok", false));
  // The first is graded too (its grade is re-run as a grade on the new node).
  SessionOptions graded = so;
  for (const char* a : {"/bin/sh", "-c", "echo 1"}) graded.grade.add_command(a);
  v1::SandboxSpec task = ContainerSpec(ContainerTest::kImage);
  task.mutable_task()->set_root("/work");
  auto s1 = client_->OpenSession("restart-" + tag, task, graded);
  auto s2 = client_->OpenSession("stop-" + tag, ContainerSpec(ContainerTest::kImage), so);
  for (int i : {1, 2}) ASSERT_TRUE(controller_->Admin("undrain " + ids_[i]).value("ok", false));
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  EXPECT_TRUE(s1->record().restartable());
  EXPECT_EQ(s1->record().node_id(), ids_[0]);
  auto line = [](uint64_t i) {
    return Command({"/bin/sh", "-c", "echo step $0 >> /tmp/log; cat /tmp/log", std::to_string(i)});
  };
  std::string first_output;
  for (uint64_t i = 0; i < 3; ++i) {
    auto step = s1->Step(i, line(i));
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    if (i == 1) first_output = step->step().result().stdout();
  }
  auto grade = Grade(*s1, 3);
  ASSERT_TRUE(grade.ok()) << grade.status().ToString();
  EXPECT_EQ(grade->step().meta().reward(), 1.0);
  ASSERT_TRUE(s2->Step(0, line(0)).ok());
  StepOptions once;
  once.not_replayable = true;
  ASSERT_TRUE(s2->Step(1, Command({"true"}), once).ok());

  nodes_[0]->Kill9();
  ASSERT_TRUE(WaitUntil([&] { return NodeState(ids_[0]) == "down"; }, std::chrono::seconds(5)));
  // Re-opened elsewhere and re-run (3 container execs).
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto rec = s1->Get();
        return rec.ok() && rec->node_id() != ids_[0] && rec->moves() == 1;
      },
      std::chrono::seconds(60)))
      << controller_->Admin("sessions").dump();
  auto next = s1->Step(4, line(4));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "step 0\nstep 1\nstep 2\nstep 4\n") << "the sandbox's state is back";
  auto regrade = Grade(*s1, 3);
  ASSERT_TRUE(regrade.ok()) << regrade.status().ToString();
  EXPECT_TRUE(regrade->fast_forwarded()) << "the grade the trainer had, from the controller's copy";
  auto replayed = s1->Step(1, line(1));
  ASSERT_TRUE(replayed.ok()) << replayed.status().ToString();
  EXPECT_TRUE(replayed->fast_forwarded());
  EXPECT_EQ(replayed->step().result().stdout(), first_output) << "the log reads as before";
  auto steps = s1->Steps();
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_EQ(steps->steps_size(), 5) << "the new node's log has the grade too";
  // The other one stops at its step that is not replayable.
  auto stopped = s2->Step(2, line(2));
  ASSERT_FALSE(stopped.ok());
  EXPECT_THAT(stopped.status().message(), HasSubstr("not replayable"));
  EXPECT_THAT(stopped.status().message(), HasSubstr(ids_[0]));
  // Its trainer closes it while node 0 is still down and once no node
  // holds it (the node it was re-opened on closed it there): answered at
  // once (a close no node could answer for once went unanswered).
  ASSERT_TRUE(WaitUntil([&] { return !controller_->Admin("inspect stop-" + tag).value("ok", true); },
                        std::chrono::seconds(10)))
      << controller_->Admin("inspect stop-" + tag).dump();
  auto closed2 = s2->Close();
  EXPECT_TRUE(closed2.ok()) << closed2.ToString();
  // Node 0 back: the copies it still holds are closed, the moved one's and
  // the one closed while it was down (neither comes back as a session).
  ASSERT_TRUE(nodes_[0]->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return NodeState(ids_[0]) == "up"; }, std::chrono::seconds(20)));
  auto closed_on_node0 = [&](const std::string& name, const std::string& why) {
    return WaitUntil(
        [&] {
          auto stale = nodes_[0]->Admin("inspect " + name);
          return stale.is_object() && stale.contains("session") && stale["session"].is_object() &&
                 stale["session"].value("close_reason", "").find(why) != std::string::npos;
        },
        std::chrono::seconds(10));
  };
  EXPECT_TRUE(closed_on_node0("restart-" + tag, "restarted on node")) << nodes_[0]->Admin("inspect restart-" + tag).dump();
  EXPECT_TRUE(closed_on_node0("stop-" + tag, "closed by its trainer while this node was down"))
      << nodes_[0]->Admin("inspect stop-" + tag).dump();
  EXPECT_FALSE(controller_->Admin("inspect stop-" + tag).value("ok", true)) << "the closed session came back";
  auto closed1 = s1->Close();
  EXPECT_TRUE(closed1.ok()) << closed1.ToString();
}

// Many calls at once through the callback forms; each result by index.
template <class T, class Start>
std::vector<Result<T>> All(int n, Start start) {
  std::vector<std::optional<Result<T>>> got(n);
  std::mutex mu;
  std::condition_variable cv;
  int left = n;
  for (int i = 0; i < n; ++i)
    start(i, [&, i](Result<T> r) {
      std::lock_guard<std::mutex> lk(mu);
      got[i] = std::move(r);
      if (--left == 0) cv.notify_all();
    });
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return left == 0; });
  std::vector<Result<T>> out;
  for (auto& g : got) out.push_back(std::move(*g));
  return out;
}

TEST_F(Cluster, AKilledControllerComesBackWithEverySandboxReachable) {
  // 1 000 placed (fncall: cheap for the nodes) and a few containers.
  constexpr int kMany = 1000;
  auto fn = All<Sandbox>(kMany, [](int, Done<Sandbox> d) { client_->CreateAsync(FncallSpec(), {}, std::move(d)); });
  std::vector<Sandbox> made;
  for (auto& r : fn) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    made.push_back(*r);
  }
  for (int i = 0; i < 6; ++i) {
    auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    made.push_back(*sb);
  }
  controller_->Kill9();
  // Calls go to the nodes themselves: they go on without the controller.
  for (size_t i = kMany; i < made.size(); ++i) EXPECT_TRUE(made[i].Exec(Command({"true"})).ok());
  ASSERT_TRUE(controller_->Restart().ok());
  ASSERT_TRUE(WaitUntil([] { return UpWithImage() == kNodes; }, std::chrono::seconds(20)))
      << controller_->Admin("nodes").dump();
  // The same client reconnects by itself; every sandbox is found by id
  // through the controller, and answers.
  auto found = All<Sandbox>(static_cast<int>(made.size()),
                            [&](int i, Done<Sandbox> d) { client_->AttachAsync(made[i].id(), std::move(d)); });
  int reachable = 0;
  for (auto& r : found) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) reachable++;
  }
  EXPECT_EQ(reachable, static_cast<int>(made.size()));
  for (size_t i = 0; i < found.size(); i += (i < kMany ? 50 : 1)) {
    if (found[i].ok()) {
      EXPECT_TRUE(found[i]->Exec(Command({"true"})).ok());
    }
  }
  auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made.push_back(*sb);
  auto gone = All<bool>(static_cast<int>(made.size()), [&](int i, Done<bool> d) {
    made[i].DestroyAsync([d](Status s) { d(s.ok() ? Result<bool>(true) : Result<bool>(s)); });
  });
  for (auto& g : gone) EXPECT_TRUE(g.ok()) << g.status().ToString();
}

// E2B's SDK against the controller's door: the sandboxes it makes land on
// the nodes, and each call (commands, files, fork, list, kill) is routed to
// the sandbox's node; a fork lands on its source's node.
TEST_F(Cluster, TheControllersE2bDoorRoutesEachSandboxsCallsToItsNode) {
  std::string skip, module = E2bSdkModule(&skip);
  if (module.empty()) GTEST_SKIP() << skip;
  std::string run = RandomHex(8);
  auto r = RunE2bScript(*controller_, module, "cluster.cjs",
                        {"RUN_ID=" + run, std::string("TEMPLATE=") + ContainerTest::kImage});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  ASSERT_EQ(out["ids"].size(), 6u) << r.out;
  std::set<std::string> used;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(out["echoed"][i], out["ids"][i]) << "its own file, through its node";
    std::string node = out["nodes"][i];
    EXPECT_GE(IndexOf(node), 0) << "sandbox " << out["ids"][i] << " is on '" << node << "', not a node";
    used.insert(node);
  }
  EXPECT_GE(used.size(), 2u) << "six sandboxes over three nodes";
  EXPECT_EQ(out["forkRead"], out["ids"][0]) << "the fork has its source's files";
  EXPECT_EQ(out["forkNode"], out["nodes"][0]) << "a fork lands on its source's node";
  EXPECT_EQ(out["listed"], 7) << "listed through the controller, every node's";
  EXPECT_EQ(out["killed"], 7);
  for (const auto& row : controller_->Admin("ls").value("sandboxes", nlohmann::json::array()))
    for (const auto& id : out["ids"]) EXPECT_NE(row.value("id", ""), id.get<std::string>());
  // The controller's console issues and revokes its door's keys.
  auto ctl = [&](const std::string& verb) {
    return RunProcess({BinDir() + "/dsecctl", "--data-dir", controller_->data_dir(), "e2b-key", verb, "ops", "--raw"});
  };
  auto issued = ctl("issue");
  ASSERT_EQ(issued.exit_code, 0) << issued.out << issued.err;
  std::string key = nlohmann::json::parse(issued.out, nullptr, false).value("key", "");
  auto listing = [&] {
    return HttpExchange(HttpPort(controller_->e2b_addr()),
                        "GET /v2/sandboxes HTTP/1.1\r\nHost: d\r\nX-API-Key: " + key + "\r\n\r\n").code;
  };
  EXPECT_EQ(listing(), 200);
  EXPECT_EQ(ctl("revoke").exit_code, 0);
  EXPECT_EQ(listing(), 401);
}

// A command's stream through the controller's E2B door whose node dies is
// cut at its next keepalive (as a killed sandbox's is: the SDK then asks
// /health and says the sandbox is gone), not left open forever.
TEST_F(Cluster, AnE2bStreamWhoseNodeDiesIsCutAtItsNextKeepalive) {
  auto key = ReadFileToString(controller_->data_dir() + "/e2b.key");
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  const int port = HttpPort(controller_->e2b_addr());
  const std::string head = "Host: d\r\nX-API-Key: " + key->substr(0, key->find('\n')) + "\r\n";
  for (int i : {1, 2}) ASSERT_TRUE(controller_->Admin("drain " + ids_[i]).value("ok", false));
  std::string body = std::string(R"({"templateID": ")") + ContainerTest::kImage + "\"}";
  auto made = HttpExchange(port, "POST /sandboxes HTTP/1.1\r\n" + head + "Content-Type: application/json\r\n" +
                                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  for (int i : {1, 2}) ASSERT_TRUE(controller_->Admin("undrain " + ids_[i]).value("ok", false));
  ASSERT_EQ(made.code, 201) << made.raw;
  auto sb = nlohmann::json::parse(made.body, nullptr, false);
  const std::string id = sb.value("sandboxID", ""), token = sb.value("envdAccessToken", "");
  ASSERT_EQ(controller_->Admin("inspect " + id).value("node", ""), ids_[0]);
  std::string msg = R"({"process": {"cmd": "/bin/sh", "args": ["-c", "echo started; sleep 600"]}})";
  std::string envelope(5, '\0');
  for (int i = 0; i < 4; ++i) envelope[1 + i] = static_cast<char>((msg.size() >> (24 - 8 * i)) & 0xff);
  envelope += msg;
  std::string start = "POST /process.Process/Start HTTP/1.1\r\nHost: d\r\nContent-Type: application/connect+json\r\n"
                      "Keepalive-Ping-Interval: 1\r\nAuthorization: Basic cm9vdDo=\r\nE2b-Sandbox-Id: " + id +
                      "\r\nX-Access-Token: " + token + "\r\nContent-Length: " + std::to_string(envelope.size()) +
                      "\r\n\r\n" + envelope;
  int fd = DialLoopback(port);
  ASSERT_GE(fd, 0);
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ASSERT_EQ(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
  // Reads until `done` says so, the connection closes (true) or `limit` passes.
  std::string got;
  auto read_until = [&](auto done, std::chrono::seconds limit) {
    auto deadline = Clock::now() + limit;
    char buf[4096];
    while (Clock::now() < deadline && !done()) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n > 0) got.append(buf, static_cast<size_t>(n));
    }
    return false;
  };
  read_until([&] { return got.find("c3RhcnRlZAo=") != std::string::npos; }, std::chrono::seconds(60));
  ASSERT_NE(got.find("c3RhcnRlZAo="), std::string::npos) << "no 'started' in the stream: " << got;
  auto killed = Clock::now();
  nodes_[0]->Kill9();
  bool closed = read_until([] { return false; }, std::chrono::seconds(40));
  double took = std::chrono::duration<double>(Clock::now() - killed).count();
  ::close(fd);
  EXPECT_TRUE(closed) << "the stream was still open 40 s after its node died";
  std::printf("the stream was cut %.1f s after its node died\n", took);
  EXPECT_EQ(got.find("\x02{"), std::string::npos) << "cut without an end message, as E2B's proxy cuts it";
  ASSERT_TRUE(nodes_[0]->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return NodeState(ids_[0]) == "up"; }, std::chrono::seconds(20)));
  EXPECT_EQ(HttpExchange(port, "DELETE /sandboxes/" + id + " HTTP/1.1\r\n" + head + "\r\n").code, 204);
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

// Garbage on the cluster port is refused at the door; hostile messages from
// a peer that holds the secret (joins without a proper id, heartbeats of
// nodes that do not exist, requests naming nothing, messages of no known
// shape) get errors and change no record: the same nodes in the same
// states, the same directory.
TEST_F(Cluster, GarbageAndHostileMessagesToTheControllerChangeNothing) {
  // The directory has caught up with what each node holds (heartbeats
  // carry what ended), before and after.
  auto caught_up = [] {
    auto nodes = controller_->Admin("nodes")["nodes"];
    for (int i = 0; i < kNodes; ++i) {
      size_t held = nodes_[i]->Admin("status").value("sandboxes", size_t{0});
      bool same = false;
      for (const auto& n : nodes)
        same = same || (n.value("id", "") == ids_[i] && n.value("directory_sandboxes", size_t{0}) == held);
      if (!same) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitUntil(caught_up, std::chrono::seconds(10))) << controller_->Admin("nodes").dump();
  auto before_nodes = controller_->Admin("nodes");
  auto before = controller_->Admin("status");
  std::string host = controller_->cluster_addr().substr(0, controller_->cluster_addr().rfind(':'));
  uint16_t port = static_cast<uint16_t>(std::stoi(controller_->cluster_addr().substr(host.size() + 1)));
  std::mt19937_64 rng(42);
  // 2 000 random byte strings, 20 connections.
  for (int c = 0; c < 20; ++c) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    for (int i = 0; i < 100; ++i) {
      std::string bytes(1 + rng() % 200, '\0');
      for (auto& b : bytes) b = static_cast<char>(rng());
      if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) break;  // refused and closed
    }
    ::close(fd);
  }
  // A peer with the secret, speaking BASP.
  caf::actor_system_config cfg;
  ConfigureCaf(cfg, CafOptions{});
  caf::actor_system sys{cfg};
  auto secret = ReadFileToString(controller_->data_dir() + "/cluster.secret");
  ASSERT_TRUE(secret.ok());
  while (!secret->empty() && secret->back() == '\n') secret->pop_back();
  auto ctl = sdk::ConnectEntry(sys, host, port, *secret, std::chrono::seconds(5), 2 /* door::kCluster */);
  ASSERT_TRUE(ctl.ok()) << ctl.status().ToString();
  caf::scoped_actor self{sys};
  auto ask_join = [&](cluster::v1::NodeJoin j, caf::actor entry) {
    cluster::v1::JoinReply reply;
    self->request(*ctl, std::chrono::seconds(10), join_atom::value, std::move(j), entry)
        .receive([&](cluster::v1::JoinReply& r) { reply = std::move(r); },
                 [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return reply;
  };
  auto bogus = sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  cluster::v1::NodeJoin j;
  EXPECT_NE(ask_join(j, bogus).status().code(), v1::Status::OK) << "a join without an id";
  j.mutable_node()->set_id(std::string(100000, 'x'));
  EXPECT_NE(ask_join(j, bogus).status().code(), v1::Status::OK) << "a join with a 100 000-byte id";
  j.mutable_node()->set_id("../../etc");
  EXPECT_NE(ask_join(j, bogus).status().code(), v1::Status::OK) << "a join with an id that is not [a-z0-9-]";
  j.mutable_node()->set_id("fine-id");
  EXPECT_NE(ask_join(j, caf::actor()).status().code(), v1::Status::OK) << "a join without an entry";
  j.mutable_node()->set_id(ids_[1]);
  EXPECT_EQ(ask_join(j, bogus).status().code(), v1::Status::ALREADY_EXISTS) << "another process taking a node's id";
  for (int i = 0; i < 200; ++i) {
    cluster::v1::NodeLoad load;
    for (int k = 0; k < 50; ++k) {
      load.add_ended_sandboxes("sb-" + std::to_string(rng()));
      load.add_started_sandboxes(std::to_string(rng()));
    }
    load.set_sandboxes(rng());
    self->send(*ctl, beat_atom::value, i % 2 ? ids_[i % kNodes] : "nobody-" + std::to_string(rng()), load);
  }
  // Ids of printable junk reach the handlers (an error reply each); ids of
  // raw bytes are malformed protobuf (invalid UTF-8 in a string field) and
  // are refused before any handler (an error to the sender).
  int refused_malformed = 0;
  for (int i = 0; i < 200; ++i) {
    bool raw = i % 2;
    std::string id(rng() % 80, 'a');
    for (auto& ch : id) ch = raw ? static_cast<char>(rng()) : static_cast<char>(' ' + rng() % 95);
    auto malformed = [&](caf::error& e) {
      if (raw) ++refused_malformed;
      else ADD_FAILURE() << sys.render(e);
    };
    v1::ExecRequest ex;
    ex.set_sandbox_id(id);
    ex.add_argv("true");
    self->request(*ctl, std::chrono::seconds(10), ex)
        .receive([&](v1::ExecReply& r) { EXPECT_NE(r.status().code(), v1::Status::OK); }, malformed);
    v1::CreateRequest cr;
    cr.set_id(id.empty() || id.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos
                  ? "UPPER"
                  : id);
    cr.mutable_spec()->set_kind(v1::KIND_FNCALL);
    self->request(*ctl, std::chrono::seconds(10), cr)
        .receive(
            [&](v1::SandboxReply& r) {
              EXPECT_EQ(r.status().code(), v1::Status::INVALID_ARGUMENT) << r.status().message();
            },
            malformed);
    self->send(*ctl, static_cast<int>(rng()), id);  // a message of no known shape
    self->send(*ctl, admin_atom::value, std::string(i % 2 ? "drain" : "undrain"), std::vector<std::string>{id});
  }
  std::printf("%d malformed requests refused before any handler\n", refused_malformed);
  caf::anon_send_exit(bogus, caf::exit_reason::user_shutdown);
  // Nothing changed: the same nodes in the same states, the same directory.
  EXPECT_TRUE(WaitUntil(caught_up, std::chrono::seconds(10))) << controller_->Admin("nodes").dump();
  auto after_nodes = controller_->Admin("nodes");
  ASSERT_EQ(after_nodes["nodes"].size(), before_nodes["nodes"].size()) << after_nodes.dump();
  for (size_t i = 0; i < after_nodes["nodes"].size(); ++i) {
    EXPECT_EQ(after_nodes["nodes"][i].value("id", ""), before_nodes["nodes"][i].value("id", ""));
    EXPECT_EQ(after_nodes["nodes"][i].value("state", ""), before_nodes["nodes"][i].value("state", ""));
    EXPECT_EQ(after_nodes["nodes"][i].value("directory_sandboxes", 0),
              before_nodes["nodes"][i].value("directory_sandboxes", 0));
  }
  auto after = controller_->Admin("status");
  EXPECT_EQ(after.value("sandboxes", 0), before.value("sandboxes", 0));
  EXPECT_EQ(after.value("sessions", 0), before.value("sessions", 0));
  EXPECT_EQ(after.value("nodes_up", 0), kNodes);
  // And it still places.
  auto sb = client_->Create(ContainerSpec(ContainerTest::kImage));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_TRUE(sb->Destroy().ok());
}

// Two nodes, each in a network namespace of its own joined to the host by a
// veth pair (made and removed here): joins, placements and the SDK's calls
// to the nodes cross a real interface. Taking one node's link down for 10 s
// is a partition: the controller marks the node down and reports its
// sandboxes lost; once the link is up the node is back, with them.
class ClusterNetns : public ::testing::Test {
 protected:
  static constexpr int kNetNodes = 2;

  static bool Ip(std::vector<std::string> args, std::string* err = nullptr) {
    args.insert(args.begin(), "/sbin/ip");
    auto r = RunProcess(args);
    if (r.exit_code != 0 && err) *err = "ip " + args[1] + " " + (args.size() > 2 ? args[2] : "") + ": " + r.err;
    return r.exit_code == 0;
  }
  static std::string Ns(int i) { return "dsec-t" + std::to_string(::getpid()) + "-" + std::to_string(i); }
  static std::string HostVeth(int i) { return "dt" + std::to_string(::getpid() % 100000) + "h" + std::to_string(i); }
  static std::string NsVeth(int i) { return "dt" + std::to_string(::getpid() % 100000) + "n" + std::to_string(i); }
  // 10.213.<i>.1 on the host's side, .2 in the namespace.
  static std::string Addr(int i, int end) { return "10.213." + std::to_string(i + 1) + "." + std::to_string(end); }

  static void SetUpTestSuite() {
    if (::geteuid() != 0) {
      skip_ = "network namespaces need root";
      return;
    }
    if (::access("/sbin/ip", X_OK) != 0) {
      skip_ = "no /sbin/ip (iproute2)";
      return;
    }
    if (auto gap = FncallHostGap(); !gap.empty()) {
      skip_ = "fncall sandboxes unavailable on this host: " + gap;
      return;
    }
    std::string err;
    for (int i = 0; i < kNetNodes; ++i) {
      made_[i] = Ip({"netns", "add", Ns(i)}, &err);
      bool ok = made_[i] && Ip({"link", "add", HostVeth(i), "type", "veth", "peer", "name", NsVeth(i)}, &err) &&
                Ip({"link", "set", NsVeth(i), "netns", Ns(i)}, &err) &&
                Ip({"addr", "add", Addr(i, 1) + "/24", "dev", HostVeth(i)}, &err) &&
                Ip({"link", "set", HostVeth(i), "up"}, &err) &&
                Ip({"netns", "exec", Ns(i), "/sbin/ip", "addr", "add", Addr(i, 2) + "/24", "dev", NsVeth(i)}, &err) &&
                Ip({"netns", "exec", Ns(i), "/sbin/ip", "link", "set", NsVeth(i), "up"}, &err) &&
                Ip({"netns", "exec", Ns(i), "/sbin/ip", "link", "set", "lo", "up"}, &err);
      if (!ok) return Fail("cannot make network namespace " + Ns(i) + ": " + err);
    }
    TestDaemonOptions co;
    co.role = "controller";
    // The nodes reach the controller's cluster port from their namespaces.
    co.cluster_listen = "0.0.0.0:0";
    auto c = TestDaemon::Start(co);
    if (!c.ok()) return Fail("the controller did not start: " + c.status().ToString());
    controller_ = std::move(*c);
    std::string port = controller_->cluster_addr().substr(controller_->cluster_addr().rfind(':') + 1);
    for (int i = 0; i < kNetNodes; ++i) {
      TestDaemonOptions o;
      // nsenter, not `ip netns exec`: that also mounts a fresh /sys,
      // which hides the cgroup hierarchies the node's sandboxes need.
      o.wrapper = {"/usr/bin/nsenter", "--net=/run/netns/" + Ns(i), "--"};
      o.host = Addr(i, 2);
      o.extra_args = {"--role", "node", "--join", Addr(i, 1) + ":" + port, "--cluster-secret",
                      controller_->data_dir() + "/cluster.secret", "--slots", "100"};
      auto n = TestDaemon::Start(o);
      if (!n.ok()) return Fail("node " + std::to_string(i) + " did not start: " + n.status().ToString());
      nodes_[i] = std::move(*n);
      ids_[i] = nodes_[i]->Admin("status").value("node", "");
    }
    if (!WaitUntil([] { return Up() == kNetNodes; }, std::chrono::seconds(20)))
      return Fail("the nodes did not join: " + controller_->Admin("nodes").dump());
    if (auto e = ConnectClient(*controller_, &client_); !e.empty()) return Fail("the controller: " + e);
  }
  static void TearDownTestSuite() {
    client_.reset();
    for (auto& n : nodes_) n.reset();
    controller_.reset();
    for (int i = 0; i < kNetNodes; ++i)
      if (made_[i]) {
        Ip({"link", "del", HostVeth(i)});  // and its peer
        EXPECT_TRUE(Ip({"netns", "del", Ns(i)})) << "cannot remove network namespace " << Ns(i);
      }
  }
  static void Fail(const std::string& why) { failure_ = why; }
  void SetUp() override {
    ASSERT_TRUE(failure_.empty()) << failure_;
    if (!client_) GTEST_SKIP() << skip_;
  }
  static int Up() {
    int n = 0;
    for (const auto& node : controller_->Admin("nodes").value("nodes", nlohmann::json::array()))
      n += node.value("state", "") == "up";
    return n;
  }
  static std::string NodeState(const std::string& id) { return StateOf(*controller_, id); }

  static inline std::unique_ptr<TestDaemon> controller_;
  static inline std::unique_ptr<TestDaemon> nodes_[kNetNodes];
  static inline std::string ids_[kNetNodes];
  static inline bool made_[kNetNodes] = {};
  static inline std::unique_ptr<Client> client_;
  static inline std::string skip_, failure_;
};

TEST_F(ClusterNetns, CallsCrossTheVethAndAPartitionIsDetectedAndHealed) {
  std::vector<Sandbox> on[kNetNodes];
  for (int i = 0; i < 40 && (on[0].empty() || on[1].empty()); ++i) {
    auto sb = client_->Create(FncallSpec());
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    auto rec = sb->Get();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    int at = rec->node_id() == ids_[0] ? 0 : 1;
    // The node's SDK address is on its veth: the calls cross it.
    EXPECT_EQ(rec->node_address().rfind(Addr(at, 2) + ":", 0), 0u) << rec->node_address();
    on[at].push_back(*sb);
  }
  ASSERT_FALSE(on[0].empty());
  ASSERT_FALSE(on[1].empty());
  for (const auto& list : on)
    for (const auto& sb : list) {
      auto r = sb.Exec(Command({"echo", "across"}));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->stdout(), "across\n");
    }
  // Partition node 0 for 10 s.
  auto cut = Clock::now();
  ASSERT_TRUE(Ip({"link", "set", HostVeth(0), "down"}));
  EXPECT_TRUE(WaitUntil([] { return NodeState(ids_[0]) == "down"; }, std::chrono::seconds(5)))
      << controller_->Admin("nodes").dump();
  std::printf("partitioned node marked down %.2f s after its link went down\n",
              std::chrono::duration<double>(Clock::now() - cut).count());
  auto lost = client_->Attach(on[0][0].id());
  ASSERT_FALSE(lost.ok());
  EXPECT_THAT(lost.status().message(), HasSubstr(ids_[0]));
  EXPECT_THAT(lost.status().message(), HasSubstr("lost"));
  // The other side of the cluster works on.
  EXPECT_TRUE(on[1][0].Exec(Command({"true"})).ok());
  auto placed = client_->Create(FncallSpec());
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(placed->Get()->node_id(), ids_[1]);
  std::this_thread::sleep_for(std::chrono::seconds(10) - (Clock::now() - cut));  // the partition's length
  ASSERT_TRUE(Ip({"link", "set", HostVeth(0), "up"}));
  auto healed = Clock::now();
  ASSERT_TRUE(WaitUntil([] { return NodeState(ids_[0]) == "up"; }, std::chrono::seconds(30)))
      << controller_->Admin("nodes").dump();
  std::printf("node back up %.2f s after the link came back\n",
              std::chrono::duration<double>(Clock::now() - healed).count());
  for (const auto& sb : on[0]) {
    auto again = client_->Attach(sb.id());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    auto r = again->Exec(Command({"echo", "healed"}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stdout(), "healed\n");
  }
  for (auto& list : on)
    for (const auto& sb : list) EXPECT_TRUE(sb.Destroy().ok());
  EXPECT_TRUE(placed->Destroy().ok());
}

}  // namespace
}  // namespace dsec::testing
