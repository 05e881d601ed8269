// Nothing of the host in view from inside a sandbox, once per registered
// kind: /proc and ps list only the sandbox's own processes (its PID 1 and
// the program), no host process can be signalled by its pid (the test
// process, a child it starts, a program of another sandbox), the host's
// files are neither visible nor changed (not even through /proc/<pid>/root
// or cwd), the host's secrets are not there, and no device node can be made.
// A new kind is tested by being registered. What is particular to one
// kind's mechanism stays in that kind's tests: fncall's runner and the
// container's agent as PID 1 (cross_run_test.cpp, container_proc_test.cpp),
// a container's writable /dev (container_devices_test.cpp).
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/kind_sandbox_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

using SandboxHostView = KindSandboxTest;

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

// A file only the host has: /tmp/dsec-test-marker-XXXXXX/marker, removed
// with its dir when the test ends.
class HostMarker {
 public:
  HostMarker() {
    char tmpl[] = "/tmp/dsec-test-marker-XXXXXX";
    if (!::mkdtemp(tmpl)) return;
    dir_ = tmpl;
    std::ofstream(dir_ + "/marker") << "the host's\n";
  }
  HostMarker(const HostMarker&) = delete;
  HostMarker& operator=(const HostMarker&) = delete;
  ~HostMarker() {
    if (!dir_.empty()) RunProcess({"/bin/rm", "-rf", dir_});
  }
  std::string path() const { return dir_ + "/marker"; }
  bool ok() const { return !dir_.empty() && ::access(path().c_str(), R_OK) == 0; }

 private:
  std::string dir_;
};

TEST_P(SandboxHostView, ProcListsOnlyTheSandboxsOwnProcesses) {
  // For each pid in /proc: its parent as seen inside, and whether it is the
  // probe; then whether the host's pids of this test and of dsecd exist.
  auto r = Run({"python3", "-c",
                "import os, sys\n"
                "for p in sorted(int(d) for d in os.listdir('/proc') if d.isdigit()):\n"
                "    try:\n"
                "        ppid = open('/proc/%d/stat' % p).read().rsplit(')', 1)[1].split()[1]\n"
                "    except OSError:\n"
                "        continue\n"
                "    print(p, ppid, 'self' if p == os.getpid() else 'other')\n"
                "for host_pid in sys.argv[1:]:\n"
                "    print(host_pid, os.path.exists('/proc/' + host_pid))\n",
                std::to_string(::getpid()), std::to_string(daemon_->pid())});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  std::istringstream out(r.stdout());
  std::vector<std::string> lines;
  for (std::string line; std::getline(out, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u) << r.stdout();
  // PID 1, whose parent is outside the sandbox's pid namespace (0 inside),
  // and the probe, its child; nothing of the host's: not the test, dsecd,
  // its spawner or anything else.
  EXPECT_EQ(lines[0], "1 0 other") << r.stdout();
  std::istringstream probe(lines[1]);
  long pid = 0;
  std::string ppid, who;
  probe >> pid >> ppid >> who;
  EXPECT_GT(pid, 1) << r.stdout();
  EXPECT_EQ(ppid, "1") << r.stdout();
  EXPECT_EQ(who, "self") << r.stdout();
  EXPECT_EQ(lines[2], std::to_string(::getpid()) + " False") << "the test's pid is visible inside";
  EXPECT_EQ(lines[3], std::to_string(daemon_->pid()) + " False") << "dsecd's pid is visible inside";
}

TEST_P(SandboxHostView, PsListsNoHostProcess) {
  auto r = Run(Sh("ps -e -o pid= -o comm="));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // ps sees the sandbox's own processes (so it does list processes): PID 1,
  // ps itself, and sh unless it exec'd ps; nothing else.
  std::map<std::string, std::string> seen;  // pid -> comm
  std::istringstream out(r.stdout());
  for (std::string pid, comm; out >> pid >> comm;) seen[pid] = comm;
  EXPECT_EQ(seen.count("1"), 1u) << r.stdout();
  seen.erase("1");
  int ps = 0;
  for (auto it = seen.begin(); it != seen.end();) {
    if (it->second == "ps") ++ps;
    if (it->second == "ps" || it->second == "sh")
      it = seen.erase(it);
    else
      ++it;
  }
  EXPECT_EQ(ps, 1) << r.stdout();
  EXPECT_TRUE(seen.empty()) << "processes of the host inside:\n" << r.stdout();
  EXPECT_LE(std::count(r.stdout().begin(), r.stdout().end(), '\n'), 3) << r.stdout();
}

TEST_P(SandboxHostView, CannotSignalTheTestProcess) {
  std::string pid = std::to_string(::getpid());
  auto r = Run({"python3", "-c", kSignalProbe, pid});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "0 ESRCH\n15 ESRCH\n9 ESRCH\n");
  // The shell's kill builtin fails too, for the same reason.
  auto sh = Run(Sh("kill -0 " + pid + "; echo rc=$?; kill -9 " + pid + "; echo rc=$?"));
  EXPECT_EQ(sh.verdict(), v1::VERDICT_OK) << sh.error();
  EXPECT_EQ(sh.stdout(), "rc=1\nrc=1\n") << sh.stderr();
  EXPECT_EQ(Occurrences(sh.stderr(), "No such process"), 2) << sh.stderr();
  // And, plainly, this process is still here to check it.
  EXPECT_EQ(::kill(::getpid(), 0), 0);
}

