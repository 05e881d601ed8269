#include "drivers/spawner/runner.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>

#include "drivers/spawner/raw_syscall.hpp"

namespace dsec::fncall {

namespace {

using raw::Call;

// Mirrors the kernel's struct sigaction for rt_sigaction.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};

[[noreturn]] void Fail(RunnerShared* s, const char* what, long rc) {
  s->setup_what = what;
  s->setup_errno = static_cast<int>(-rc);
  raw::Exit(1);
}

#define CHECK(call, what)         \
  do {                            \
    long rc_ = (call);            \
    if (rc_ < 0) Fail(s, what, rc_); \
  } while (0)

int ChildMain(void* arg) {
  auto* s = static_cast<RunnerShared*>(arg);
  auto fail = [s](const char* what, long rc, bool user_error = false) {
    s->setup_what = what;
    s->setup_errno = static_cast<int>(-rc);
    s->user_error = user_error;
    raw::Exit(126);
  };
  long rc;
  if ((rc = Call(SYS_dup2, kSlotIn, 0)) < 0 || (rc = Call(SYS_dup2, kSlotOut, 1)) < 0 ||
      (rc = Call(SYS_dup2, kSlotErr, 2)) < 0)
    fail("dup2 stdio", rc);
  Call(SYS_close_range, 3u, ~0u, 0u);
  rlimit core{0, 0};
  if ((rc = Call(SYS_prlimit64, 0, RLIMIT_CPU, &s->cpu, 0)) < 0 ||
      (rc = Call(SYS_prlimit64, 0, RLIMIT_FSIZE, &s->fsize, 0)) < 0 ||
      (rc = Call(SYS_prlimit64, 0, RLIMIT_NOFILE, &s->nofile, 0)) < 0 ||
      (rc = Call(SYS_prlimit64, 0, RLIMIT_CORE, &core, 0)) < 0)
    fail("setrlimit", rc);
  long adj = Call(SYS_open, "/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (adj >= 0) {
    raw::Write(static_cast<int>(adj), "0", 1);  // the runner is -1000; the program is an ordinary victim
    Call(SYS_close, adj);
  }
  if ((rc = Call(SYS_setgroups, 0, 0)) < 0 || (rc = Call(SYS_setresgid, s->gid, s->gid, s->gid)) < 0 ||
      (rc = Call(SYS_setresuid, s->uid, s->uid, s->uid)) < 0)
    fail("drop to the sandbox user", rc);
  // As the sandbox user: it may only enter what that user may.
  if ((rc = Call(SYS_chdir, s->cwd)) < 0) fail("cannot enter the working directory", rc, true);
  // The seccomp filter is already in place (the runner installed it off the
  // per-run path); no_new_privs seals the drop across execve.
  if ((rc = Call(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) < 0) fail("no_new_privs", rc);
  int err = ENOENT;
  for (const char* const* p = s->candidates; *p; ++p) {
    rc = Call(SYS_execve, *p, s->argv, s->envp);
    // Like execvp: remember EACCES, keep looking after ENOENT/ENOTDIR.
    if (rc == -EACCES) err = EACCES;
    else if (rc != -ENOENT && rc != -ENOTDIR) {
      err = static_cast<int>(-rc);
      break;
    }
  }
  s->exec_errno = err;
  raw::Exit(127);
}

}  // namespace

int RunnerEntry(void* arg) {
  auto* start = static_cast<RunnerStart*>(arg);
  RunnerShared* s = start->shared;
  // First, our own fd table with only the slots, then let the spawner go on.
  long unshared = Call(SYS_close_range, kFirstSpawnerFd, ~0u, 2u /*CLOSE_RANGE_UNSHARE*/);
  __atomic_store_n(&s->handed_off, 1, __ATOMIC_RELEASE);
  Call(SYS_futex, &s->handed_off, 1 /*FUTEX_WAKE*/, 1);
  if (unshared < 0) Fail(s, "unshare the fd table", unshared);
  Call(SYS_prctl, PR_SET_NAME, "dsec-runner");
  Call(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL);
  // Signals: nothing blocked, default dispositions (the spawner blocks some
  // for its signalfd and ignores SIGPIPE; the program must not inherit that).
  unsigned long none = 0;
  Call(SYS_rt_sigprocmask, SIG_SETMASK, &none, 0, sizeof none);
  // The spawner reset every other disposition to the default at start
  // (whatever dsecd's parent ignored); SIGPIPE is the one it ignores itself.
  KernelSigaction dfl{SIG_DFL, 0, nullptr, 0};
  Call(SYS_rt_sigaction, SIGPIPE, &dfl, 0, sizeof(unsigned long));

  for (int i = 0; i < s->cgroup_hierarchies; ++i)
    CHECK(raw::Write(kSlotCgroup + i, "0", 1), "join the run's cgroup");
  Call(SYS_close_range, kSlotCgroup, kSlotCpuCgroup - 1, 0u);
  if (s->has_net_ns) CHECK(Call(SYS_setns, kSlotNet, CLONE_NEWNET), "enter the net namespace");
  if (s->has_ipc_ns) CHECK(Call(SYS_setns, kSlotIpc, CLONE_NEWIPC), "enter the ipc namespace");
  CHECK(Call(SYS_setns, kSlotRoot, CLONE_NEWNS), "enter the host root");
  CHECK(Call(SYS_unshare, CLONE_NEWNS), "unshare the mount namespace");
  CHECK(Call(SYS_mount, "work", "/work", "tmpfs", MS_NOSUID | MS_NODEV, s->work_opts), "mount /work");
  CHECK(Call(SYS_mount, "tmp", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, s->tmp_opts), "mount /tmp");
  CHECK(Call(SYS_mount, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, 0), "mount /proc");
  CHECK(Call(SYS_chdir, "/work"), "chdir /work");
  // The namespace fds and the host root's are no longer needed.
  Call(SYS_close_range, kSlotNet, kSlotIpc, 0u);
  Call(SYS_close, kSlotRoot);
  Call(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0);
  // Last: the sandbox's seccomp filter, inherited by the program. Nothing the
  // runner does from here on needs a denied call.
  CHECK(Call(SYS_prctl, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, s->seccomp, 0, 0), "install seccomp");

  char b = kRunnerReady;
  if (raw::Write(kSlotCtl, &b, 1) != 1) raw::Exit(0);
  long n;
  do {
    n = Call(SYS_read, kSlotCtl, &b, 1);
  } while (n == -EINTR);
  if (n != 1 || b != kRunnerGo) raw::Exit(0);  // the spawner dropped us
  // CPU limits need the cpu/cpuacct groups; joining them costs, so only then.
  if (s->join_cpu)
    for (int i = 0; i < s->cpu_hierarchies; ++i)
      CHECK(raw::Write(kSlotCpuCgroup + i, "0", 1), "join the run's cpu cgroup");
  Call(SYS_close_range, kSlotCpuCgroup, kFirstSpawnerFd - 1, 0u);
  // Our own CPU so far is setup, not the run: the spawner subtracts it.
  struct rusage self_usage;
  if (Call(SYS_getrusage, RUSAGE_SELF, &self_usage) == 0)
    s->setup_cpu_us = self_usage.ru_utime.tv_sec * 1000000L + self_usage.ru_utime.tv_usec +
                      self_usage.ru_stime.tv_sec * 1000000L + self_usage.ru_stime.tv_usec;

  // glibc's clone() switches stacks and calls ChildMain there; it only
  // touches errno if it fails, and then the run is lost anyway.
  long child = ::clone(ChildMain, start->child_stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, s);
  if (child < 0) Fail(s, "start the program", -EAGAIN);
  Call(SYS_close, kSlotOut);
  Call(SYS_close, kSlotErr);
  Call(SYS_close, kSlotIn);
  // Reap everything; the program's own status is the one we record.
  for (;;) {
    int status = 0;
    long p = Call(SYS_wait4, -1, &status, 0, 0);
    if (p == -EINTR) continue;
    if (p < 0) break;
    if (p == child) {
      s->wait_status = status;
      s->reported = true;
      break;
    }
  }
  raw::Exit(0);
}

}  // namespace dsec::fncall
