// /proc from inside a container: PID 1 is dsec-agent, closed to the
// container; nothing inside runs with the spawner's priority; no process
// holds a file of the host; the agent's binary and /run/dsec cannot be
// changed; the kernel's knobs under /proc/sys and /proc/sysrq-trigger cannot
// be written; the mount table holds nothing of the host's. That /proc lists
// no host process and that no /proc/<pid>/root or cwd leads to the host's
// files is checked for every kind (sandbox_host_view_test.cpp).
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>


#include "tests/support/container_fixture.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {
namespace {

class ContainerProc : public ContainerTest {};

std::string Sha256(const std::string& host_path) {
  auto r = RunProcess({"/usr/bin/sha256sum", host_path});
  return r.exit_code == 0 ? r.out.substr(0, 64) : "sha256sum failed: " + r.err;
}

// PID 1 is the agent, and nothing in the container can look into it or
// change it: its root, descriptors and memory are closed to root in the
// container (the agent is not dumpable, and no one there has
// CAP_SYS_PTRACE). Writing /proc/1/mem would let a program rewrite the exit
// codes the agent reports, which are rewards.
TEST_F(ContainerProc, ProcOneIsTheAgentAndClosedToTheContainer) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c",
                              std::string(kAttempt) +
                              "import os\n"
                              "print(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[0].decode())\n"
                              "attempt('root', lambda: os.readlink('/proc/1/root'))\n"
                              "attempt('fd', lambda: os.readlink('/proc/1/fd/' + os.listdir('/proc/1/fd')[0]))\n"
                              "attempt('mem', lambda: open('/proc/1/mem', 'rb'))\n"
                              "attempt('mem-rw', lambda: open('/proc/1/mem', 'r+b'))\n"
                              "attempt('own-mem', lambda: open('/proc/self/mem', 'rb'))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  // A program's own memory stays its own.
  EXPECT_EQ(r.stdout(), "dsec-agent\nroot EACCES\nfd EACCES\nmem EACCES\nmem-rw EACCES\nown-mem done\n");
  Destroy(*sb);
}

TEST_F(ContainerProc, NothingInsideRunsWithTheSpawnersPriority) {
  // The container spawner runs at nice -10 (one lane for every creation);
  // the agent and its programs must not inherit that.
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import os\n"
                              "print(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[16], os.nice(0))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "0 0\n") << "the nice values of the agent and of a program";
  Destroy(*sb);
}

TEST_F(ContainerProc, NoProcessHoldsAFileOfTheHost) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "sleep 300 > /dev/null 2>&1 &").verdict(), v1::VERDICT_OK);
  // A descriptor or cwd on a host file or dir would be a way out (openat,
  // fchdir). For each file and dir any process holds: the path the kernel
  // names for it must lead, inside the container, to that same file. (The
  // agent's are closed to the container: ProcOneIsTheAgentAndClosedToTheContainer.)
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import os, stat\n"
                              "held, foreign = 0, []\n"
                              "for p in [d for d in os.listdir('/proc') if d.isdigit()]:\n"
                              "    links = ['/proc/%s/cwd' % p, '/proc/%s/root' % p]\n"
                              "    try:\n"
                              "        links += ['/proc/%s/fd/%s' % (p, n) for n in os.listdir('/proc/%s/fd' % p)]\n"
                              "    except OSError:\n"
                              "        continue\n"
                              "    for l in links:\n"
                              "        try:\n"
                              "            st, target = os.stat(l), os.readlink(l)\n"
                              "        except OSError:\n"
                              "            continue\n"
                              "        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):\n"
                              "            continue\n"
                              "        held += 1\n"
                              "        try:\n"
                              "            here = os.stat(target)\n"
                              "            same = (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino)\n"
                              "        except OSError:\n"
                              "            same = False\n"
                              "        if not same:\n"
                              "            foreign.append(l + ' -> ' + target)\n"
                              "print(held >= 4, 'foreign:', ', '.join(foreign) or 'none')\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  EXPECT_EQ(r.stdout(), "True foreign: none\n");
  Destroy(*sb);
}

