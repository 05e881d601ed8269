// The sandbox seccomp filter: built from the deny list, and, loaded into a
// forked child, it refuses what it promises to and nothing a program needs.
//
// The child is forked from this single-threaded test process (GoogleTest
// starts no threads), so only async-signal-safe calls are needed after fork;
// it reports through its exit status and never returns into GoogleTest.
#include "drivers/spawner/seccomp_filter.hpp"

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>

#ifndef __NR_clone3
#define __NR_clone3 435
#endif

namespace dsec::fncall {
namespace {

TEST(SeccompFilterTest, BuildsANonEmptyProgram) {
  auto p = BuildSandboxSeccomp();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->insns.empty());
  sock_fprog prog = p->prog();
  EXPECT_EQ(prog.len, p->insns.size());
  EXPECT_EQ(prog.filter, p->insns.data());
  // The kernel's limit on one filter.
  EXPECT_LE(p->insns.size(), 4096u);
}

TEST(SeccompFilterTest, BuildingTwiceGivesTheSameProgram) {
  auto a = BuildSandboxSeccomp();
  auto b = BuildSandboxSeccomp();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->insns.size(), b->insns.size());
  EXPECT_EQ(std::memcmp(a->insns.data(), b->insns.data(), a->insns.size() * sizeof(sock_filter)),
            0);
}

TEST(SeccompFilterTest, DenyListHoldsTheCriticalSyscalls) {
  std::set<std::string> denied;
  for (const char* name : DeniedSyscalls()) denied.insert(name);
  for (const char* critical :
       {"mount", "umount2", "pivot_root", "ptrace", "unshare", "setns", "init_module",
        "finit_module", "bpf", "keyctl", "add_key", "kexec_load", "kexec_file_load",
        "process_vm_writev", "userfaultfd", "io_uring_setup", "perf_event_open", "reboot"})
    EXPECT_EQ(denied.count(critical), 1u) << critical << " is not denied";
  EXPECT_EQ(denied.size(), DeniedSyscalls().size()) << "duplicate names in the deny list";
}

// Exit codes of the child: 0 all good, else which check failed.
enum ChildResult {
  kChildOk = 0,
  kControlMount = 10,     // before the filter, the probe must not already give EPERM
  kControlUnshare,
  kControlClone3,
  kNoNewPrivs = 20,
  kSetSeccomp,
  kMountNotDenied = 30,
  kMountProbeNotDenied,
  kUnshareNotDenied,
  kUnshareProbeNotDenied,
  kSetnsNotDenied,
  kCloneNsNotDenied,
  kClone3NotEnosys,
  kPtraceNotDenied,
  kKeyctlNotDenied,
  kBpfNotDenied,
  kGetpidBroken = 50,
  kWriteBroken,
  kPlainForkBroken,
  kCloneEscaped = 60,
};

const char* Describe(int code) {
  switch (code) {
    case kChildOk: return "ok";
    case kControlMount: return "mount(bad pointers) gave EPERM even without the filter; the probe proves nothing";
    case kControlUnshare: return "unshare(bad flag) gave EPERM even without the filter; the probe proves nothing";
    case kControlClone3: return "clone3(NULL, 0) gave ENOSYS even without the filter; the probe proves nothing";
    case kNoNewPrivs: return "prctl(PR_SET_NO_NEW_PRIVS) failed";
    case kSetSeccomp: return "prctl(PR_SET_SECCOMP) refused the program";
    case kMountNotDenied: return "mount was not denied with EPERM";
    case kMountProbeNotDenied: return "mount(bad pointers) was not denied with EPERM";
    case kUnshareNotDenied: return "unshare(CLONE_NEWUSER) was not denied with EPERM";
    case kUnshareProbeNotDenied: return "unshare(bad flag) was not denied with EPERM";
    case kSetnsNotDenied: return "setns was not denied with EPERM";
    case kCloneNsNotDenied: return "clone(CLONE_NEWUSER) was not denied with EPERM";
    case kClone3NotEnosys: return "clone3 did not fail with ENOSYS";
    case kPtraceNotDenied: return "ptrace was not denied with EPERM";
    case kKeyctlNotDenied: return "keyctl was not denied with EPERM";
    case kBpfNotDenied: return "bpf was not denied with EPERM";
    case kGetpidBroken: return "getpid failed under the filter";
    case kWriteBroken: return "write failed under the filter";
    case kPlainForkBroken: return "a plain fork (clone without namespace flags) failed under the filter";
    case kCloneEscaped: return "clone(CLONE_NEWUSER) created a process";
  }
  return "unknown child exit code";
}