TEST_P(SandboxHostView, CannotKillAHostChild) {
  HostSleep sleeper;
  ASSERT_GT(sleeper.pid(), 0) << "posix_spawn sleep 300 failed";
  ASSERT_TRUE(sleeper.Running());
  std::string pid = std::to_string(sleeper.pid());
  auto r = Run(Sh("kill -9 " + pid + "; echo rc=$?; kill -TERM " + pid + "; echo rc=$?; kill -9 -1; echo rc=$?"));
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
  // The host's pid does not exist in here; kill -1 finds nobody it may
  // signal (PID 1 and the caller are exempt, and nothing else runs in the
  // new sandbox): ESRCH, each time.
  EXPECT_EQ(r.stdout(), "rc=1\nrc=1\nrc=1\n") << r.stderr();
  EXPECT_EQ(Occurrences(r.stderr(), "No such process"), 3) << r.stderr();
  EXPECT_TRUE(sleeper.Running()) << "the host's sleep " << pid << " did not survive the sandbox";
  int st = sleeper.Stop();
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "wait status " << st;
}

TEST_P(SandboxHostView, CannotSignalAnotherSandboxsProgramByItsHostPid) {
  // A program of another sandbox of the kind, found on the host by a
  // marker argument; this sandbox knows its host pid (say, leaked through
  // a log) and tries every way to signal it: no such process in its world.
  auto other = NewSandbox();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  const std::string marker = "dsec-victim-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
  v1::ExecRequest wait = Command({"python3", "-c", "import time; time.sleep(60)", marker});
  wait.mutable_limits()->set_timeout_ms(60000);
  auto victim = other->ExecAsync(wait);
  std::vector<pid_t> found;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((found = HostProcessesWithArg(marker)).empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling /proc, bounded
  ASSERT_EQ(found.size(), 1u) << "the other sandbox's program never showed on the host";
  std::string host_pid = std::to_string(found[0]);

  auto r = Run({"python3", "-c",
                std::string("import os, sys\nprint(os.path.exists('/proc/' + sys.argv[1]))\n") + kSignalProbe,
                host_pid});
  EXPECT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "False\n0 ESRCH\n15 ESRCH\n9 ESRCH\n");
  auto sh = Run(Sh("kill -9 " + host_pid + "; echo rc=$?; kill -9 -1; echo rc=$?"));
  EXPECT_EQ(sh.stdout(), "rc=1\nrc=1\n") << sh.stderr();  // kill -1: nobody this sandbox may signal

  // The other sandbox's program lives on: its exec still runs, and the
  // host sees the same process. Then the host ends it.
  EXPECT_NE(victim.wait_for(std::chrono::seconds(0)), std::future_status::ready)
      << "the other sandbox's program ended";
  EXPECT_EQ(HostProcessesWithArg(marker), found);
  ::kill(found[0], SIGKILL);
  auto ended = victim.get();
  ASSERT_TRUE(ended.ok()) << ended.status().ToString();
  EXPECT_EQ(ended->signal(), SIGKILL) << ended->error();
}