TEST_F(ContainerProc, AgentBinaryAndRunDsecAreReadOnly) {
  std::string agent = BinDir() + "/dsec-agent";
  std::string before = Sha256(agent);
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = Exec(*sb, Command({"python3", "-c",
                              std::string(kAttempt) +
                              "import os\n"
                              "attempt('truncate_agent', lambda: os.truncate('/run/dsec/agent', 0))\n"
                              "attempt('open_agent_for_write', lambda: os.close(os.open('/run/dsec/agent', os.O_WRONLY)))\n"
                              "attempt('chmod_agent', lambda: os.chmod('/run/dsec/agent', 0o777))\n"
                              "attempt('unlink_agent', lambda: os.unlink('/run/dsec/agent'))\n"
                              "attempt('create_in_run', lambda: os.close(os.open('/run/dsec/fake.sock', "
                              "os.O_CREAT | os.O_WRONLY, 0o600)))\n"
                              "attempt('mkdir_in_run', lambda: os.mkdir('/run/dsec/d'))\n"
                              "attempt('unlink_socket', lambda: os.unlink('/run/dsec/agent.sock'))\n"
                              "attempt('rename_socket', lambda: os.rename('/run/dsec/agent.sock', '/run/dsec/old'))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 8u) << r.stdout();
  for (const auto& [what, result] : res) {
    if (what == "open_agent_for_write")  // the agent runs it: a kernel that refuses writers to that says so first
      EXPECT_EQ(result, RunningProgramsRefuseWriters() ? "ETXTBSY" : "EROFS") << what;
    else
      EXPECT_EQ(result, "EROFS") << what;
  }
  // The agent still answers on its own socket; the host's binary and run
  // dir are as they were.
  EXPECT_EQ(ShIn(*sb, "echo still here").stdout(), "still here\n");
  EXPECT_EQ(Sha256(agent), before);
  auto ls = RunProcess({"/bin/ls", "-A", daemon_->data_dir() + "/sandboxes/" + sb->id() + "/run"});
  EXPECT_EQ(ls.out, "agent\nagent.sock\netc\n") << ls.err;
  Destroy(*sb);
}

TEST_F(ContainerProc, KernelKnobsInProcSysAndSysrqTriggerAreNotWritable) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // Root in the container is the host's root (no user namespace): were
  // /proc/sys writable, core_pattern or modprobe would run a program of its
  // choosing as root on the host. The probe writes back what it read, so
  // even a write that goes through changes nothing; sysrq-trigger is only
  // opened, never written.
  auto r = Exec(*sb, Command({"python3", "-c",
                              "import errno, os\n"
                              "def name(e):\n"
                              "    return errno.errorcode.get(e.errno, str(e.errno))\n"
                              "def rewrite(path):\n"
                              "    try:\n"
                              "        with open(path, 'rb') as f:\n"
                              "            value = f.read()\n"
                              "        fd = os.open(path, os.O_WRONLY)\n"
                              "    except OSError as e:\n"
                              "        return name(e)\n"
                              "    try:\n"
                              "        os.write(fd, value)\n"
                              "        return 'written'\n"
                              "    except OSError as e:\n"
                              "        return 'opened, write ' + name(e)\n"
                              "    finally:\n"
                              "        os.close(fd)\n"
                              "for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe',\n"
                              "          '/proc/sys/vm/overcommit_memory', '/proc/sys/kernel/panic'):\n"
                              "    print(p, rewrite(p))\n"
                              "try:\n"
                              "    os.close(os.open('/proc/sysrq-trigger', os.O_WRONLY))\n"
                              "    print('/proc/sysrq-trigger opened')\n"
                              "except OSError as e:\n"
                              "    print('/proc/sysrq-trigger', name(e))\n"}));
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto res = ParseResults(r.stdout());
  ASSERT_EQ(res.size(), 5u) << r.stdout();
  // Read-only; a knob this kernel does not have (no CONFIG_MAGIC_SYSRQ, no
  // modules), as the host's /proc shows, is not there at all.
  for (const auto& [path, result] : res) {
    bool here = ::access(path.c_str(), F_OK) == 0;
    EXPECT_EQ(result, here ? "EROFS" : "ENOENT") << path << (here ? " is on this host" : " is not on this host");
  }
  Destroy(*sb);
}

// The container's mount table, read by a host process that enters its mount
// namespace (setns puts it at the container's root, as everything inside
// is): only the container's own mounts, nothing of the host's table.
TEST_F(ContainerProc, ItsMountTableHoldsNoMountOfTheHost) {
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  int pid = InitPid(*sb);
  ASSERT_GT(pid, 0);
  int ns = ::open(("/proc/" + std::to_string(pid) + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ns, 0) << std::strerror(errno);
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Async-signal-safe calls only: this process has threads. /proc is
    // opened first: the namespace's root has none.
    int proc = ::open("/proc", O_RDONLY | O_DIRECTORY);
    if (proc < 0 || ::setns(ns, CLONE_NEWNS) < 0) ::_exit(2);
    int mi = ::openat(proc, "self/mountinfo", O_RDONLY);
    if (mi < 0) ::_exit(3);
    char buf[4096];
    for (ssize_t n; (n = ::read(mi, buf, sizeof buf)) > 0;)
      if (::write(fds[1], buf, static_cast<size_t>(n)) != n) ::_exit(4);
    ::_exit(0);
  }
  ::close(fds[1]);
  ::close(ns);
  std::string table;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) table.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::istringstream lines(table);
  int mounts = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    ++mounts;
    bool own = point == "/" || point == "/proc" || point.rfind("/proc/", 0) == 0 || point == "/dev" ||
               point.rfind("/dev/", 0) == 0 || point == "/run/dsec" || point == "/run/dsec/agent" ||
               point == "/etc/hosts" || point == "/etc/hostname" || point == "/etc/resolv.conf" ||
               point == "/etc/machine-id";
    EXPECT_TRUE(own) << "a mount that is not the container's: " << line;
  }
  EXPECT_GT(mounts, 3) << table;
  Destroy(*sb);
}

