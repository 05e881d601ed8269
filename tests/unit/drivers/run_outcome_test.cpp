// run::Outcome is the one account of a run; its fields 1-14 are the
// ExecDone of earlier agents. Containers outlive dsecd, so an agent
// started by an older dsecd answers a newer one: each reads the other's
// bytes field for field.
#include <gtest/gtest.h>

#include "drivers/run_outcome.pb.h"
#include "tests/unit/drivers/exec_done_v0.pb.h"

namespace dsec {
namespace {

TEST(RunOutcome, AnOldAgentsExecDoneReadsAsTheSameOutcome) {
  test::v0::ExecDone old;
  old.set_exited(true);
  old.set_exit_code(3);
  old.set_signal(0);
  old.set_timed_out(true);
  old.set_output_exceeded(true);
  old.set_exec_errno(2);
  old.set_stdout("out\xff");
  old.set_stderr("err");
  old.set_stdout_truncated(true);
  old.set_stderr_truncated(true);
  old.set_cpu_us(123456789012ull);
  old.set_wall_us(42);
  old.set_peak_rss_bytes(1ull << 33);
  old.set_error("exec: cannot enter the working directory '/x': No such file or directory");
  run::Outcome now;
  ASSERT_TRUE(now.ParseFromString(old.SerializeAsString()));
  EXPECT_TRUE(now.exited());
  EXPECT_EQ(now.exit_code(), 3);
  EXPECT_TRUE(now.timed_out());
  EXPECT_TRUE(now.output_exceeded());
  EXPECT_EQ(now.exec_errno(), 2);
  EXPECT_EQ(now.stdout(), "out\xff");
  EXPECT_EQ(now.stderr(), "err");
  EXPECT_TRUE(now.stdout_truncated());
  EXPECT_TRUE(now.stderr_truncated());
  EXPECT_EQ(now.cpu_us(), 123456789012ull);
  EXPECT_EQ(now.wall_us(), 42u);
  EXPECT_EQ(now.peak_memory_bytes(), 1ull << 33);
  EXPECT_EQ(now.user_error(), old.error());
  // Nothing of the host's side is made up from an old agent's bytes.
  EXPECT_FALSE(now.oom_killed() || now.killed() || now.cpu_time_exceeded());
  EXPECT_TRUE(now.platform_error().empty());
}

TEST(RunOutcome, AnOlderDsecdReadsANewAgentsOutcomeAndSkipsWhatItDoesNotKnow) {
  run::Outcome now;
  now.set_exited(false);
  now.set_signal(9);
  now.set_stdout("partial");
  now.set_peak_memory_bytes(4096);
  now.set_user_error("exec: set resource limits: Operation not permitted");
  now.set_oom_killed(true);  // host-side fields: unknown to an older reader
  now.set_platform_error("lost");
  test::v0::ExecDone old;
  ASSERT_TRUE(old.ParseFromString(now.SerializeAsString()));
  EXPECT_FALSE(old.exited());
  EXPECT_EQ(old.signal(), 9);
  EXPECT_EQ(old.stdout(), "partial");
  EXPECT_EQ(old.peak_rss_bytes(), 4096u);
  EXPECT_EQ(old.error(), now.user_error());
}

}  // namespace
}  // namespace dsec
