// Host processes from inside a sandbox: they cannot be seen in /proc, and
// they cannot be signalled, neither the test process nor a child it starts.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "tests/support/fncall_fixture.hpp"
#include "tests/support/probes.hpp"

extern char** environ;

namespace dsec::testing {
namespace {

using HostProcesses = FncallTest;

// A host `sleep 300` the test starts and always stops and reaps itself.
class HostSleep {
 public:
  HostSleep() {
    char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("300"), nullptr};
    if (::posix_spawnp(&pid_, "sleep", nullptr, nullptr, argv, environ) != 0) pid_ = -1;
  }
  HostSleep(const HostSleep&) = delete;
  HostSleep& operator=(const HostSleep&) = delete;
  ~HostSleep() { Stop(); }
  pid_t pid() const { return pid_; }
  // Running: neither gone nor a zombie waiting to be reaped.
  bool Running() const {
    int st = 0;
    return pid_ > 0 && ::waitpid(pid_, &st, WNOHANG) == 0 && ::kill(pid_, 0) == 0;
  }
  // Kills and reaps it; returns its wait status.
  int Stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return st;
  }

 private:
  pid_t pid_ = -1;
};

TEST_F(HostProcesses, ProcListsOnlyTheRunsOwnProcesses) {
  auto r = Run({"python3", "-c",
                "import os, sys\n"
                "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
                "print(' '.join(map(str, pids)))\n"
                "print(os.getpid())\n"
                "print(os.path.exists('/proc/' + sys.argv[1]))\n"
                "print(open('/proc/1/comm').read().strip())\n",
                std::to_string(::getpid())});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  std::istringstream out(r.stdout());
  std::string pid_line, self, test_pid_visible, init_comm;
  std::getline(out, pid_line);
  std::getline(out, self);
  std::getline(out, test_pid_visible);
  std::getline(out, init_comm);
  std::set<long> pids;
  std::istringstream ps(pid_line);
  for (long p; ps >> p;) pids.insert(p);
  // The runner (pid 1) and the program itself, nothing of the host's.
  EXPECT_LE(pids.size(), 3u) << pid_line;
  EXPECT_EQ(pids.count(1), 1u) << pid_line;
  EXPECT_EQ(pids.count(std::stol(self)), 1u) << pid_line;
  for (long p : pids) EXPECT_LT(p, 100) << "a pid from outside the sandbox: " << pid_line;
  EXPECT_EQ(test_pid_visible, "False") << "the test's pid " << ::getpid() << " is visible inside";
  EXPECT_EQ(init_comm, "dsec-runner") << "pid 1 inside is not the sandbox's runner";
}

TEST_F(HostProcesses, PsListsNoHostProcess) {
  auto r = Sh("ps -e -o pid= -o comm=");
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // ps sees the run's own processes (so it does list processes): the runner
  // as pid 1, ps itself, and sh unless it exec'd ps; nothing else.
  std::map<std::string, std::string> seen;  // comm -> pid
  std::istringstream out(r.stdout());
  for (std::string pid, comm; out >> pid >> comm;) seen[comm] = pid;
  EXPECT_EQ(seen["dsec-runner"], "1") << r.stdout();
  EXPECT_EQ(seen.count("ps"), 1u) << r.stdout();
  seen.erase("dsec-runner");
  seen.erase("ps");
  seen.erase("sh");
  EXPECT_TRUE(seen.empty()) << "processes of the host inside:\n" << r.stdout();
  EXPECT_LE(std::count(r.stdout().begin(), r.stdout().end(), '\n'), 3) << r.stdout();
}

TEST_F(HostProcesses, CannotSignalTheTestProcess) {
  std::string pid = std::to_string(::getpid());
  auto r = Run({"python3", "-c", kSignalProbe, pid});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "0 ESRCH\n15 ESRCH\n9 ESRCH\n");
  // The shell's kill builtin fails too, for the same reason.
  auto sh = Sh("kill -0 " + pid + "; echo rc=$?; kill -9 " + pid + "; echo rc=$?");
  EXPECT_EQ(sh.verdict(), v1::VERDICT_OK) << sh.error();
  EXPECT_EQ(sh.stdout(), "rc=1\nrc=1\n") << sh.stderr();
  EXPECT_EQ(Occurrences(sh.stderr(), "No such process"), 2) << sh.stderr();
  // And, plainly, this process is still here to check it.
  EXPECT_EQ(::kill(::getpid(), 0), 0);
}

TEST_F(HostProcesses, CannotKillAHostChild) {
  HostSleep sleeper;
  ASSERT_GT(sleeper.pid(), 0) << "posix_spawn sleep 300 failed";
  ASSERT_TRUE(sleeper.Running());
  std::string pid = std::to_string(sleeper.pid());
  auto r = Sh("kill -9 " + pid + "; echo rc=$?; kill -TERM " + pid +
              "; echo rc=$?; kill -9 -1; echo rc=$?");
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
  // The host's pid does not exist in here; kill -1 finds nobody it may
  // signal (pid 1 and the caller are exempt): ESRCH, each time.
  EXPECT_EQ(r.stdout(), "rc=1\nrc=1\nrc=1\n") << r.stderr();
  EXPECT_EQ(Occurrences(r.stderr(), "No such process"), 3) << r.stderr();
  EXPECT_TRUE(sleeper.Running()) << "the host's sleep " << pid << " did not survive the sandbox";
  int st = sleeper.Stop();
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "wait status " << st;
}

}  // namespace
}  // namespace dsec::testing
