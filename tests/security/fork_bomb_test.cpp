// Fork bombs against the pids limit: a bomb ends with its run and leaves the
// host able to fork and to run the next sandbox; forking stops at the limit
// with EAGAIN. The memory limit is far above what the bombs use, and its
// failure would be ENOMEM: only the pids limit explains EAGAIN.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>

#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"


namespace dsec::testing {
namespace {

using ForkBomb = FncallTest;

constexpr uint32_t kPids = 32;

v1::Limits BombLimits() {
  v1::Limits l;
  l.set_pids(kPids);
  l.set_memory_bytes(2ull << 30);  // out of reach of kPids small processes
  l.set_timeout_ms(2000);
  return l;
}

// The host is unharmed: this process can still fork and spawn, and `next`,
// the sandbox run after the bomb, worked.
void ExpectHostUnharmed(const v1::ExecResult& next) {
  ExpectHostCanFork();
  EXPECT_EQ(next.verdict(), v1::VERDICT_OK) << next.error();
  EXPECT_EQ(next.stdout(), "still here\n");
}

void ExpectBombEnded(const v1::ExecResult& r) {
  EXPECT_TRUE(r.verdict() == v1::VERDICT_TIME_LIMIT || r.verdict() == v1::VERDICT_RUNTIME_ERROR)
      << "verdict " << v1::Verdict_Name(r.verdict()) << ": " << r.error();
}

TEST_F(ForkBomb, ShellFunctionBombEndsAndTheHostSurvives) {
  // bash, not dash: it names the errno when fork fails ("fork: retry:
  // Resource temporarily unavailable" for EAGAIN, "Cannot allocate memory"
  // for ENOMEM), where dash only says "Cannot fork".
  if (::access("/bin/bash", X_OK) != 0) GTEST_SKIP() << "no /bin/bash on this host (fncall runs the host's)";
  // The classic bomb, restarted forever by the top-level shell so it never
  // dies out on its own: the run ends by its limits, the wall clock or the
  // shell giving up when fork fails at the pids limit.
  auto r = Run({"/bin/bash", "-c", "bomb() { bomb | bomb & }; while :; do bomb; done"}, BombLimits());
  ExpectBombEnded(r);
  // The bomb ran into the pids limit, not the memory limit.
  EXPECT_NE(r.stderr().find("fork: retry: Resource temporarily unavailable"), std::string::npos)
      << r.stderr().substr(0, 2000);
  EXPECT_EQ(r.stderr().find("Cannot allocate memory"), std::string::npos) << r.stderr().substr(0, 2000);
  ExpectHostUnharmed(Run({"echo", "still here"}));
}

TEST_F(ForkBomb, PythonForkLoopEndsAndTheHostSurvives) {
  // Every process forks forever and never exits; failed forks are retried.
  // Each says why its first fork failed.
  auto r = Run({"python3", "-c",
                "import errno, os, sys\n"
                "said = False\n"
                "while True:\n"
                "    try:\n"
                "        os.fork()\n"
                "    except OSError as e:\n"
                "        if not said:\n"
                "            said = True\n"
                "            print(errno.errorcode.get(e.errno, e.errno), file=sys.stderr, flush=True)\n"},
               BombLimits());
  ExpectBombEnded(r);
  // Forks failed, and only at the pids limit.
  std::istringstream why(r.stderr());
  int failures = 0;
  for (std::string line; std::getline(why, line); ++failures) EXPECT_EQ(line, "EAGAIN");
  EXPECT_GT(failures, 0) << "no fork failed: the bomb never reached the pids limit";
  ExpectHostUnharmed(Run({"echo", "still here"}));
}

TEST_F(ForkBomb, ForkingStopsAtThePidsLimitWithEagain) {
  // Children sleep, so every successful fork holds a pid until the run ends.
  // When a fork fails, the program counts the tasks of its pid namespace,
  // which are those of the run's cgroup: the runner (pid 1, counted in the
  // group's pids.max of kPids + 1), the program and its children.
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
                "tasks = sum(len(os.listdir('/proc/%s/task' % p)) for p in os.listdir('/proc') if p.isdigit())\n"
                "print(n, errno.errorcode.get(err, err), tasks, flush=True)\n"
                "os._exit(0)\n"},
               BombLimits());
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  std::istringstream out(r.stdout());
  long forks = -1, tasks = -1;
  std::string err;
  out >> forks >> err >> tasks;
  RecordProperty("forks_before_failure", static_cast<int>(forks));
  // Refused exactly at the limit, with the pids controller's EAGAIN (the
  // memory limit, far away, would say ENOMEM).
  EXPECT_EQ(err, "EAGAIN") << r.stdout();
  EXPECT_EQ(tasks, static_cast<long>(kPids) + 1) << "tasks in the run when fork failed: " << r.stdout();
  EXPECT_EQ(forks, static_cast<long>(kPids) - 1) << "children forked: " << r.stdout();
  ExpectHostUnharmed(Run({"echo", "still here"}));
}

}  // namespace
}  // namespace dsec::testing