// On a host whose mounts are shared (systemd makes / shared), nothing a
// container mounts may propagate back: dsecd runs in a mount namespace of
// its own where every mount is shared, and after a container is made and
// removed, that namespace holds no mount under the sandbox's dir, and the
// dir is gone (Destroy checks).
class ContainerSharedMounts : public ContainerTest {
 protected:
  static void SetUpTestSuite() {
    TestDaemonOptions o;
    o.wrapper = {"/usr/bin/unshare", "--mount", "--propagation", "shared", "--"};
    if (::access(o.wrapper[0].c_str(), X_OK) != 0) {
      start_ = {"no /usr/bin/unshare (util-linux) to run dsecd with shared mounts", ""};
      return;
    }
    start_ = TryStartContainerDaemon(o, &daemon_, &client_);
  }
};

std::vector<std::string> SandboxMounts(pid_t dsecd) {
  std::vector<std::string> out;
  std::ifstream mi("/proc/" + std::to_string(dsecd) + "/mountinfo");
  for (std::string line; std::getline(mi, line);)
    if (line.find("/sandboxes/") != std::string::npos) out.push_back(line);
  return out;
}

TEST_F(ContainerSharedMounts, NoContainerMountPropagatesToTheDaemonsNamespace) {
  {
    std::ifstream mi("/proc/" + std::to_string(daemon_->pid()) + "/mountinfo");
    std::string first;
    std::getline(mi, first);
    ASSERT_NE(first.find("shared:"), std::string::npos) << "dsecd's mounts are not shared: " << first;
  }
  auto sb = Make();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "cat /run/dsec/agent > /dev/null && echo ok").stdout(), "ok\n");
  auto during = SandboxMounts(daemon_->pid());
  EXPECT_TRUE(during.empty()) << during.size() << " mount(s) of the container in dsecd's namespace, first: "
                              << during.front();
  Destroy(*sb);
  auto after = SandboxMounts(daemon_->pid());
  EXPECT_TRUE(after.empty()) << after.size() << " mount(s) left in dsecd's namespace, first: " << after.front();
}

}  // namespace
}  // namespace dsec::testing
