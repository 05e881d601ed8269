// Supervision: a sandbox or session actor that crashes (injected through the
// test-only hook) is restarted from its checkpoint; past the restart
// intensity it is left failed. Restarts show on the admin console.
#include <gmock/gmock.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using Supervision = DaemonTest;

// Crashes `id` and waits (20 s at most) until the node reports the restart
// (or failure); the last record seen.
nlohmann::json CrashAndWait(TestDaemon& d, const std::string& id, const std::string& kind, uint32_t restarts) {
  auto j = d.Admin("crash " + id);
  EXPECT_TRUE(j.value("ok", false)) << j.dump();
  nlohmann::json rec;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    auto ins = d.Admin("inspect " + id);
    if (ins.value("ok", false)) {
      rec = ins[kind];
      if (rec.value("restarts", 0u) >= restarts || rec.value("phase", "") == "failed")
        return rec;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the node, bounded
  }
  ADD_FAILURE() << id << " did not restart (" << restarts << ") nor fail within 20 s: " << rec.dump();
  return rec;
}

TEST_F(Supervision, CrashedSandboxIsRestartedFromItsCheckpoint) {
  auto sb = client_->Create(FncallSpec());
  ASSERT_TRUE(sb.ok());
  auto rec = CrashAndWait(*daemon_, sb->id(), "sandbox", 1);
  EXPECT_EQ(rec.value("restarts", 0), 1) << rec.dump();
  auto r = sb->Exec(Command({"echo", "back"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "back\n");
  EXPECT_GE(daemon_->Admin("stats").value("supervisor_restarts", 0), 1);
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_F(Supervision, SandboxThatKeepsCrashingIsLeftFailed) {
  auto sb = client_->Create(FncallSpec());
  ASSERT_TRUE(sb.ok());
  nlohmann::json rec;
  for (uint32_t i = 1; i <= 4; ++i) rec = CrashAndWait(*daemon_, sb->id(), "sandbox", i);
  EXPECT_EQ(rec.value("phase", ""), "failed") << rec.dump();
  EXPECT_EQ(rec.value("restarts", 0), 3) << "each restart counts, in the record as well: " << rec.dump();
  EXPECT_THAT(rec.value("error", ""), HasSubstr("crashed"));
  auto r = sb->Exec(Command({"true"}));
  EXPECT_FALSE(r.ok() && r->verdict() == v1::VERDICT_OK);
  EXPECT_GE(daemon_->Admin("stats").value("supervisor_gave_up", 0), 1);
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_F(Supervision, CrashedSessionKeepsItsLog) {
  auto s = client_->OpenSession("supervision/p/0", FncallSpec());
  ASSERT_TRUE(s.ok());
  auto first = s->Step(0, Command({"cat", "/proc/sys/kernel/random/uuid"}));
  ASSERT_TRUE(first.ok());
  auto rec = CrashAndWait(*daemon_, "supervision/p/0", "session", 1);
  EXPECT_EQ(rec.value("restarts", 0), 1) << rec.dump();
  auto replay = s->Step(0, Command({"cat", "/proc/sys/kernel/random/uuid"}));
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(replay->fast_forwarded());
  EXPECT_EQ(replay->step().result().stdout(), first->step().result().stdout());
  auto next = s->Step(1, Command({"echo", "one"}));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "one\n");
}

// A batched annotation is a one-way message to the session actor; one the
// crashed actor held (here behind its running step) is still answered, at
// once and saying to send it again, not left to run into its deadline.
TEST_F(Supervision, ABatchedAnnotationHeldByACrashedSessionIsAnswered) {
  auto s = client_->OpenSession("supervision/p/1", FncallSpec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // A step that outlasts the test: the crash, not its end, must answer it.
  auto running = s->StepAsync(0, Command({"sleep", "20"}));
  v1::StepMeta meta;
  meta.set_reward(1);
  auto held = s->AnnotateAsync(0, meta);  // waits behind the running step
  // Calls reach the session in order: once this is answered, the
  // annotation is in the session actor's hands.
  ASSERT_TRUE(s->Get().ok());
  ASSERT_EQ(running.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the step is no longer running";
  ASSERT_EQ(held.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the annotation was not held";
  auto t0 = std::chrono::steady_clock::now();
  CrashAndWait(*daemon_, "supervision/p/1", "session", 1);
  ASSERT_EQ(held.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the annotation was left to its 30 s deadline";
  auto r = held.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("session supervision/p/1: annotation of step 0"));
  EXPECT_THAT(r.status().message(), HasSubstr("send it again"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  // The step the crashed actor held is answered too, long before its end.
  ASSERT_EQ(running.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the step was left to its end";
  auto step = running.get();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), Status::Code::kUnavailable) << step.status().ToString();
}

}  // namespace
}  // namespace dsec::testing
