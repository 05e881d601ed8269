// Restore does not hold up the node: after a kill -9 with 2 000 running
// containers, the console answers `status` within 100 ms while their agents
// are pinged and the containers re-adopted. Timed, so ctest runs it alone
// (RUN_SERIAL): a neighbour test loading both cores would time itself.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/container_fixture.hpp"
#include "tests/support/parallel.hpp"

namespace dsec::testing {
namespace {

using RestoreLatency = OwnContainerDaemonTest;

// Re-adopting pings every container's agent, on the driver's thread: the
// node answers meanwhile. The console's `status` is asked over one
// connection for as long as the restore runs; every answer comes within
// 100 ms, and some came while containers were still being re-adopted.
TEST_F(RestoreLatency, Kill9With2000ContainersTheConsoleAnswersWhileTheyAreReadopted) {
  constexpr int kCount = 2000;
  std::vector<Result<Sandbox>> boxes(kCount, Status::Internal("not created"));
  Parallel(kCount, 16, [&](int i) { boxes[i] = NewContainer(); });
  for (auto& b : boxes) {
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    made_.push_back(*b);
  }
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());
  ConsoleConn console(daemon_->admin_addr());
  ASSERT_TRUE(console.ok());
  ASSERT_TRUE(console.Send("AUTH " + daemon_->Token() + "\n"));
  ASSERT_NE(console.ReadLine().find("\"ok\":true"), std::string::npos);
  int during = 0, asked = 0;
  double slowest_ms = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(console.Send("status\n"));
    auto status = nlohmann::json::parse(console.ReadLine(), nullptr, false);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(status.is_object() && status.value("ok", false)) << status.dump();
    ++asked;
    slowest_ms = std::max(slowest_ms, ms);
    EXPECT_EQ(status.value("sandboxes", 0), kCount) << "the node knows every sandbox from the start";
    if (status.value("readopting", 0) == 0) break;
    ++during;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "re-adoption did not end: " << status.dump();
  }
  EXPECT_GT(during, 0) << "re-adoption was over before the first status: this proves nothing";
  EXPECT_LT(slowest_ms, 100.0) << "the slowest of " << asked << " status answers";
  std::printf("status asked %d times, %d while re-adopting; slowest answer %.1f ms\n", asked, during, slowest_ms);
  auto stats = daemon_->Admin("stats");
  EXPECT_EQ(stats["container"].value("containers", 0), kCount) << stats.dump();
  // A re-adopted container works.
  EXPECT_EQ(ShIn(*boxes[0], "echo alive").stdout(), "alive\n");
  Parallel(kCount, 16, [&](int i) { EXPECT_TRUE(boxes[i]->Destroy().ok()); });
  made_.clear();
  for (auto& b : boxes) EXPECT_EQ(Remains(b->id()), "");
}

}  // namespace
}  // namespace dsec::testing
