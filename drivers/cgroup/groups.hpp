// What a container needs of cgroups, behind one interface whichever
// hierarchy the host mounts: cgroup v1 (controllers mounted apart,
// cgroup_v1.hpp) or the unified cgroup v2 hierarchy (cgroup_v2.cpp). A
// group is named by its path below the hierarchy root (`rel`, e.g.
// dsec/c/<sandbox id>). fncall's pooled run groups are RunSlots
// (run_slot.hpp), made here too.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "drivers/cgroup/cgroup_v1.hpp"
#include "dsec/status.hpp"

namespace dsec::cgroup {

// The value after `key ` in a flat keyed cgroup file (cpu.stat,
// memory.stat, memory.events); 0 when absent or unreadable.
uint64_t Keyed(const std::string& file, const std::string& key);

class Groups {
 public:
  virtual ~Groups() = default;
  // v1 when its controllers are mounted; else the v2 hierarchy mounted at
  // /sys/fs/cgroup when it offers the memory, pids and cpu controllers;
  // else FailedPrecondition saying what is missing from each.
  static Result<std::unique_ptr<Groups>> Discover();
  static std::unique_ptr<Groups> V1(const CgroupMounts& m);
  // A cgroup2 mount (`root`); its controllers may be fewer than a
  // container's limits need (then ApplyLimits says which is missing).
  static std::unique_ptr<Groups> V2(const std::string& root);
  // Where a cgroup2 filesystem is mounted: /sys/fs/cgroup when it is one,
  // else the first found ("" when nowhere).
  static std::string V2Mount();

  virtual const char* version() const = 0;  // "v1", "v2"
  virtual bool Exists(const std::string& rel) const = 0;
  virtual std::vector<std::string> List(const std::string& rel) const = 0;  // its subgroups' names
  // mkdir -p (EEXIST is fine); in v2 the controllers are enabled on the way.
  virtual Status Make(const std::string& rel) = 0;
  // The cgroup.procs files a process writes itself into to join the group.
  virtual std::vector<std::string> ProcsPaths(const std::string& rel) const = 0;
  virtual std::vector<pid_t> Pids(const std::string& rel) const = 0;
  // Writes the values of `want` that differ from `*have` and updates *have.
  // A limit the hierarchy cannot enforce (its controller is not there) is
  // FailedPrecondition, never dropped.
  virtual Status ApplyLimits(const std::string& rel, const GroupLimits& want, GroupLimits* have) = 0;
  virtual bool CanFreeze() const = 0;
  // Freezes (waits until frozen, up to 5 s, else thaws again and says so)
  // or thaws everything inside.
  virtual Status Freeze(const std::string& rel, bool frozen) = 0;
  virtual bool Frozen(const std::string& rel) const = 0;  // frozen or freezing
  // Asks the kernel to reclaim what it can of the group's memory now (its
  // page cache; anonymous memory only where there is swap): v1's
  // memory.force_empty, v2's memory.reclaim. For idle or frozen groups.
  virtual Status ReclaimMemory(const std::string& rel) = 0;
  virtual uint64_t CpuUsageNs(const std::string& rel) const = 0;
  virtual uint64_t OomKills(const std::string& rel) const = 0;
  // Its memory now: all it is charged, page cache included; the cache's
  // part; and what of the cache is inactive (reclaimable first; shmem, a
  // tmpfs file's pages, never is). v1 memory.usage_in_bytes, total_cache,
  // total_inactive_file; v2 memory.current, file, inactive_file.
  struct MemoryUse {
    uint64_t charged = 0;
    uint64_t cache = 0;
    uint64_t inactive_file = 0;
  };
  virtual MemoryUse Memory(const std::string& rel) const = 0;
  // Kills everything inside and waits, up to 1 s, until nothing is left;
  // leaves it thawed. True when it is empty.
  virtual bool Empty(const std::string& rel) = 0;
  // Renames the group (same parent); nothing changes when it fails. v1
  // only: cgroup v2 refuses renames (EPERM), so there a group is made anew
  // for each container instead of recycled (CanRename false; Rename says so).
  virtual bool CanRename() const = 0;
  virtual Status Rename(const std::string& rel, const std::string& to) = 0;
  // A pooled group for one-shot runs at `rel` (made here), its control
  // files open. FailedPrecondition naming the controller when the hierarchy
  // lacks one a run's limits need.
  virtual Result<std::unique_ptr<RunSlot>> MakeRunSlot(const std::string& rel) = 0;
  // Removes the groups sp<pid> under `parent` whose spawner (pid) is gone,
  // killing what is left inside; returns how many.
  virtual int SweepStaleSpawners(const std::string& parent) = 0;
  // Kills everything in the group and below, and removes them.
  virtual void KillAndRemove(const std::string& rel) = 0;
  // rmdir, ignoring "not empty" and "absent".
  virtual void RemoveDirs(const std::string& rel) = 0;

  // Stops a container whose init (PID 1 of its own pid namespace) is
  // init_pid: SIGKILL to the init, through a pidfd taken only once the init
  // is seen in the group (a reused pid is never signalled), ends every
  // process of its namespace; thawed first if `frozen`. Falls back to Empty
  // when the init is not there or something is left. True when empty.
  bool StopContainer(const std::string& rel, pid_t init_pid, bool frozen);
};

}  // namespace dsec::cgroup
