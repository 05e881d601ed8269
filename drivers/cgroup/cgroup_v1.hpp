// cgroup v1 for sandboxes: the controller mounts (memory, pids, cpu,
// cpuacct, and freezer when present; separate or co-mounted). fncall runs
// use recycled groups under one directory per spawner (<mount>/dsec/sp<pid>)
// with their control files kept open, so a run costs a few pread/pwrite
// calls rather than mkdir/rmdir; a container has a group of its own
// (<mount>/dsec/c/<sandbox id>) that outlives dsecd restarts. Callers go
// through groups.hpp (Groups, RunSlot), which picks v1 or v2; raw cgroupfs
// access lives in this folder and nowhere else.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "drivers/cgroup/run_slot.hpp"
#include "dsec/status.hpp"
#include "runtime/clock.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::cgroup {

struct CgroupMounts {
  std::string memory, pids, cpu, cpuacct;  // mount points; cpu may == cpuacct
  std::string freezer;                      // empty when not mounted
  // The distinct hierarchies, each once.
  std::vector<std::string> Hierarchies() const;
};

// Finds the v1 controller mounts. FailedPrecondition naming what is missing
// (including "this host uses the cgroup v2 unified hierarchy").
Result<CgroupMounts> DiscoverCgroupMounts();

// Removes groups under <mount>/<parent>/sp<pid> whose spawner pid is gone:
// kills what is left inside and rmdirs. Returns how many it removed.
int SweepStaleSpawnerGroups(const CgroupMounts& m, const std::string& parent);

// One recycled group for runs (RunSlot): <mount>/<base>/r<index> in each
// hierarchy, with its control files kept open (runners do not inherit the
// spawner's descriptors, see runner.hpp, so holding many is free). Also, by
// Paths, the by-path view of any v1 group (the v1 Groups adapter's).
class CgroupSlot final : public RunSlot {
 public:
  static Result<CgroupSlot> Create(const CgroupMounts& m, const std::string& rel);
  // The paths of an existing group, no descriptor open (a container's
  // group: its limits are written by path, ApplyGroupLimits).
  static CgroupSlot Paths(const CgroupMounts& m, const std::string& rel);
  CgroupSlot() = default;
  CgroupSlot(CgroupSlot&&) = default;
  CgroupSlot& operator=(CgroupSlot&&) = default;

  Status Attach(pid_t pid);
  // RunSlot: the memory and pids hierarchies, which every run joins, and the
  // cpu and cpuacct ones (those not shared with the first two).
  std::vector<int> JoinFds() const override;
  std::vector<int> CpuJoinFds() const override;
  // Every hierarchy's cgroup.procs, by path (a container's init joins all).
  std::vector<std::string> ProcsPaths() const;
  Status SetMemoryLimit(uint64_t bytes) override;
  Status SetPidsMax(uint32_t n) override;
  Status SetCpuQuota(uint32_t millis) override;
  void ResetCounters(bool cpu) override;
  uint64_t CpuUsageNs() override;
  // The same, opening cpuacct.usage (after CloseFiles).
  uint64_t CpuUsageNsByPath() const;
  uint64_t PeakBytes() override;
  uint64_t OomKills() override;
  bool Reusable() const override { return true; }
  // Pause / resume everything inside (freezer); FailedPrecondition without
  // a freezer hierarchy.
  Status Freeze(bool frozen);
  // True when the freezer holds the group FROZEN (or FREEZING).
  bool Frozen();
  // Pids inside (the memory hierarchy's view).
  std::vector<pid_t> Pids() const;
  void Remove() override;
  // Closes the control files; OomKills, Freeze, Frozen, Pids and Remove go
  // on working (they open what they need), the rest must not be called. For
  // long-lived groups (containers): thousands of them would otherwise hold
  // a dozen descriptors each.
  void CloseFiles();
  const std::string& rel() const { return rel_; }

