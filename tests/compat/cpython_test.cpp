// The compatibility suite: real programs' own test suites inside a
// container, on a Debian image built in the test (debootstrap from Debian's
// packages, cached between runs), must pass as they do in a plain chroot of
// the same tree. Here: CPython's regression tests for sockets, asyncio's
// event loops, multiprocessing, os and resource. Every test case that passes
// in the chroot must pass in the container, except the differences the
// sandbox makes on purpose, listed with why in expected_differences.txt.
// docs/running.md, "Compatibility suite", says how to run it.
#include <gmock/gmock.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <thread>

#include "dsec/client.hpp"
#include "drivers/images/debian.hpp"
#include "runtime/files.hpp"
#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kTests = {"test_socket", "test_asyncio.test_events", "test_multiprocessing_spawn",
                                         "test_os", "test_resource"};
// Which of their cases run (regrtest's -m: a pattern matches a test id or
// any part of it): all of every module but multiprocessing, whose cases
// here are those of what a sandbox gives a program (processes spawned,
// pipes, queues, pools, semaphores and shared memory in /dev/shm, sockets
// between processes). Its barrier, condition, manager and thread variants
// repeat those and took three quarters of its 182 s (of the suite's 220 s).
const std::vector<std::string> kMatch = {
    "test_socket", "test_events", "test_os", "test_resource", "WithProcessesTestProcess", "WithProcessesTestPool",
    "WithProcessesTestConnection", "WithProcessesTestQueue", "WithProcessesTestSharedMemory",
    "WithProcessesTestListener", "WithProcessesTestListenerClient", "WithProcessesTestPicklingConnections",
    "WithProcessesTestHeap", "WithProcessesTestArray", "WithProcessesTestValue", "WithProcessesTestSharedCTypes",
    "WithProcessesTestEvent", "WithProcessesTestSemaphore", "WithProcessesTestLock"};

// regrtest's arguments: the patterns, then the modules.
std::vector<std::string> TestArgs() {
  std::vector<std::string> out;
  for (const auto& m : kMatch) {
    out.push_back("-m");
    out.push_back(m);
  }
  out.insert(out.end(), kTests.begin(), kTests.end());
  return out;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

TEST(CompatCPython, RegressionTestsPassInAContainerAsInAChroot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (debootstrap, chroot, containers)";
  for (const char* tool : {"/usr/bin/unshare", "/usr/sbin/chroot", "/usr/bin/python3"})
    if (::access(tool, X_OK) != 0) GTEST_SKIP() << tool << " is missing";
  images::DebianOptions deb;
  deb.packages = {"python3", "libpython3.11-testsuite"};
  deb.progress = [](const std::string& s) { std::fprintf(stderr, "# %s\n", s.c_str()); };
  auto tree = images::DebianRootfs(deb);
  if (!tree.ok()) {
    // Skipped only when the mirror is out of reach, asked apart from dsec;
    // a mirror that answers and a tree dsec could not make is a failure.
    auto probe = RunProcess({"/usr/bin/python3", "-c",
                             "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "
                             "'/dists/bookworm/Release', timeout=30).read(64)",
                             deb.mirror});
    if (probe.exit_code != 0)
      GTEST_SKIP() << "no Debian tree to test with: the mirror " << deb.mirror << " does not answer (" << probe.err
                   << ")";
    FAIL() << "the mirror " << deb.mirror << " answers, yet no Debian tree was made: " << tree.status().ToString();
  }

  auto d = TestDaemon::Start();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", (*d)->data_dir(), "build", "--debian", "bookworm",
                           "--packages", "python3,libpython3.11-testsuite", "cpython"},
                          "", 600);
  ASSERT_EQ(built.exit_code, 0) << built.err;
  auto c = Client::Connect(ClientOptionsFor(**d));
  ASSERT_TRUE(c.ok()) << c.status().ToString();

  // The baseline, in a chroot of the same tree (once per tree and test
  // list: kept next to the tree), while the container runs.
  std::string src = DSEC_SOURCE_DIR "/tests/compat";
  std::string baseline = *tree + ".cpython-" + std::to_string(std::hash<std::string>{}(Joined(TestArgs()))) + ".xml";
  char tmpl[] = "/tmp/dsec-compat-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string scratch = tmpl;
  ProcResult chroot_run;
  std::thread base([&] {
    struct stat st;
    if (::stat(baseline.c_str(), &st) == 0) return;
    std::vector<std::string> argv = {"/usr/bin/unshare", "--mount", "--net", "--uts", "--ipc", "--fork", "/bin/sh",
                                     src + "/chroot_run.sh", *tree, scratch, baseline + ".tmp"};
    for (const auto& a : TestArgs()) argv.push_back(a);
    chroot_run = RunProcess(argv, "", 1800);
    if (chroot_run.exit_code == 0) ::rename((baseline + ".tmp").c_str(), baseline.c_str());
  });

  auto spec = ContainerSpec("cpython");
  spec.mutable_limits()->set_memory_bytes(4ull << 30);
  spec.mutable_limits()->set_pids(4096);
  auto sb = (*c)->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // Whatever fails below, the container and the chroot's scratch go.
  struct Cleanup {
    std::function<void()> fn;
    ~Cleanup() { fn(); }
  } cleanup{[&] {
    if (base.joinable()) base.join();
    (void)sb->Destroy();
    RunProcess({"/bin/rm", "-rf", "--one-file-system", scratch});
  }};
  // What the tests count on first: localhost and the hostname resolve.
  auto names = sb->Exec(Command({"sh", "-c", "getent hosts localhost && getent hosts $(hostname)"}));
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(names->exit_code(), 0) << names->stdout() << names->stderr();
  EXPECT_THAT(names->stdout(), HasSubstr("localhost"));
  EXPECT_THAT(names->stdout(), HasSubstr(sb->id()));

  auto run = Command({"sh", "-c", "cd /work && HOME=/root python3 -m test -j2 --timeout 600 --junit-xml /work/result.xml " +
                                      Joined(TestArgs()) + " > /work/output.txt 2>&1"});
  run.mutable_limits()->set_timeout_ms(1800 * 1000);
  auto r = sb->Exec(run);
  base.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto xml = sb->ReadFile("/work/result.xml");
  if (!xml.ok()) {
    auto out = sb->ReadFile("/work/output.txt");
    FAIL() << "no results from the container: " << xml.status().ToString() << "\n" << (out.ok() ? *out : "");
  }
  std::string got = (*d)->data_dir() + "/container.xml";
  ASSERT_TRUE(WriteFileAtomic(got, *xml).ok());
  struct stat st;
  if (::stat(baseline.c_str(), &st) != 0) {
    auto out = ReadFileToString(scratch + "/output.txt");
    FAIL() << "no baseline from the chroot: " << chroot_run.err << "\n" << (out.ok() ? out->substr(out->size() > 4000 ? out->size() - 4000 : 0) : "");
  }
  auto cmp = RunProcess({"/usr/bin/python3", src + "/compare_junit.py", baseline, got,
                         src + "/expected_differences.txt"});
  std::printf("# %s", cmp.out.c_str());
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  EXPECT_THAT(cmp.out, HasSubstr(" 0 regression(s)"));
}

}  // namespace
}  // namespace dsec::testing
