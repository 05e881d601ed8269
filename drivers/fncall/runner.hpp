// A pool runner: the process that becomes PID 1 of one fncall sandbox. The
// spawner clones it into fresh pid and ipc namespaces (and net, unless net
// namespaces are recycled). The runner joins its cgroup, enters the host-root
// mount namespace and copies it, mounts its private /work, /tmp and /proc,
// installs the seccomp filter, says ready, and waits. On "go" it starts the
// program as an unprivileged child (rlimits, no capabilities, no new
// privileges), reaps everything, records the program's status and exits,
// which kills whatever is left in its pid namespace.
//
// A runner shares the spawner's memory (CLONE_VM): no page-table copy, no
// copy-on-write faults and no address-space teardown per run, which on this
// kind of VM are the largest costs of a fork. The price: runner code uses raw
// system calls only (raw_syscall.hpp) — no malloc, no errno, no libc state —
// and talks to the spawner through RunnerShared and one byte on a socket.
// Namespace and privilege syscalls live here.
#pragma once

#include <linux/filter.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>

namespace dsec::fncall {

// Written by the spawner before clone (setup) and before "go" (the run);
// written by the runner and its child only for the results. The spawner
// reads results after it has reaped the runner.
struct RunnerShared {
  // --- setup, fixed before clone ---
  int ctl = -1;                 // socket to the spawner: runner writes 'R', reads 'G'
  int out_w = -1, err_w = -1, in_r = -1;
  int net_ns = -1;              // -1: cloned with CLONE_NEWNET
  int mnt_ns = -1;              // the host root (sandbox_root.hpp)
  const char* cgroup_procs[4] = {nullptr, nullptr, nullptr, nullptr};
  const char* work_opts = nullptr;  // tmpfs options of /work and /tmp
  const char* tmp_opts = nullptr;
  const sock_fprog* seccomp = nullptr;
  uid_t uid = 65534;
  gid_t gid = 65534;
  // --- the run, filled before "go" ---
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const char* const* candidates = nullptr;  // execve paths to try, in order
  const char* cwd = "/work";
  rlimit cpu{RLIM_INFINITY, RLIM_INFINITY};
  rlimit fsize{RLIM_INFINITY, RLIM_INFINITY};
  rlimit nofile{1024, 1024};
  // --- results ---
  const char* setup_what = nullptr;  // set when setup or the pre-exec steps failed
  int setup_errno = 0;
  int exec_errno = 0;                // execve failed with this
  int wait_status = 0;               // the program's, as from waitpid
  bool reported = false;             // the runner saw the program end
};

inline constexpr char kRunnerReady = 'R';
inline constexpr char kRunnerGo = 'G';

// Stack sizes the spawner allocates per runner.
inline constexpr size_t kRunnerStackBytes = 64 << 10;
inline constexpr size_t kChildStackBytes = 32 << 10;

struct RunnerStart {
  RunnerShared* shared;
  char* child_stack_top;  // for the program's pre-exec child (CLONE_VM|CLONE_VFORK)
};

// clone() entry; `arg` is a RunnerStart*. Exits 0 after a run, 1 when setup
// failed (shared->setup_what says what), 0 when the spawner went away.
int RunnerEntry(void* arg);

}  // namespace dsec::fncall
