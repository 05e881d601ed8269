// The init of a container: cloned by dsec-spawner into new pid, ipc and uts
// namespaces (and a net namespace from its pool), it joins the container's
// cgroups, makes the overlay root (the image's EROFS mount as the lower
// layer, a per-sandbox upper) and the /run/dsec bind as detached mounts
// while the host's paths still resolve, enters a copy of the empty base
// mount namespace, attaches them there with a private /proc and a minimal
// /dev, moves the root over / and chroots into it, binds the agent's socket
// (its directory read-only once bound), installs the seccomp filter (which
// denies chroot, so no chroot escape), and executes dsec-agent as PID 1,
// which owns every process of the container from then on.
//
// It runs with CLONE_VM, like the fncall runner, so it uses raw system calls
// only: no malloc, no errno, no libc state. Several run at once: the spawner
// waits only until an init has its own fd table (handed_off), then goes on
// with the next; the status pipe (kInitSlotStatus) tells it when each is done.
#pragma once

#include <linux/filter.h>

#include "drivers/spawner/runner.hpp"
#include "drivers/spawner/sandbox_caps.hpp"

namespace dsec::container {

// Descriptors the init starts with (the spawner dup2()s them in before the
// clone; the init keeps only these, see fncall/runner.hpp for the scheme).
inline constexpr int kInitSlotNet = 4;      // net namespace to enter (when has_net_ns)
inline constexpr int kInitSlotCgroup = 5;   // +i: cgroup.procs to join (i < 6)
inline constexpr int kInitSlotMntBase = 11; // mount namespace to start from (BuildContainerBaseNamespace)
// Write end of a pipe the init keeps until it executes the agent (close on
// exec) or fails: EOF there tells the spawner the init is done either way.
inline constexpr int kInitSlotStatus = 12;
// A socket to the spawner, where the init sends its seccomp filter's
// listener (SCM_RIGHTS) with the sandbox's id, right before the agent.
inline constexpr int kInitSlotNotify = 13;
// The spawner's own descriptors start here (and the fncall runner slots end).
inline constexpr int kInitFirstFree = fncall::kFirstSpawnerFd;
static_assert(kInitSlotCgroup + 6 <= kInitSlotMntBase && kInitSlotMntBase < kInitSlotStatus &&
                  kInitSlotStatus < kInitSlotNotify && kInitSlotNotify < kInitFirstFree,
              "container slots overlap each other or the spawner's fds");

// Root in the container keeps what package managers and build tools use
// (Docker's default set minus MKNOD: there is no devices cgroup to make a
// block-device node harmless) and loses the rest, from the bounding set too,
// so no exec can get them back. A spawner serving containers keeps these in
// its own bounding set (spawner.cpp); the init drops everything else.
// kContainerCaps: drivers/spawner/sandbox_caps.hpp.

// The container spawner's nice value (spawner.cpp); every init resets its
// own to 0 before it executes the agent.
inline constexpr int kContainerLaneNice = -10;

struct ContainerSetup {
  // Prepared by the spawner (strings live in its memory, shared).
  const char* lower = nullptr;         // overlay lowerdir ("<image>:<skeleton>"), upper and work dirs
  const char* upper = nullptr;
  const char* work = nullptr;
  const char* run_dir = nullptr;       // host dir bound at /run/dsec
  const char* agent_path = nullptr;    // host path of the static dsec-agent
  const char* hostname = nullptr;
  bool has_net_ns = false;             // false: cloned with CLONE_NEWNET
  bool loopback_up = true;             // bring `lo` up inside
  int cgroups = 0;                     // kInitSlotCgroup slots filled
  const char* const* read_only = nullptr;  // paths in the root bound read-only over themselves
  int read_only_count = 0;
  const sock_fprog* seccomp = nullptr;
  const char* sandbox_id = nullptr;    // sent with the filter's listener (kInitSlotNotify)
  char* const* agent_argv = nullptr;
  char* const* agent_envp = nullptr;
  // Futex word: 1 once the init has its own fd table (the spawner's slots
  // may change again); 2 when it could not get one (failed_* are set and it
  // exits: its stack is in use until it is reaped).
  int handed_off = 0;
  // 1 just before the agent's execve: an init whose status pipe closes
  // without this and without failed_what died in its setup (a signal).
  int reached_exec = 0;
  // Results (read by the spawner once kInitSlotStatus reports EOF).
  const char* failed_what = nullptr;
  int failed_errno = 0;
};

// clone() entry; `arg` is a ContainerSetup*. Executes the agent, or exits 1
// with failed_what/failed_errno set.
int ContainerInitEntry(void* arg);

}  // namespace dsec::container
