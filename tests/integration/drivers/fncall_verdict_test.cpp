// fncall verdicts against real sandboxes: every verdict a run can end with.
#include <signal.h>

#include <gmock/gmock.h>

#include "drivers/fncall/fncall_driver.hpp"
#include "tests/support/fncall_fixture.hpp"

namespace dsec::testing {
namespace {

using Verdicts = FncallTest;

TEST_F(Verdicts, OkWithStdoutAndExitCode) {
  auto r = Run({"python3", "-c", "print(6*7)"});
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(r.stdout(), "42\n");
  EXPECT_GT(r.wall_us(), 0u);
}

TEST_F(Verdicts, NonZeroExitIsRuntimeErrorWithItsCode) {
  auto r = Sh("echo oops >&2; exit 3");
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.stderr(), "oops\n");
}

TEST_F(Verdicts, StdinIsPassedThrough) {
  auto r = Run({"tr", "a-z", "A-Z"}, {}, "hello sandbox\n");
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
  EXPECT_EQ(r.stdout(), "HELLO SANDBOX\n");
}

TEST_F(Verdicts, LargeStdinIsPassedThrough) {
  std::string big(3 << 20, 'x');
  auto r = Run({"wc", "-c"}, {}, big);
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
  EXPECT_EQ(r.stdout(), std::to_string(big.size()) + "\n");
}

TEST_F(Verdicts, CpuBoundLoopHitsTheWallLimit) {
  v1::Limits l;
  l.set_timeout_ms(500);
  auto r = Sh("while :; do :; done", l);
  EXPECT_EQ(r.verdict(), v1::VERDICT_TIME_LIMIT) << r.error();
  EXPECT_GE(r.wall_us(), 500'000u);
  EXPECT_LT(r.wall_us(), 5'000'000u);
}

TEST_F(Verdicts, SleepPastTheWallLimit) {
  v1::Limits l;
  l.set_timeout_ms(300);
  auto r = Run({"sleep", "30"}, l);
  EXPECT_EQ(r.verdict(), v1::VERDICT_TIME_LIMIT) << r.error();
  EXPECT_LT(r.wall_us(), 5'000'000u);
}

TEST_F(Verdicts, CpuTimeLimit) {
  v1::Limits l;
  l.set_cpu_time_ms(1000);
  l.set_timeout_ms(20'000);
  auto r = Sh("while :; do :; done", l);
  EXPECT_EQ(r.verdict(), v1::VERDICT_TIME_LIMIT) << r.error();
  EXPECT_GE(r.cpu_us(), 900'000u);
}

TEST_F(Verdicts, CpuTimeLimitCoversEveryProcessOfTheRun) {
  // Four busy children, each below the limit on its own: RLIMIT_CPU alone
  // (per process) would let them run until the wall clock.
  v1::Limits l;
  l.set_cpu_time_ms(1000);
  l.set_timeout_ms(30'000);
  auto r = Sh("for i in 1 2 3 4; do (while :; do :; done) & done; wait", l);
  EXPECT_EQ(r.verdict(), v1::VERDICT_TIME_LIMIT) << r.error();
  EXPECT_THAT(r.error(), ::testing::HasSubstr("CPU-time"));
  EXPECT_LT(r.wall_us(), 10'000'000u);
}

TEST_F(Verdicts, MissingWorkingDirectoryIsTheRequestsFault) {
  v1::ExecRequest req;
  req.add_argv("true");
  req.set_cwd("/no/such/dir");
  v1::SandboxRecord sb;
  *req.mutable_limits() = *drivers::EffectiveLimits(drivers::LimitPolicy::Default(), drivers::FncallDriver::Traits(), sb.spec(), req);
  std::promise<Result<v1::ExecResult>> p;
  auto f = p.get_future();
  driver_->Exec(sb, "bad-cwd", req, [&p](Result<v1::ExecResult> r) { p.set_value(std::move(r)); });
  auto r = f.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(r->exit_code(), 126);
  EXPECT_TRUE(r->exec_failed());
  EXPECT_THAT(r->error(), ::testing::HasSubstr("working directory"));
}

TEST_F(Verdicts, AllocatingBeyondTheMemoryLimit) {
  v1::Limits l;
  l.set_memory_bytes(64ull << 20);
  auto r = Run({"python3", "-c", "x = bytearray(256 * 1024 * 1024); print(len(x))"}, l);
  EXPECT_EQ(r.verdict(), v1::VERDICT_MEMORY_LIMIT) << r.error();
  EXPECT_EQ(r.stdout(), "");
}

TEST_F(Verdicts, StdoutFloodIsCutAtTheCap) {
  v1::Limits l;
  l.set_output_bytes(64 << 10);
  auto r = Run({"yes", "flood"}, l);
  EXPECT_EQ(r.verdict(), v1::VERDICT_OUTPUT_LIMIT) << r.error();
  EXPECT_TRUE(r.stdout_truncated());
  EXPECT_EQ(r.stdout().size(), 64u << 10);
  EXPECT_FALSE(r.stderr_truncated());
  // The driver is still healthy afterwards.
  EXPECT_EQ(Run({"true"}).verdict(), v1::VERDICT_OK);
}

TEST_F(Verdicts, KilledBySignalIsRuntimeError) {
  auto r = Sh("kill -SEGV $$");
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR) << r.error();
  EXPECT_EQ(r.signal(), SIGSEGV);
}

TEST_F(Verdicts, CommandNotFoundIs127) {
  auto r = Run({"no-such-command-xyz"});
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_TRUE(r.exec_failed());
  EXPECT_NE(r.error().find("command not found"), std::string::npos) << r.error();
}

TEST_F(Verdicts, NotExecutableIs126) {
  auto r = Run({"/etc/passwd"});
  EXPECT_EQ(r.exit_code(), 126);
  EXPECT_TRUE(r.exec_failed());
}

TEST_F(Verdicts, ReportsCpuAndPeakMemory) {
  auto r = Run({"python3", "-c", "x = bytearray(40 * 1024 * 1024); sum(range(3000000))"});
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
  EXPECT_GE(r.peak_memory_bytes(), 40ull << 20);
  EXPECT_GT(r.cpu_us(), 10'000u);
}

TEST_F(Verdicts, KillStopsARunInFlight) {
  v1::ExecRequest req;
  req.add_argv("sleep");
  req.add_argv("60");
  v1::SandboxRecord sb;
  *req.mutable_limits() = *drivers::EffectiveLimits(drivers::LimitPolicy::Default(), drivers::FncallDriver::Traits(), sb.spec(), req);
  std::promise<Result<v1::ExecResult>> p;
  auto f = p.get_future();
  driver_->Exec(sb, "kill-me", req, [&p](Result<v1::ExecResult> r) { p.set_value(std::move(r)); });
  // Kill may race the spawner receiving the run; retry until it is known.
  Status st;
  for (int i = 0; i < 1000; ++i) {
    st = driver_->Kill("kill-me", "test");
    if (st.ok()) break;
  }
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto r = f.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_NE(r->error().find("killed"), std::string::npos) << r->error();
}

TEST_F(Verdicts, ManyConcurrentRunsAllComplete) {
  std::vector<std::future<Result<v1::ExecResult>>> fs;
  std::vector<std::shared_ptr<std::promise<Result<v1::ExecResult>>>> ps;
  for (int i = 0; i < 200; ++i) {
    v1::ExecRequest req;
    req.add_argv("echo");
    req.add_argv(std::to_string(i));
    v1::SandboxRecord sb;
    *req.mutable_limits() = *drivers::EffectiveLimits(drivers::LimitPolicy::Default(), drivers::FncallDriver::Traits(), sb.spec(), req);
    auto p = std::make_shared<std::promise<Result<v1::ExecResult>>>();
    fs.push_back(p->get_future());
    driver_->Exec(sb, "many-" + std::to_string(i), req,
                  [p](Result<v1::ExecResult> r) { p->set_value(std::move(r)); });
    ps.push_back(p);
  }
  for (int i = 0; i < 200; ++i) {
    auto r = fs[i].get();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->verdict(), v1::VERDICT_OK) << r->error();
    EXPECT_EQ(r->stdout(), std::to_string(i) + "\n");
  }
}

}  // namespace
}  // namespace dsec::testing
