// Fork bombs against the pids limit: a bomb ends with its run and leaves the
// host able to fork and to run the next sandbox; forking stops at the limit
// with EAGAIN.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>

#include "tests/support/fncall_fixture.hpp"

extern char** environ;

namespace dsec::testing {
namespace {

using ForkBomb = FncallTest;

constexpr uint32_t kPids = 32;

v1::Limits BombLimits() {
  v1::Limits l;
  l.set_pids(kPids);
  l.set_timeout_ms(2000);
  return l;
}

// The host is unharmed: this process can still fork and spawn, and `next`,
// the sandbox run after the bomb, worked.
void ExpectHostUnharmed(const v1::ExecResult& next) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0) << "the test process cannot fork after the bomb: " << std::strerror(errno);
  if (child == 0) ::_exit(7);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7) << "wait status " << st;

  pid_t spawned = -1;
  char* argv[] = {const_cast<char*>("true"), nullptr};
  ASSERT_EQ(::posix_spawnp(&spawned, "true", nullptr, nullptr, argv, environ), 0);
  ASSERT_EQ(::waitpid(spawned, &st, 0), spawned);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;

  EXPECT_EQ(next.verdict(), v1::VERDICT_OK) << next.error();
  EXPECT_EQ(next.stdout(), "still here\n");
}

void ExpectBombEnded(const v1::ExecResult& r) {
  EXPECT_TRUE(r.verdict() == v1::VERDICT_TIME_LIMIT || r.verdict() == v1::VERDICT_RUNTIME_ERROR)
      << "verdict " << v1::Verdict_Name(r.verdict()) << ": " << r.error();
}

TEST_F(ForkBomb, ShellFunctionBombEndsAndTheHostSurvives) {
  // The classic bomb, restarted forever by the top-level shell so it never
  // dies out on its own: the run ends by its limits, the wall clock or the
  // shell giving up when fork fails at the pids limit.
  auto r = Sh("bomb() { bomb | bomb & }; while :; do bomb; done", BombLimits());
  ExpectBombEnded(r);
  // The bomb did run into the pids limit (dash says "Cannot fork").
  EXPECT_NE(r.stderr().find("fork"), std::string::npos) << r.stderr().substr(0, 2000);
  ExpectHostUnharmed(Run({"echo", "still here"}));
}

TEST_F(ForkBomb, PythonForkLoopEndsAndTheHostSurvives) {
  // Every process forks forever and never exits; failed forks are retried.
  auto r = Run({"python3", "-c",
                "import os\n"
                "while True:\n"
                "    try:\n"
                "        os.fork()\n"
                "    except OSError:\n"
                "        pass\n"},
               BombLimits());
  ExpectBombEnded(r);
  ExpectHostUnharmed(Run({"echo", "still here"}));
}

TEST_F(ForkBomb, ForkingStopsAtThePidsLimitWithEagain) {
  // Children sleep, so every successful fork holds a pid until the run ends.
  auto r = Run({"python3", "-c",
                "import errno, os, time\n"
                "n, err = 0, None\n"
                "while n < 100000:\n"
                "    try:\n"
                "        pid = os.fork()\n"
                "    except OSError as e:\n"
                "        err = e.errno\n"
                "        break\n"
                "    if pid == 0:\n"
                "        time.sleep(60)\n"
                "        os._exit(0)\n"
                "    n += 1\n"
                "print(n, errno.errorcode.get(err, err), flush=True)\n"
                "os._exit(0)\n"},
               BombLimits());
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  std::istringstream out(r.stdout());
  long forks = -1;
  std::string err;
  out >> forks >> err;
  RecordProperty("forks_before_failure", static_cast<int>(forks));
  EXPECT_LE(forks, static_cast<long>(kPids)) << r.stdout();
  // The program did fork a good part of its allowance before it was stopped.
  EXPECT_GE(forks, static_cast<long>(kPids) / 2) << r.stdout();
  EXPECT_EQ(err, "EAGAIN") << r.stdout();
  ExpectHostUnharmed(Run({"echo", "still here"}));
}

}  // namespace
}  // namespace dsec::testing
