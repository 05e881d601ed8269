// A pool runner: the process that becomes PID 1 of one fncall sandbox. The
// spawner clones it into a fresh pid namespace and hands it a net and an ipc
// namespace from its pools (or fresh ones, with --fresh-namespaces). The runner joins its cgroup, enters the host-root
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

// Descriptors a runner starts with. The spawner dup2()s the runner's ends
// into these slots and clones it sharing its fd table (CLONE_FILES); the
// runner's first act is close_range(kFirstSpawnerFd, ~0, CLOSE_RANGE_UNSHARE),
// which gives it a private table holding only the slots: ten entries copied
// instead of the spawner's hundreds inherited and closed one by one. The
// spawner waits for that (RunnerShared::handed_off) before it touches its
// table again.
inline constexpr int kSlotRoot = 3; // the host-root mount namespace (fixed for the spawner's life)
inline constexpr int kSlotCtl = 4;  // socket to the spawner: runner writes 'R', reads 'G'
inline constexpr int kSlotOut = 5;  // the program's stdout (pipe, write end)
inline constexpr int kSlotErr = 6;  // the program's stderr
inline constexpr int kSlotIn = 7;   // the program's stdin (pipe, read end)
inline constexpr int kSlotNet = 8;  // net namespace to enter (when has_net_ns)
inline constexpr int kSlotIpc = 9;  // ipc namespace to enter (when has_ipc_ns)
inline constexpr int kSlotCgroup = 10;  // +0, +1: cgroup.procs joined at setup (memory, pids)
inline constexpr int kSlotCpuCgroup = 12;  // +0, +1: cgroup.procs joined at "go" when join_cpu
inline constexpr int kFirstSpawnerFd = 14;

// Written by the spawner before clone (setup) and before "go" (the run);
// written by the runner and its child only for the results. The spawner
// reads results after it has reaped the runner.
struct RunnerShared {
  // --- setup, fixed before clone ---
  bool has_net_ns = false;      // false: cloned with CLONE_NEWNET
  bool has_ipc_ns = false;      // false: cloned with CLONE_NEWIPC
  int handed_off = 0;           // futex word: 1 once the runner has its own fd table
  int cgroup_hierarchies = 0;   // how many kSlotCgroup slots are filled
  int cpu_hierarchies = 0;      // how many kSlotCpuCgroup slots are filled
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
  bool join_cpu = false;        // the run has a CPU quota or CPU-time limit
  // --- results ---
  const char* setup_what = nullptr;  // set when setup or the pre-exec steps failed
  int setup_errno = 0;
  bool user_error = false;           // setup_what is the request's fault (bad cwd)
  int exec_errno = 0;                // execve failed with this
  int wait_status = 0;               // the program's, as from waitpid
  bool reported = false;             // the runner saw the program end
  long setup_cpu_us = 0;             // the runner's own CPU before "go" (not the run's)
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
