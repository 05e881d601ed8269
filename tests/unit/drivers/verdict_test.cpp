// The verdict of every kind: how ToExecResult turns the spawner's
// facts about a run (Outcome) into the ExecResult a trainer sees, including
// which verdict wins when several facts are true at once.
#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "drivers/verdict.hpp"
#include "drivers/run_outcome.pb.h"

namespace dsec::drivers {
namespace {

using ::testing::HasSubstr;
using run::Outcome;

v1::Limits TestLimits() {
  v1::Limits l;
  l.set_memory_bytes(256ull << 20);
  l.set_timeout_ms(2000);
  l.set_cpu_time_ms(1500);
  l.set_output_bytes(4096);
  return l;
}

v1::ExecResult Map(const Outcome& o) { return ToExecResult(o, TestLimits(), "python3"); }

// Outcomes as the spawner reports them.
Outcome Exited(int code) {
  Outcome o;
  o.set_exited(true);
  o.set_exit_code(code);
  return o;
}
Outcome Signaled(int sig) {
  Outcome o;
  o.set_signal(sig);
  return o;
}
Outcome ExecFailed(int err) {
  Outcome o = Exited(err == ENOENT ? 127 : 126);
  o.set_exec_errno(err);
  return o;
}

TEST(VerdictTest, ExitZeroIsOk) {
  auto r = Map(Exited(0));
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK);
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(r.signal(), 0);
  EXPECT_EQ(r.error(), "");
  EXPECT_FALSE(r.exec_failed());
}

TEST(VerdictTest, NonZeroExitIsRuntimeError) {
  auto r = Map(Exited(3));
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.signal(), 0);
  EXPECT_FALSE(r.exec_failed());
}

TEST(VerdictTest, SignalIsRuntimeErrorNamingTheSignal) {
  auto r = Map(Signaled(SIGSEGV));
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(r.signal(), SIGSEGV);
  EXPECT_THAT(r.error(), HasSubstr("signal"));
  EXPECT_THAT(r.error(), HasSubstr(strsignal(SIGSEGV)));
  EXPECT_FALSE(r.exec_failed());

  auto abrt = Map(Signaled(SIGABRT));
  EXPECT_EQ(abrt.signal(), SIGABRT);
  EXPECT_THAT(abrt.error(), HasSubstr(strsignal(SIGABRT)));
}

TEST(VerdictTest, CommandNotFoundIs127) {
  auto r = Map(ExecFailed(ENOENT));
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_TRUE(r.exec_failed());
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_EQ(r.error(), "python3: command not found");
}

TEST(VerdictTest, NotExecutableIs126) {
  auto r = Map(ExecFailed(EACCES));
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_TRUE(r.exec_failed());
  EXPECT_EQ(r.exit_code(), 126);
  EXPECT_THAT(r.error(), HasSubstr("python3: cannot execute"));
  EXPECT_THAT(r.error(), HasSubstr(std::strerror(EACCES)));
}

TEST(VerdictTest, ExecFailureExitCodeFollowsTheErrnoAlone) {
  // The shell convention is part of the verdict: an Outcome that carries
  // only the errno still reads as 127 / 126 to the trainer.
  Outcome enoent;
  enoent.set_exec_errno(ENOENT);
  auto r = Map(enoent);
  EXPECT_TRUE(r.exec_failed());
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_EQ(r.signal(), 0);

  Outcome enoexec;
  enoexec.set_exec_errno(ENOEXEC);
  r = Map(enoexec);
  EXPECT_TRUE(r.exec_failed());
  EXPECT_EQ(r.exit_code(), 126);
  EXPECT_THAT(r.error(), HasSubstr(std::strerror(ENOEXEC)));
}

TEST(VerdictTest, WallTimeoutIsTimeLimitNamingTheLimit) {
  Outcome o = Signaled(SIGKILL);
  o.set_timed_out(true);
  auto r = Map(o);
  EXPECT_EQ(r.verdict(), v1::VERDICT_TIME_LIMIT);
  EXPECT_THAT(r.error(), HasSubstr("wall-clock"));
  EXPECT_THAT(r.error(), HasSubstr("2000 ms"));
  EXPECT_EQ(r.signal(), SIGKILL);  // the facts stay visible under the verdict
  EXPECT_FALSE(r.exec_failed());
}

TEST(VerdictTest, CpuTimeIsTimeLimitNamingTheLimit) {
  Outcome o = Signaled(SIGKILL);
  o.set_cpu_time_exceeded(true);
  auto r = Map(o);
  EXPECT_EQ(r.verdict(), v1::VERDICT_TIME_LIMIT);
  EXPECT_THAT(r.error(), HasSubstr("CPU-time"));
  EXPECT_THAT(r.error(), HasSubstr("1500 ms"));
}

TEST(VerdictTest, OomIsMemoryLimitNamingTheLimit) {
  Outcome o = Signaled(SIGKILL);
  o.set_oom_killed(true);
  auto r = Map(o);
  EXPECT_EQ(r.verdict(), v1::VERDICT_MEMORY_LIMIT);
  EXPECT_THAT(r.error(), HasSubstr("256 MiB"));
}

TEST(VerdictTest, OomOfAChildBeatsACleanExit) {
  // The main process exited 0 but a child was OOM-killed: still a limit.
  Outcome o = Exited(0);
  o.set_oom_killed(true);
  EXPECT_EQ(Map(o).verdict(), v1::VERDICT_MEMORY_LIMIT);
}

