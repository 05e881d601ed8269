// The minimal rollout session of the foundation: idempotent open, steps in
// order, fast-forward from the durable log, errors for gaps and mismatches.
#include <gmock/gmock.h>

#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using Sessions = DaemonTest;

// A step whose output differs on every execution, so a fast-forward (which
// returns the logged output) is told apart from a re-run.
v1::ExecRequest Stamp() { return Command({"sh", "-c", "cat /proc/sys/kernel/random/uuid"}); }

TEST_F(Sessions, StepsRunInOrderAndReplayFastForwards) {
  auto s = client_->OpenSession("job1/prompt1/s0", FncallSpec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<std::string> outputs;
  for (uint64_t i = 0; i < 5; ++i) {
    auto r = s->Step(i, Stamp());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->fast_forwarded());
    EXPECT_EQ(r->step().index(), i);
    outputs.push_back(r->step().result().stdout());
  }
  EXPECT_NE(outputs[0], outputs[1]);
  // A restarted trainer replays from 0: answered from the log, not re-run.
  auto again = client_->OpenSession("job1/prompt1/s0", FncallSpec());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (uint64_t i = 0; i < 5; ++i) {
    auto r = again->Step(i, Stamp());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->fast_forwarded());
    EXPECT_EQ(r->step().result().stdout(), outputs[i]);
  }
  auto next = again->Step(5, Stamp());
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->fast_forwarded());
  auto rec = again->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->step_count(), 6u);
}

TEST_F(Sessions, ReplayWithADifferentRequestNamesSessionAndStep) {
  auto s = client_->OpenSession("job1/prompt2/s0", FncallSpec());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Step(0, Command({"echo", "a"})).ok());
  auto r = s->Step(0, Command({"echo", "b"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("job1/prompt2/s0"));
  EXPECT_THAT(r.status().message(), HasSubstr("step 0"));
}

TEST_F(Sessions, AGapIsAnError) {
  auto s = client_->OpenSession("job1/prompt3/s0", FncallSpec());
  ASSERT_TRUE(s.ok());
  auto r = s->Step(3, Command({"true"}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("ahead of the log"));
  EXPECT_THAT(r.status().message(), HasSubstr("job1/prompt3/s0"));
}

TEST_F(Sessions, ReopenWithAnotherSpecIsRefused) {
  ASSERT_TRUE(client_->OpenSession("job1/prompt4/s0", FncallSpec()).ok());
  v1::SandboxSpec other = FncallSpec();
  other.mutable_limits()->set_memory_bytes(64 << 20);
  auto r = client_->OpenSession("job1/prompt4/s0", other);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("different spec"));
}

TEST_F(Sessions, ClosedSessionRefusesSteps) {
  auto s = client_->OpenSession("job1/prompt5/s0", FncallSpec());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Step(0, Command({"true"})).ok());
  ASSERT_TRUE(s->Close().ok());
  auto r = s->Step(1, Command({"true"}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("closed"));
}

TEST_F(Sessions, AttachToUnknownSessionIsNotFound) {
  auto s = client_->AttachSession("never/opened/0");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kNotFound);
}

}  // namespace
}  // namespace dsec::testing
