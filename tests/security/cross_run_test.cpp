// fncall's runs are one-shot: nothing of a run reaches the next one (its
// files, System V objects it leaves in an ipc namespace that is recycled),
// and its background processes die with it, leaving the next run its
// runner as PID 1 and its own program. That runs side by side see nothing
// of each other (files, processes, System V objects, abstract unix sockets)
// is checked for every kind (sandbox_isolation_test.cpp).
#include <string>

#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using CrossRun = FncallTest;

TEST_F(CrossRun, NextRunStartsClean) {
  auto first = Sh("echo x > /work/left && echo x > /tmp/left && mkdir /work/dir && echo written");
  ASSERT_EQ(first.verdict(), v1::VERDICT_OK) << first.error() << "\n" << first.stderr();
  ASSERT_EQ(first.stdout(), "written\n");
  for (int i = 0; i < 4; ++i) {  // more runs than warm runners: none inherits the first's files
    auto next = Sh("ls -A /work /tmp");
    ASSERT_EQ(next.verdict(), v1::VERDICT_OK) << next.error() << "\n" << next.stderr();
    EXPECT_EQ(next.stdout(), "/tmp:\n\n/work:\n") << "run " << i;
  }
}

TEST_F(CrossRun, SysVObjectsLeftBehindNeverReachALaterRun) {
  // ipc namespaces are recycled only when verified empty: a run that leaves a
  // shared memory segment, a semaphore set and a message queue behind must
  // poison its namespace, not hand the objects to the next runs.
  auto leave = Run({"python3", "-c",
                    "import ctypes\n"
                    "libc = ctypes.CDLL(None, use_errno=True)\n"
                    "print(libc.shmget(0x5ec1, 4096, 0o1600) >= 0, libc.semget(0x5ec2, 1, 0o1600) >= 0,\n"
                    "      libc.msgget(0x5ec3, 0o1600) >= 0)\n"});
  ASSERT_EQ(leave.verdict(), v1::VERDICT_OK) << leave.error() << leave.stderr();
  ASSERT_EQ(leave.stdout(), "True True True\n");
  // More runs than warm runners, so a recycled namespace would come around.
  for (int i = 0; i < 12; ++i) {
    auto look = Sh("cat /proc/sysvipc/shm /proc/sysvipc/sem /proc/sysvipc/msg | grep -c -v '^ *key' || true");
    ASSERT_EQ(look.verdict(), v1::VERDICT_OK) << look.error() << look.stderr();
    EXPECT_EQ(look.stdout(), "0\n") << "run " << i << " sees System V objects of an earlier run";
  }
}

TEST_F(CrossRun, BackgroundProcessesDieWithTheirRun) {
  const std::string marker = "98765.4321";  // sleep's argument
  ASSERT_EQ(HostProcessesWithArg(marker).size(), 0u);
  // The run ends only once its three sleeps run (as ps inside shows them).
  auto r = Sh("setsid sleep 98765.4321 >/dev/null 2>&1 & (sleep 98765.4321 &) ; "
              "nohup sleep 98765.4321 >/dev/null 2>&1 & "
              "until [ \"$(ps -e -o args= | grep -c '^sleep 98765.4321$')\" = 3 ]; do sleep 0.01; done; echo started");
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  ASSERT_EQ(r.stdout(), "started\n");
  // The run's pid namespace is gone with its runner: nothing outlived it.
  EXPECT_EQ(HostProcessesWithArg(marker).size(), 0u) << "a sandbox process outlived its run";
  // The next run has its runner as PID 1 and its own program, nothing else:
  // no sleep of the earlier run.
  auto next = Run({"ps", "-e", "-o", "comm="});
  ASSERT_EQ(next.verdict(), v1::VERDICT_OK) << next.error() << "\n" << next.stderr();
  EXPECT_EQ(next.stdout(), "dsec-runner\nps\n");
}

}  // namespace
}  // namespace dsec::testing