 private:
  std::string rel_;
  std::vector<std::string> dirs_;   // absolute, one per hierarchy
  std::vector<UniqueFd> procs_;     // cgroup.procs per hierarchy
  std::vector<bool> cpu_only_;      // per hierarchy: cpu/cpuacct, not memory/pids
  std::vector<bool> freezer_only_;  // per hierarchy: the freezer alone
  UniqueFd freezer_state_;
  std::string mem_dir_, freezer_dir_, acct_dir_;  // for what CloseFiles closed
  UniqueFd mem_limit_, mem_peak_, mem_oom_, pids_max_, cpu_quota_, cpu_period_, cpuacct_usage_;
  UniqueFd memsw_limit_;  // memory+swap; absent when the kernel does not account swap
  uint64_t cur_mem_ = UINT64_MAX;  // a new group is unlimited
  int64_t cur_pids_ = -2, cur_quota_ = -2;
};

// How long killed processes get to leave their group before a destroy says
// some are stuck. A loaded host needs seconds: hundreds of containers
// killed at once (a trainer closing its rollouts) have their pid and mount
// namespaces torn down one after another. A process stuck in the kernel
// never leaves; the destroy then fails ("destroy it again"). A container's
// destroy waits in up to three such phases (its init, its group, the group
// removed), 15 s at most: within the SDK's 30 s call timeout.
constexpr int kKilledLeaveMs = 5000;
// Calls `empty()` every 5 ms until it says true, for kKilledLeaveMs from
// `start_ms` (SteadyClockMs() when the kill went out) at most; its last answer.
bool WaitForKilled(const std::function<bool()>& empty, int64_t start_ms);

// Kills everything in <mount>/<rel> of every hierarchy (freezing it first
// when a freezer is mounted) and removes the directories; waits for the
// killed processes as WaitForKilled does.
void KillAndRemoveGroup(const CgroupMounts& m, const std::string& rel);

// mkdir -p of <root>/<rel> (EEXIST is fine), starting over (10 times at
// most) when a parent vanishes between the mkdirs: another spawner removes
// the shared parent when it looks empty. `before_each`, when given, is
// called with each directory before its child is made (v2 enables the
// controllers there).
Status MakeDirsUnder(const std::string& root, const std::string& rel,
                     const std::function<void(const std::string&)>& before_each = nullptr);
// mkdir -p of <mount>/<rel> in every hierarchy (EEXIST is fine).
Status MakeGroupDirs(const CgroupMounts& m, const std::string& rel);
// Kills everything in <mount>/<rel> (frozen first when a freezer is
// mounted) and waits (WaitForKilled) until nothing is left in it; leaves it
// thawed. True when it is empty.
bool EmptyGroup(const CgroupMounts& m, const std::string& rel);
// The sandbox-wide limits a container's group holds. A recycled group keeps
// the last container's values, so a creation with the same spec as the last
// one writes nothing. kUnknown: not known (a group found at start-up), so
// written whatever it is.
struct GroupLimits {
  static constexpr int64_t kUnknown = -3;
  int64_t memory = kUnknown;     // bytes; -1: unlimited (memory+swap follows it)
  int64_t pids = kUnknown;       // -1: max
  int64_t cpu_quota = kUnknown;  // microseconds per 100 ms period; -1: unlimited
  // What the kernel gives a new group.
  static GroupLimits Fresh() { return GroupLimits{-1, -1, -1}; }
};
// Writes the values of `want` that differ from `*have`, opening each file by
// path (a container keeps no descriptor on its group), and updates *have.
Status ApplyGroupLimits(const CgroupMounts& m, const std::string& rel, const GroupLimits& want, GroupLimits* have);
// Renames <rel> to <to_rel> (same parent) in every hierarchy, undoing the
// renames done when one fails. Recycling a memory group this way spares the
// kernel its removal, which costs more the more superblocks are mounted.
Status RenameGroup(const CgroupMounts& m, const std::string& rel, const std::string& to_rel);
// rmdir of <mount>/<rel> in every hierarchy, ignoring "not empty" and "absent".
void RemoveGroupDirs(const CgroupMounts& m, const std::string& rel);

}  // namespace dsec::cgroup