TEST(VerdictTest, OutputLimitKeepsTruncatedOutputAndFlags) {
  Outcome o = Signaled(SIGKILL);
  o.set_output_exceeded(true);
  o.set_stdout(std::string(4096, 'y'));
  o.set_stdout_truncated(true);
  o.set_stderr("warning\n");
  o.set_stderr_truncated(false);
  auto r = Map(o);
  EXPECT_EQ(r.verdict(), v1::VERDICT_OUTPUT_LIMIT);
  EXPECT_THAT(r.error(), HasSubstr("4096 bytes"));
  EXPECT_EQ(r.stdout(), std::string(4096, 'y'));
  EXPECT_TRUE(r.stdout_truncated());
  EXPECT_EQ(r.stderr(), "warning\n");
  EXPECT_FALSE(r.stderr_truncated());

  o.set_stdout_truncated(false);
  o.set_stderr_truncated(true);
  r = Map(o);
  EXPECT_FALSE(r.stdout_truncated());
  EXPECT_TRUE(r.stderr_truncated());
}

TEST(VerdictTest, PlatformErrorCarriesTheSpawnersReason) {
  Outcome o;
  o.set_platform_error("clone: Resource temporarily unavailable");
  auto r = Map(o);
  EXPECT_EQ(r.verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_EQ(r.error(), "platform error: clone: Resource temporarily unavailable");
}

TEST(VerdictTest, KilledOnRequestIsPlatformErrorWithTheReason) {
  Outcome o = Signaled(SIGKILL);
  o.set_killed(true);
  o.set_kill_reason("sandbox sb-4 destroyed");
  auto r = Map(o);
  EXPECT_EQ(r.verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_EQ(r.error(), "killed: sandbox sb-4 destroyed");

  o.clear_kill_reason();
  EXPECT_EQ(Map(o).error(), "killed");
}

TEST(VerdictTest, MeasurementsAndOutputAreCopied) {
  Outcome o = Exited(0);
  o.set_stdout(std::string("out\0put", 7));
  o.set_stderr("err");
  o.set_cpu_us(1234);
  o.set_wall_us(5678);
  o.set_peak_memory_bytes(9ull << 20);
  auto r = Map(o);
  EXPECT_EQ(r.stdout(), std::string("out\0put", 7));
  EXPECT_EQ(r.stderr(), "err");
  EXPECT_FALSE(r.stdout_truncated());
  EXPECT_FALSE(r.stderr_truncated());
  EXPECT_EQ(r.cpu_us(), 1234u);
  EXPECT_EQ(r.wall_us(), 5678u);
  EXPECT_EQ(r.peak_memory_bytes(), 9ull << 20);
}

TEST(VerdictTest, LimitsInTheMessageAreTheRunsOwn) {
  v1::Limits l;
  l.set_timeout_ms(777);
  Outcome o = Signaled(SIGKILL);
  o.set_timed_out(true);
  EXPECT_THAT(ToExecResult(o, l, "x").error(), HasSubstr("777 ms"));
}

// When several facts are true, the first in this list decides the verdict:
// the platform's own failures, then the limits the run hit (wall time, CPU
// time, memory, output), then a failed exec, then the exit status.
TEST(VerdictTest, PrecedenceWhenSeveralFlagsAreSet) {
  struct Flag {
    const char* name;
    std::function<void(Outcome*)> set;
    v1::Verdict verdict;
    const char* error_part;
  };
  const std::vector<Flag> flags = {
      {"platform_error", [](Outcome* o) { o->set_platform_error("lost"); },
       v1::VERDICT_PLATFORM_ERROR, "platform error"},
      {"killed", [](Outcome* o) { o->set_killed(true); }, v1::VERDICT_PLATFORM_ERROR, "killed"},
      {"timed_out", [](Outcome* o) { o->set_timed_out(true); }, v1::VERDICT_TIME_LIMIT,
       "wall-clock"},
      {"cpu_time_exceeded", [](Outcome* o) { o->set_cpu_time_exceeded(true); },
       v1::VERDICT_TIME_LIMIT, "CPU-time"},
      {"oom_killed", [](Outcome* o) { o->set_oom_killed(true); }, v1::VERDICT_MEMORY_LIMIT,
       "memory limit"},
      {"output_exceeded", [](Outcome* o) { o->set_output_exceeded(true); },
       v1::VERDICT_OUTPUT_LIMIT, "output limit"},
      {"exec_errno", [](Outcome* o) { o->set_exec_errno(ENOENT); }, v1::VERDICT_RUNTIME_ERROR,
       "command not found"},
  };
  for (size_t first = 0; first < flags.size(); ++first) {
    SCOPED_TRACE(std::string("highest flag set: ") + flags[first].name);
    Outcome o = Signaled(SIGKILL);
    for (size_t i = first; i < flags.size(); ++i) flags[i].set(&o);
    auto r = Map(o);
    EXPECT_EQ(r.verdict(), flags[first].verdict) << v1::Verdict_Name(r.verdict());
    EXPECT_THAT(r.error(), HasSubstr(flags[first].error_part));
    EXPECT_EQ(r.exec_failed(), std::string(flags[first].name) == "exec_errno");

    // Each flag on its own gives its verdict too.
    Outcome alone = Signaled(SIGKILL);
    flags[first].set(&alone);
    EXPECT_EQ(Map(alone).verdict(), flags[first].verdict);
  }
}

}  // namespace
}  // namespace dsec::drivers