bool FailsWith(long rc, int err) { return rc == -1 && errno == err; }

// Runs in the forked child. Only raw syscalls and async-signal-safe calls.
int ChildChecks(const sock_fprog& prog, int report_fd) {
  // Probes whose unfiltered result is not EPERM even for root: bad pointers
  // make mount fail with EFAULT, an unknown flag makes unshare fail with
  // EINVAL, a NULL clone3 argument gives EINVAL. Under the filter all three
  // must be refused before the kernel looks at the arguments.
  auto* bad = reinterpret_cast<const char*>(1);
  if (FailsWith(::syscall(SYS_mount, bad, bad, bad, 0ul, bad), EPERM)) return kControlMount;
  if (FailsWith(::syscall(SYS_unshare, CLONE_NEWUSER | 0x1), EPERM)) return kControlUnshare;
  if (FailsWith(::syscall(__NR_clone3, nullptr, 0ul), ENOSYS)) return kControlClone3;

  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return kNoNewPrivs;
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) return kSetSeccomp;

  if (!FailsWith(::syscall(SYS_mount, "none", "/nonexistent-dsec-target", "tmpfs", 0ul, nullptr),
                 EPERM))
    return kMountNotDenied;
  if (!FailsWith(::syscall(SYS_mount, bad, bad, bad, 0ul, bad), EPERM)) return kMountProbeNotDenied;
  if (!FailsWith(::syscall(SYS_unshare, CLONE_NEWUSER), EPERM)) return kUnshareNotDenied;
  if (!FailsWith(::syscall(SYS_unshare, CLONE_NEWUSER | 0x1), EPERM)) return kUnshareProbeNotDenied;
  if (!FailsWith(::syscall(SYS_setns, -1, 0), EPERM)) return kSetnsNotDenied;
  if (!FailsWith(::syscall(__NR_clone3, nullptr, 0ul), ENOSYS)) return kClone3NotEnosys;
  if (!FailsWith(::syscall(SYS_ptrace, 0 /*PTRACE_TRACEME*/, 0, 0, 0), EPERM)) return kPtraceNotDenied;
  if (!FailsWith(::syscall(SYS_keyctl, 0 /*KEYCTL_GET_KEYRING_ID*/, -1, 0), EPERM))
    return kKeyctlNotDenied;
  if (!FailsWith(::syscall(SYS_bpf, -1, nullptr, 0), EPERM)) return kBpfNotDenied;

  // clone with a namespace flag (fork semantics: no CLONE_VM, no stack).
  long c = ::syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
  if (c == 0) ::_exit(kCloneEscaped);  // a grandchild that must not exist
  if (c > 0) {
    int st = 0;
    ::waitpid(static_cast<pid_t>(c), &st, 0);
    return kCloneNsNotDenied;
  }
  if (errno != EPERM) return kCloneNsNotDenied;

  // What every program needs still works.
  if (::syscall(SYS_getpid) != ::getpid() || ::getpid() <= 0) return kGetpidBroken;
  static const char kMsg[] = "alive";
  if (::write(report_fd, kMsg, sizeof kMsg - 1) != static_cast<ssize_t>(sizeof kMsg - 1))
    return kWriteBroken;
  long f = ::syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
  if (f == 0) ::_exit(0);
  if (f < 0) return kPlainForkBroken;
  int st = 0;
  if (::waitpid(static_cast<pid_t>(f), &st, 0) != f || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    return kPlainForkBroken;
  return kChildOk;
}

TEST(SeccompFilterTest, LoadedFilterDeniesWhatItPromisesAndAllowsTheRest) {
  auto p = BuildSandboxSeccomp();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const sock_fprog prog = p->prog();

  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << "fork: " << std::strerror(errno);
  if (pid == 0) {
    ::close(fds[0]);
    ::_exit(ChildChecks(prog, fds[1]));
  }
  ::close(fds[1]);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  char buf[16] = {};
  ssize_t n = ::read(fds[0], buf, sizeof buf);
  ::close(fds[0]);

  ASSERT_TRUE(WIFEXITED(st)) << "the child died of signal " << WTERMSIG(st)
                             << " (a filter that kills instead of failing with an errno?)";
  EXPECT_EQ(WEXITSTATUS(st), kChildOk) << Describe(WEXITSTATUS(st));
  if (WEXITSTATUS(st) == kChildOk) {
    EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "alive");
  }
}

}  // namespace
}  // namespace dsec::fncall