TEST_P(SandboxHostView, HostFilesAreInvisibleAndUnchanged) {
  char path[] = "/tmp/dsec-security-host-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string content = "host secret\n";
  ASSERT_EQ(::write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
  ::close(fd);
  // The dir of dsecd and this build's other programs is on the host too,
  // and no kind gives it to its sandboxes.
  const std::string host_dir = BinDir();
  ASSERT_EQ(::access(host_dir.c_str(), F_OK), 0) << host_dir;

  auto r = Run({"python3", "-c",
                "import os, sys\n"
                "path, host_dir = sys.argv[1], sys.argv[2]\n"
                "print(os.path.exists(path), os.path.exists(host_dir))\n"
                "with open(path, 'w') as f:\n"  // lands in the sandbox's own /tmp
                "    f.write('pwned\\n')\n"
                "print(open(path).read().strip())\n",
                path, host_dir});
  std::string host_after;
  {
    std::ifstream in(path);
    host_after.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ::unlink(path);
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "False False\npwned\n") << path << " " << host_dir;
  EXPECT_EQ(host_after, content) << "the sandbox changed the host's " << path;
}

TEST_P(SandboxHostView, HostFilesAreNotReachableThroughAnyProcRootOrCwd) {
  HostMarker marker;
  ASSERT_TRUE(marker.ok()) << "cannot make the host marker under /tmp";
  // Every process there whose root and cwd can be looked at (a sleep, the
  // probe itself, as self and by pid; PID 1's are closed to the program),
  // and ".." far above them, with the marker's host path appended.
  auto r = Run({"python3", "-c",
                "import os, subprocess, sys\n"
                "marker = sys.argv[1]\n"
                "child = subprocess.Popen(['sleep', '300'])\n"
                "seen, bases = [], 0\n"
                "for p in ['self'] + [d for d in os.listdir('/proc') if d.isdigit()]:\n"
                "    for link in ('root', 'cwd'):\n"
                "        base = '/proc/%s/%s' % (p, link)\n"
                "        if not os.path.exists(base):\n"
                "            continue\n"
                "        bases += 1\n"
                "        for cand in (base + marker, base + '/..' * 16 + marker):\n"
                "            if os.path.exists(cand):\n"
                "                seen.append(cand)\n"
                "child.kill()\n"
                "child.wait()\n"
                "print(bases >= 6, 'visible:', ' '.join(seen) or 'nowhere')\n"
                "print('direct', os.path.exists(marker))\n",
                marker.path()});
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "True visible: nowhere\ndirect False\n") << "host marker " << marker.path();
}

// The host's secrets, each made present on the host for the test when the
// host lacks it (a directory where the name is one), so that "absent"
// inside the sandbox means the sandbox hides it, not that the host never
// had it. What the test made it removes; what the host had it leaves.
class HostSecrets {
 public:
  HostSecrets() {
    for (const auto& [path, dir] : kSecrets) {
      paths_.push_back(path);
      if (::access(path, F_OK) == 0) continue;
      bool made = dir ? ::mkdir(path, 0700) == 0 : static_cast<bool>(std::ofstream(path) << "dsec test plant\n");
      if (made) planted_.push_back({path, dir});
    }
  }
  HostSecrets(const HostSecrets&) = delete;
  HostSecrets& operator=(const HostSecrets&) = delete;
  ~HostSecrets() {
    for (const auto& [path, dir] : planted_) dir ? ::rmdir(path.c_str()) : ::unlink(path.c_str());
  }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  static constexpr std::pair<const char*, bool> kSecrets[] = {
      {"/etc/shadow", false}, {"/etc/gshadow", false}, {"/etc/ssh", true},
      {"/etc/sudoers", false}, {"/root/.ssh", true},   {"/root/.bash_history", false}};
  std::vector<std::string> paths_;
  std::vector<std::pair<std::string, bool>> planted_;
};

