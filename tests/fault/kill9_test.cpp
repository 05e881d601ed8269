// kill -9 dsecd with runs in flight: restarted on the same data dir it comes
// back with its tables intact, its old spawner cleaned up after itself, and
// an SDK client reconnects by itself.
#include <gmock/gmock.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "dsec/client.hpp"
#include "harness/daemon.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

bool CgroupDirExists(const std::string& rel) {
  for (const auto& root : CgroupRoots())  // v1's hierarchies and v2's
    if (std::filesystem::exists(root + "/" + rel)) return true;
  return false;
}

TEST(Kill9, TablesSurviveAndTheClientReconnects) {
  auto started = TestDaemon::Start();
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto& d = *started;
  // Only a host that lacks what fncall needs may skip: elsewhere dsecd must offer it.
  if (auto gap = FncallHostGap(); !gap.empty()) GTEST_SKIP() << "fncall sandboxes unavailable on this host: " << gap;
  auto kinds = d->Admin("status");
  ASSERT_NE(kinds.dump().find("\"fncall\""), std::string::npos) << "dsecd offers no fncall: " << kinds.dump();
  ClientOptions o;
  o.address = d->sdk_addr();
  o.data_dir = d->data_dir();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto& client = *c;

  // Durable state before the crash: a sandbox and a session with 3 steps.
  auto sb = client->Create(FncallSpec());
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto s = client->OpenSession("kill9/p/0", FncallSpec());
  ASSERT_TRUE(s.ok());
  std::vector<std::string> outputs;
  for (uint64_t i = 0; i < 3; ++i) {
    auto r = s->Step(i, Command({"cat", "/proc/sys/kernel/random/uuid"}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    outputs.push_back(r->step().result().stdout());
  }
  // Runs in flight at the moment of the kill: sleeps of ~30 s that only this
  // test runs, so the host shows their processes.
  const std::string secs = "30." + std::to_string(::getpid());
  std::vector<std::future<Result<v1::ExecResult>>> inflight;
  for (int i = 0; i < 50; ++i) inflight.push_back(client->RunAsync(FncallSpec(), Command({"sleep", secs})));
  // Wait until the node has them all and every one runs in its sandbox.
  auto at_node = [&] { return d->Admin("ls").value("runs", nlohmann::json::array()).size(); };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((at_node() < 50 || HostProcessesWithArg(secs).size() < 50) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the node and /proc, bounded
  ASSERT_EQ(at_node(), 50u) << "runs in flight at the node before the kill";
  ASSERT_EQ(HostProcessesWithArg(secs).size(), 50u) << "sandboxed sleeps running before the kill";
  // The spawner running them (not whichever child of dsecd comes last).
  pid_t spawner = d->Admin("stats")["fncall"].value("spawner_pid", 0);
  auto children = ChildrenOf(d->pid());
  ASSERT_NE(std::find(children.begin(), children.end(), spawner), children.end())
      << "the fncall spawner " << spawner << " is not a child of dsecd";
  std::string spawner_group = "dsec-test/sp" + std::to_string(spawner);
  ASSERT_TRUE(CgroupDirExists(spawner_group));

  d->Kill9();

  // In-flight calls fail promptly (not after their 60 s timeouts).
  for (auto& f : inflight) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    auto r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kUnavailable) << r.status().ToString();
  }
  EXPECT_FALSE(client->connected());
  // The orphaned spawner removed its cgroups before it went.
  EXPECT_FALSE(CgroupDirExists(spawner_group)) << spawner_group << " left behind";

  ASSERT_TRUE(d->Restart().ok());
  // The same client object: its next call waits for the reconnect.
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING);
  // At least one reconnect (under load CAF may report a fresh connection as
  // lost once more before it settles; the client then reconnects again).
  EXPECT_GE(client->connections(), 2u);
  auto sess = s->Get();
  ASSERT_TRUE(sess.ok()) << sess.status().ToString();
  EXPECT_EQ(sess->step_count(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    auto r = s->Step(i, Command({"cat", "/proc/sys/kernel/random/uuid"}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->fast_forwarded());
    EXPECT_EQ(r->step().result().stdout(), outputs[i]);
  }
  auto next = s->Step(3, Command({"echo", "after"}));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "after\n");
  auto r = sb->Exec(Command({"echo", "alive"}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stdout(), "alive\n");
  auto status = d->Admin("status");
  EXPECT_EQ(status.value("boot", 0), 2);
  auto nodes = d->Admin("nodes").value("nodes", nlohmann::json::array());
  ASSERT_EQ(nodes.size(), 1u) << nodes.dump();
  EXPECT_EQ(nodes[0].value("boot_count", 0), 2);  // numbers are numbers (docs/console.md, JSON shape)
  EXPECT_EQ(nodes[0].value("sdk_address", ""), d->sdk_addr());
  EXPECT_EQ(d->Stop(), 0);
}

TEST(Kill9, SecondDaemonOnTheSameDataDirIsRefused) {
  auto started = TestDaemon::Start();
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto r = RunProcess({BinDir() + "/dsecd", "--data-dir", (*started)->data_dir(), "--listen", "127.0.0.1:0",
                       "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0", "--e2b", "127.0.0.1:0", "--cgroup-parent", "dsec-test",
                       "--no-sandbox-network"},
                      {}, 60);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("in use by another process"));
}

}  // namespace
}  // namespace dsec::testing
