// Fork bombs against the pids limit, once per registered kind: a bomb stays
// inside its limit, ends with its exec and leaves behind no process of its
// own; the host can still fork, another sandbox of the kind works while the
// bomb runs, and the bomb's own sandbox answers the next exec; forking stops
// exactly at the limit with EAGAIN. The memory limit is far above what the
// bombs use, and its failure would be ENOMEM: only the pids limit explains
// EAGAIN. A new kind is tested by being registered.
//
// The limits are in the sandbox's spec, where every kind takes them. They
// mean the same count in both kinds here, though not for the same thing:
// fncall gives each run its own pids group of kPids + 1 (the run's runner,
// its PID 1, and kPids for the program), the container one group of
// kPids + 1 for the whole sandbox (its agent, PID 1, single-threaded, and
// kPids for every exec together). Each test runs one exec at a time in its
// sandbox, so in both the exec has kPids pids beside PID 1. The wall clock
// is per exec in every kind, so it is set on the bombs' execs.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/kind_sandbox_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

constexpr uint32_t kPids = 32;

// Python: every process forks forever and never exits; failed forks are
// retried. Each says (on stderr) why its first fork failed.
constexpr const char* kForkLoop =
    "import errno, os, sys\n"
    "said = False\n"
    "while True:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError as e:\n"
    "        if not said:\n"
    "            said = True\n"
    "            print(errno.errorcode.get(e.errno, e.errno), file=sys.stderr, flush=True)\n";

class SandboxForkBomb : public KindSandboxTest {
 protected:
  v1::Limits SpecLimits() const override {
    v1::Limits l;
    l.set_pids(kPids);
    l.set_memory_bytes(2ull << 30);  // out of reach of kPids small processes
    return l;
  }

  // An argument no other process on the host has: every process of a bomb
  // carries it (forks keep their argv), so the host can count them.
  static std::string Marker() {
    return "dsec-fork-bomb-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
  }

  static v1::ExecRequest Bomb(std::vector<std::string> argv, uint32_t timeout_ms) {
    v1::ExecRequest req = Command(std::move(argv));
    req.mutable_limits()->set_timeout_ms(timeout_ms);
    return req;
  }

  static void ExpectBombEnded(const v1::ExecResult& r) {
    EXPECT_TRUE(r.verdict() == v1::VERDICT_TIME_LIMIT || r.verdict() == v1::VERDICT_RUNTIME_ERROR)
        << "verdict " << v1::Verdict_Name(r.verdict()) << ": " << r.error();
  }

  // The host is unharmed: this process can still fork and spawn; the bomb's
  // own sandbox answers the next exec (in a kind whose processes outlive
  // their exec, a bomb left running would hold every pid it may have); and
  // no process of the bomb (`marker`) is left on the host.
  void ExpectHostAndSandboxUnharmed(const std::string& marker) {
    ExpectHostCanFork();
    auto next = Run({"echo", "still here"});
    EXPECT_EQ(next.verdict(), v1::VERDICT_OK) << next.error() << "\n" << next.stderr();
    EXPECT_EQ(next.stdout(), "still here\n");
    EXPECT_TRUE(HostProcessesWithArg(marker).empty()) << "processes of the bomb outlived its exec";
  }
};

TEST_P(SandboxForkBomb, ShellFunctionBombEndsAndTheHostSurvives) {
  // bash, not dash: it names the errno when fork fails ("fork: retry:
  // Resource temporarily unavailable" for EAGAIN, "Cannot allocate memory"
  // for ENOMEM), where dash only says "Cannot fork".
  if (::access("/bin/bash", X_OK) != 0)
    GTEST_SKIP() << "no /bin/bash on this host (fncall runs the host's; the tools image is made of the host's)";
  const std::string marker = Marker();
  // The classic bomb, restarted forever by the top-level shell so it never
  // dies out on its own: its exec ends by the wall clock. bash retries a
  // failed fork after 1, 2, 4 and 8 s before it gives up; 2 s is well
  // before that, so the top-level shell is still there to be killed with
  // its whole process group. (`marker` is the script's $0.)
  auto r = Run(Bomb({"/bin/bash", "-c", "bomb() { bomb | bomb & }; while :; do bomb; done", marker}, 2000));
  ExpectBombEnded(r);
  // The bomb ran into the pids limit, not the memory limit.
  EXPECT_NE(r.stderr().find("fork: retry: Resource temporarily unavailable"), std::string::npos)
      << r.stderr().substr(0, 2000);
  EXPECT_EQ(r.stderr().find("Cannot allocate memory"), std::string::npos) << r.stderr().substr(0, 2000);
  ExpectHostAndSandboxUnharmed(marker);
}

