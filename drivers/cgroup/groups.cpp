// Groups: the choice of hierarchy, the v1 adapter (cgroup_v1.hpp's
// functions), and what both versions share.
#include "drivers/cgroup/groups.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::cgroup {

namespace {

class GroupsV1 final : public Groups {
 public:
  explicit GroupsV1(const CgroupMounts& m) : m_(m) {}
  const char* version() const override { return "v1"; }
  bool Exists(const std::string& rel) const override {
    struct stat st;
    return ::stat((m_.memory + "/" + rel).c_str(), &st) == 0;
  }
  std::vector<std::string> List(const std::string& rel) const override { return ListSubdirs(m_.memory + "/" + rel); }
  Status Make(const std::string& rel) override { return MakeGroupDirs(m_, rel); }
  std::vector<std::string> ProcsPaths(const std::string& rel) const override {
    return CgroupSlot::Paths(m_, rel).ProcsPaths();
  }
  std::vector<pid_t> Pids(const std::string& rel) const override { return CgroupSlot::Paths(m_, rel).Pids(); }
  Status ApplyLimits(const std::string& rel, const GroupLimits& want, GroupLimits* have) override {
    return ApplyGroupLimits(m_, rel, want, have);
  }
  bool CanFreeze() const override { return !m_.freezer.empty(); }
  Status Freeze(const std::string& rel, bool frozen) override { return CgroupSlot::Paths(m_, rel).Freeze(frozen); }
  bool Frozen(const std::string& rel) const override { return CgroupSlot::Paths(m_, rel).Frozen(); }
  Status ReclaimMemory(const std::string& rel) override {
    std::string file = m_.memory + "/" + rel + "/memory.force_empty";
    UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return Status::FromErrno(errno, "cgroup " + rel + ": open memory.force_empty");
    if (::write(fd.get(), "0", 1) < 0) return Status::FromErrno(errno, "cgroup " + rel + ": write memory.force_empty");
    return Status::Ok();
  }
  uint64_t CpuUsageNs(const std::string& rel) const override { return CgroupSlot::Paths(m_, rel).CpuUsageNsByPath(); }
  uint64_t OomKills(const std::string& rel) const override { return CgroupSlot::Paths(m_, rel).OomKills(); }
  MemoryUse Memory(const std::string& rel) const override {
    auto usage = ReadFileToString(m_.memory + "/" + rel + "/memory.usage_in_bytes");
    std::string stat = m_.memory + "/" + rel + "/memory.stat";
    return {usage.ok() ? std::strtoull(usage->c_str(), nullptr, 10) : 0, Keyed(stat, "total_cache"),
            Keyed(stat, "total_inactive_file")};
  }
  bool Empty(const std::string& rel) override { return EmptyGroup(m_, rel); }
  bool CanRename() const override { return true; }
  Status Rename(const std::string& rel, const std::string& to) override { return RenameGroup(m_, rel, to); }
  Result<std::unique_ptr<RunSlot>> MakeRunSlot(const std::string& rel) override {
    auto slot = CgroupSlot::Create(m_, rel);
    if (!slot.ok()) return slot.status();
    return std::unique_ptr<RunSlot>(std::make_unique<CgroupSlot>(std::move(*slot)));
  }
  int SweepStaleSpawners(const std::string& parent) override { return SweepStaleSpawnerGroups(m_, parent); }
  void KillAndRemove(const std::string& rel) override { KillAndRemoveGroup(m_, rel); }
  void RemoveDirs(const std::string& rel) override { RemoveGroupDirs(m_, rel); }

 private:
  CgroupMounts m_;
};

}  // namespace

std::unique_ptr<Groups> Groups::V1(const CgroupMounts& m) { return std::make_unique<GroupsV1>(m); }

std::string Groups::V2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line, first;
  while (std::getline(in, line)) {
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::stringstream pre(line.substr(0, dash)), post(line.substr(dash + 3));
    std::string id, parent, dev, root, mnt, fstype;
    pre >> id >> parent >> dev >> root >> mnt;
    post >> fstype;
    if (fstype != "cgroup2") continue;
    if (mnt == "/sys/fs/cgroup") return mnt;  // the usual place, wherever else one is mounted
    if (first.empty()) first = mnt;
  }
  return first;
}

Result<std::unique_ptr<Groups>> Groups::Discover() {
  auto v1 = DiscoverCgroupMounts();
  if (v1.ok()) return V1(*v1);
  std::string v2 = V2Mount();
  if (v2.empty()) return v1.status();
  auto controllers = ReadFileToString(v2 + "/cgroup.controllers");
  std::string have = controllers.ok() ? *controllers : "";
  std::string missing;
  for (const char* c : {"memory", "pids", "cpu"}) {
    std::stringstream ss(have);
    std::string word;
    bool found = false;
    while (ss >> word) found = found || word == c;
    if (!found) missing += std::string(" ") + c;
  }
  if (!missing.empty())
    return Status::FailedPrecondition(v1.status().message() + "; and the cgroup v2 hierarchy at " + v2 +
                                      " lacks the controllers:" + missing);
  return V2(v2);
}

bool Groups::StopContainer(const std::string& rel, pid_t init_pid, bool frozen) {
  auto has = [&](pid_t pid) {
    auto pids = Pids(rel);
    return std::find(pids.begin(), pids.end(), pid) != pids.end();
  };
  UniqueFd pidfd;
  if (init_pid > 0 && has(init_pid)) {
    pidfd.Reset(static_cast<int>(::syscall(SYS_pidfd_open, init_pid, 0)));
    // Still in the group once we hold it: the pidfd is that init, not a
    // process that got its pid after it died.
    if (pidfd && !has(init_pid)) pidfd.Reset();
  }
  bool stopped = false;
  if (pidfd && ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0) == 0) {
    // A frozen init takes the signal only once thawed.
    if (frozen && CanFreeze()) (void)Freeze(rel, false);  // a failed thaw shows as the init not exiting, below
    // The init exits only after every other process of its namespace has
    // (on a loaded host that takes seconds: see kKilledLeaveMs).
    pollfd p{pidfd.get(), POLLIN, 0};
    stopped = ::poll(&p, 1, kKilledLeaveMs) == 1 && Pids(rel).empty();
  }
  return stopped || Empty(rel);
}

}  // namespace dsec::cgroup