TEST_P(SandboxHostView, HostSecretsAreAbsent) {
  HostSecrets secrets;
  // The control: every one of them is there on the host.
  for (const auto& p : secrets.paths()) ASSERT_EQ(::access(p.c_str(), F_OK), 0) << "cannot make " << p << " on the host";
  std::vector<std::string> argv = {"python3", "-c",
                                   "import os, sys\n"
                                   "for p in sys.argv[1:]:\n"
                                   "    print(p, 'present' if os.path.lexists(p) else 'absent')\n"};
  argv.insert(argv.end(), secrets.paths().begin(), secrets.paths().end());
  auto r = Run(argv);
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), secrets.paths().size()) << r.stdout();
  for (const auto& [p, state] : res) EXPECT_EQ(state, "absent") << p;
}

TEST_P(SandboxHostView, DeviceNodesCannotBeMadeButFifosCan) {
  // The seccomp filter allows mknod (FIFOs need it); a device node needs
  // CAP_MKNOD, which no kind leaves a program (fncall's run without any
  // capability, the container's root without MKNOD): EPERM, in /work and
  // /tmp, which the program may write. Block: the first SCSI/SATA disk, a
  // virtio disk, a loop device; character: /dev/mem, /dev/kmem, /dev/port,
  // /dev/kmsg, /dev/net/tun, /dev/fuse, and a second /dev/null (even a
  // harmless number needs the capability).
  const std::vector<std::string> devices = {"/work/sda b 8 0",   "/tmp/vda b 254 0",    "/work/loop0 b 7 0",
                                            "/work/mem c 1 1",   "/tmp/kmem c 1 2",     "/tmp/port c 1 4",
                                            "/work/kmsg c 1 11", "/tmp/tun c 10 200",   "/work/fuse c 10 229",
                                            "/tmp/null c 1 3"};
  // After the mknods: which of the paths exist, and whether the FIFO is one.
  const std::string probe = std::string(kMknodProbe) +
                            "print('left', ' '.join(p for p in args[0::4] if os.path.lexists(p)) or 'nothing')\n"
                            "print('pipe_is_a_fifo', os.path.lexists('/work/pipe') and "
                            "stat.S_ISFIFO(os.lstat('/work/pipe').st_mode))\n";
  std::vector<std::string> argv = {"python3", "-c", probe};
  std::vector<std::string> paths;
  for (const auto& d : devices) {
    std::istringstream in(d);
    for (std::string w; in >> w;) argv.push_back(w);
    paths.push_back(d.substr(0, d.find(' ')));
  }
  for (const char* w : {"/work/pipe", "p", "0", "0"}) argv.push_back(w);
  auto r = Run(argv);
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), devices.size() + 3) << r.stdout();
  for (const auto& p : paths) EXPECT_EQ(res[p], "EPERM") << "mknod " << p;
  // mknod itself is allowed, and nothing but the FIFO was made.
  EXPECT_EQ(res["/work/pipe"], "made");
  EXPECT_EQ(res["left"], "/work/pipe");
  EXPECT_EQ(res["pipe_is_a_fifo"], "True");
}

INSTANTIATE_TEST_SUITE_P(Kinds, SandboxHostView, ::testing::ValuesIn(RegisteredKinds(OnTheHostKernel)),
                         KindParamName);

}  // namespace
}  // namespace dsec::testing
