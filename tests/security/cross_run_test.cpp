// Runs cannot see each other: not while they run side by side (files, processes,
// SysV IPC, abstract unix sockets), and not one after the other (files and
// background processes die with their run).
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using CrossRun = FncallTest;

// "key rest-of-line" lines.
std::map<std::string, std::string> ParseLines(const std::string& out) {
  std::map<std::string, std::string> m;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t sp = line.find(' ');
    m[line.substr(0, sp)] = sp == std::string::npos ? std::string() : line.substr(sp + 1);
  }
  return m;
}

// A leaves traces of every kind, says when they exist, and stays alive a while.
constexpr const char* kRunA =
    "import ctypes, socket, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.prctl(15, b'dsec-secret-a', 0, 0, 0)\n"  // PR_SET_NAME
    "open('/work/secret', 'w').write('A')\n"
    "open('/tmp/secret', 'w').write('A')\n"
    "shm = libc.shmget(0x5ec, 4096, 0o1600)\n"  // IPC_CREAT | 0600
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.bind('\\0dsec-secret-a')\n"
    "s.listen()\n"
    "print('ready', time.monotonic(), flush=True)\n"
    "print('shm', shm, flush=True)\n"
    "time.sleep(2.5)\n"
    "print('done', time.monotonic(), flush=True)\n";

// B, started right after A, looks for A's traces while A sleeps.
constexpr const char* kRunB =
    "import ctypes, errno, os, socket, subprocess, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "time.sleep(1)\n"
    "print('start', time.monotonic())\n"
    "print('work', ' '.join(sorted(os.listdir('/work'))))\n"
    "print('tmp', ' '.join(sorted(os.listdir('/tmp'))))\n"
    "ps = subprocess.run(['ps', '-e', '-o', 'comm='], capture_output=True, text=True).stdout\n"
    "print('procs', ','.join(ps.split()))\n"
    "ctypes.set_errno(0)\n"
    "r = libc.shmget(0x5ec, 0, 0)\n"
    "print('shm', r, errno.errorcode.get(ctypes.get_errno(), '-'))\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "try:\n"
    "    s.connect('\\0dsec-secret-a')\n"
    "    print('unix connected')\n"
    "except OSError as e:\n"
    "    print('unix', errno.errorcode.get(e.errno, e.errno))\n"
    "print('end', time.monotonic())\n";

TEST_F(CrossRun, ConcurrentRunsSeeNothingOfEachOther) {
  auto fa = RunAsync({"python3", "-c", kRunA});
  auto fb = RunAsync({"python3", "-c", kRunB});
  auto ra = fa.get();
  auto rb = fb.get();
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  ASSERT_EQ(ra->verdict(), v1::VERDICT_OK) << ra->error() << "\n" << ra->stderr();
  ASSERT_EQ(rb->verdict(), v1::VERDICT_OK) << rb->error() << "\n" << rb->stderr();
  auto a = ParseLines(ra->stdout());
  auto b = ParseLines(rb->stdout());
  ASSERT_EQ(a.count("ready") + a.count("done") + a.count("shm"), 3u) << ra->stdout();
  ASSERT_GE(std::stol(a["shm"]), 0) << "A could not create its shm segment";
  // B looked while A's traces existed (CLOCK_MONOTONIC is the host's, shared).
  ASSERT_LT(std::stod(a["ready"]), std::stod(b["start"])) << ra->stdout() << rb->stdout();
  ASSERT_LT(std::stod(b["end"]), std::stod(a["done"])) << ra->stdout() << rb->stdout();

  EXPECT_EQ(b["work"], "") << "B sees files in /work";
  EXPECT_EQ(b["tmp"], "") << "B sees files in /tmp";
  EXPECT_EQ(b["procs"].find("dsec-secret-a"), std::string::npos) << b["procs"];
  EXPECT_EQ(b["procs"], "dsec-runner,python3,ps");
  EXPECT_EQ(b["shm"], "-1 ENOENT") << "B sees A's SysV shared memory";
  EXPECT_EQ(b["unix"], "ECONNREFUSED") << "B reaches A's abstract unix socket";
}

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
  auto next = Sh("ps -e -o comm=");
  ASSERT_EQ(next.verdict(), v1::VERDICT_OK) << next.error();
  EXPECT_EQ(next.stdout().find("sleep"), std::string::npos) << next.stdout();
}

}  // namespace
}  // namespace dsec::testing
