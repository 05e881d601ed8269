// A pooled group for one-shot runs (fncall): made once per spawner slot and
// reused run after run, with its control files kept open so a run costs a
// few pread/pwrite calls and no path walk through cgroupfs. Made by
// Groups::MakeRunSlot; the v1 one is CgroupSlot (cgroup_v1.hpp), the v2 one
// lives in cgroup_v2.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::cgroup {

class RunSlot {
 public:
  virtual ~RunSlot() = default;
  // cgroup.procs files, open for writing, for a process to join itself by
  // writing "0": JoinFds every run joins (at most two); CpuJoinFds only runs
  // with a CPU quota or a CPU-time limit join (v1's cpu and cpuacct
  // hierarchies when mounted apart; none in v2, where one group holds all).
  virtual std::vector<int> JoinFds() const = 0;
  virtual std::vector<int> CpuJoinFds() const = 0;
  // Each writes only when the value changes. memory: bytes (no swap beyond
  // it); pids: 0 is no limit; millis: CPU per second, 0 is no limit.
  virtual Status SetMemoryLimit(uint64_t bytes) = 0;
  virtual Status SetPidsMax(uint32_t n) = 0;
  virtual Status SetCpuQuota(uint32_t millis) = 0;
  // Start of a run: the peak back to the current usage, and CPU usage
  // counted from here (v1: only when the run joins the cpu groups).
  virtual void ResetCounters(bool cpu) = 0;
  virtual uint64_t CpuUsageNs() = 0;  // since ResetCounters
  virtual uint64_t PeakBytes() = 0;   // since ResetCounters
  virtual uint64_t OomKills() = 0;    // ever; compare with the count at the start
  // False when the peak cannot be reset (cgroup v2 before Linux 6.12): the
  // group then serves one run and is made anew for the next.
  virtual bool Reusable() const = 0;
  // Kills anything left inside (there should be nothing), then removes it.
  virtual void Remove() = 0;
};

}  // namespace dsec::cgroup