TEST_P(SandboxForkBomb, PythonForkLoopStaysInsideItsPidsLimitAndEnds) {
  // Made before the bomb: what runs beside the bomb is an exec, not the
  // making of a sandbox.
  auto other = NewSandbox();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  const std::string marker = Marker();
  auto bomb = sb_->ExecAsync(Bomb({"python3", "-c", kForkLoop, marker}, 5000));
  // Watch the host's processes until the bomb has filled its limit (or its
  // exec ended): kPids of them, PID 1 of its sandbox being the other pid.
  size_t peak = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (peak < kPids && std::chrono::steady_clock::now() < deadline &&
         bomb.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready)
    peak = std::max(peak, HostProcessesWithArg(marker).size());
  EXPECT_EQ(peak, kPids) << "processes of the bomb seen at once on the host (the limit allows " << kPids << ")";

  // While the bomb runs: another sandbox of the kind and the host work,
  // and the bomb has no more processes than its limit allows.
  auto next = Exec(*other, Command({"echo", "still here"}));
  EXPECT_EQ(next.verdict(), v1::VERDICT_OK) << next.error() << "\n" << next.stderr();
  EXPECT_EQ(next.stdout(), "still here\n");
  ExpectHostCanFork();
  EXPECT_LE(HostProcessesWithArg(marker).size(), kPids) << "more processes of the bomb than its limit allows";
  EXPECT_NE(bomb.wait_for(std::chrono::seconds(0)), std::future_status::ready)
      << "the bomb ended before the checks beside it were done: they proved nothing";

  // The bomb ends by its wall clock.
  ASSERT_EQ(bomb.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the bomb's exec never ended";
  auto r = bomb.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectBombEnded(*r);
  // Forks failed, and only at the pids limit.
  std::istringstream why(r->stderr());
  int failures = 0;
  for (std::string line; std::getline(why, line); ++failures) EXPECT_EQ(line, "EAGAIN");
  EXPECT_GT(failures, 0) << "no fork failed: the bomb never reached the pids limit";
  ExpectHostAndSandboxUnharmed(marker);
}

TEST_P(SandboxForkBomb, ForkingStopsAtThePidsLimitWithEagain) {
  // Children sleep, so every successful fork holds a pid until it is
  // killed. When a fork fails, the program counts the tasks of its pid
  // namespace, which are those of the pids group: PID 1 (fncall's runner,
  // the container's agent; counted in pids.max of kPids + 1), the program
  // and its children. Then it kills and reaps its children itself: in a
  // kind whose processes outlive their exec they would go on holding the
  // sandbox's pids. The wall clock only bounds a program that ends by itself.
  const std::string marker = Marker();
  auto r = Run(Bomb({"python3", "-c",
                     "import errno, os, signal, time\n"
                     "kids, err = [], None\n"
                     "while len(kids) < 100000:\n"
                     "    try:\n"
                     "        pid = os.fork()\n"
                     "    except OSError as e:\n"
                     "        err = e.errno\n"
                     "        break\n"
                     "    if pid == 0:\n"
                     "        time.sleep(60)\n"
                     "        os._exit(0)\n"
                     "    kids.append(pid)\n"
                     "tasks = sum(len(os.listdir('/proc/%s/task' % p)) for p in os.listdir('/proc') if p.isdigit())\n"
                     "print(len(kids), errno.errorcode.get(err, err), tasks, flush=True)\n"
                     "for pid in kids:\n"
                     "    os.kill(pid, signal.SIGKILL)\n"
                     "for pid in kids:\n"
                     "    os.waitpid(pid, 0)\n",
                     marker},
                    10000));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  std::istringstream out(r.stdout());
  long forks = -1, tasks = -1;
  std::string err;
  out >> forks >> err >> tasks;
  RecordProperty("forks_before_failure", static_cast<int>(forks));
  // Refused exactly at the limit, with the pids controller's EAGAIN (the
  // memory limit, far away, would say ENOMEM).
  EXPECT_EQ(err, "EAGAIN") << r.stdout();
  EXPECT_EQ(tasks, static_cast<long>(kPids) + 1) << "tasks in the sandbox when fork failed: " << r.stdout();
  EXPECT_EQ(forks, static_cast<long>(kPids) - 1) << "children forked: " << r.stdout();
  ExpectHostAndSandboxUnharmed(marker);
}

INSTANTIATE_TEST_SUITE_P(Kinds, SandboxForkBomb, ::testing::ValuesIn(RegisteredKinds(OnTheHostKernel)),
                         KindParamName);

}  // namespace
}  // namespace dsec::testing
