// cgroup v2: one unified hierarchy. Freezing is cgroup.freeze (its state in
// cgroup.events), killing a whole group is cgroup.kill, limits are
// memory.max (+ memory.swap.max), pids.max and cpu.max, usage is cpu.stat
// and OOM kills are memory.events. Controllers are enabled for children
// through each ancestor's cgroup.subtree_control.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "drivers/cgroup/groups.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::cgroup {

namespace {
uint64_t KeyedText(const std::string& text, const std::string& key);
}  // namespace

uint64_t Keyed(const std::string& file, const std::string& key) {
  auto text = ReadFileToString(file);
  return text.ok() ? KeyedText(*text, key) : 0;
}

namespace {

// The value after `key ` in a flat keyed file's text (cgroup.events,
// cpu.stat, memory.events); 0 when absent.
uint64_t KeyedText(const std::string& text, const std::string& key) {
  std::stringstream in(text);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

bool Contains(const std::string& words, const std::string& w) {
  std::stringstream ss(words);
  std::string x;
  while (ss >> x)
    if (x == w) return true;
  return false;
}

class GroupsV2 final : public Groups {
 public:
  explicit GroupsV2(std::string root) : root_(std::move(root)) {}
  const char* version() const override { return "v2"; }

  bool Exists(const std::string& rel) const override {
    struct stat st;
    return ::stat(Dir(rel).c_str(), &st) == 0;
  }
  std::vector<std::string> List(const std::string& rel) const override { return ListSubdirs(Dir(rel)); }

  Status Make(const std::string& rel) override { return MakeDirsUnder(root_, rel, EnableControllers); }

  std::vector<std::string> ProcsPaths(const std::string& rel) const override { return {Dir(rel) + "/cgroup.procs"}; }

  std::vector<pid_t> Pids(const std::string& rel) const override {
    std::vector<pid_t> pids;
    std::ifstream in(Dir(rel) + "/cgroup.procs");
    for (pid_t p; in >> p;) pids.push_back(p);
    return pids;
  }

  Status ApplyLimits(const std::string& rel, const GroupLimits& want, GroupLimits* have) override {
    if (want.memory != have->memory) {
      have->memory = GroupLimits::kUnknown;  // until both are written
      DSEC_RETURN_IF_ERROR(Write(rel, "memory.max", Value(want.memory), want.memory < 0, "memory"));
      // No swap beyond the memory limit (v1: memory+swap = memory).
      DSEC_RETURN_IF_ERROR(Write(rel, "memory.swap.max", want.memory < 0 ? "max" : "0", true, "memory"));
      have->memory = want.memory;
    }
    if (want.pids != have->pids) {
      have->pids = GroupLimits::kUnknown;
      DSEC_RETURN_IF_ERROR(Write(rel, "pids.max", Value(want.pids), want.pids < 0, "pids"));
      have->pids = want.pids;
    }
    if (want.cpu_quota != have->cpu_quota) {
      have->cpu_quota = GroupLimits::kUnknown;
      DSEC_RETURN_IF_ERROR(Write(rel, "cpu.max", Value(want.cpu_quota) + " 100000", want.cpu_quota < 0, "cpu"));
      have->cpu_quota = want.cpu_quota;
    }
    return Status::Ok();
  }

  bool CanFreeze() const override {
    struct stat st;
    // The root has no cgroup.freeze; a child of it does (kernel 5.2+).
    return ::stat((root_ + "/cgroup.procs").c_str(), &st) == 0 && FreezeSupported();
  }

  Status Freeze(const std::string& rel, bool frozen) override {
    std::string file = Dir(rel) + "/cgroup.freeze";
    UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return Status::FromErrno(errno, "cgroup " + rel + ": open cgroup.freeze");
    if (::write(fd.get(), frozen ? "1" : "0", 1) < 0)
      return Status::FromErrno(errno, "cgroup " + rel + ": write cgroup.freeze");
    if (!frozen) return Status::Ok();
    // Settles asynchronously: cgroup.events says "frozen 1" once every task is.
    for (int i = 0; i < 5000; ++i) {
      if (Keyed(Dir(rel) + "/cgroup.events", "frozen") == 1) return Status::Ok();
      ::usleep(1000);
    }
    (void)::pwrite(fd.get(), "0", 1, 0);
    return Status::Unavailable("cgroup " + rel + ": did not freeze within 5 s (left running)");
  }

  bool Frozen(const std::string& rel) const override {
    auto v = ReadFileToString(Dir(rel) + "/cgroup.freeze");
    return v.ok() && !v->empty() && (*v)[0] == '1';
  }

  uint64_t CpuUsageNs(const std::string& rel) const override { return Keyed(Dir(rel) + "/cpu.stat", "usage_usec") * 1000; }
  uint64_t OomKills(const std::string& rel) const override { return Keyed(Dir(rel) + "/memory.events", "oom_kill"); }
  MemoryUse Memory(const std::string& rel) const override {
    auto current = ReadFileToString(Dir(rel) + "/memory.current");
    std::string stat = Dir(rel) + "/memory.stat";
    return {current.ok() ? std::strtoull(current->c_str(), nullptr, 10) : 0, Keyed(stat, "file"),
            Keyed(stat, "inactive_file")};
  }
  Status ReclaimMemory(const std::string& rel) override {
    // memory.reclaim (kernel 5.19+) takes an amount: all the group holds.
    auto current = ReadFileToString(Dir(rel) + "/memory.current");
    if (!current.ok()) return current.status().Annotate("cgroup " + rel);
    std::string file = Dir(rel) + "/memory.reclaim";
    UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return Status::FromErrno(errno, "cgroup " + rel + ": open memory.reclaim (kernel 5.19+)");
    std::string amount = std::to_string(std::strtoull(current->c_str(), nullptr, 10));
    // EAGAIN: less than asked could be reclaimed, which is expected.
    if (::write(fd.get(), amount.data(), amount.size()) < 0 && errno != EAGAIN)
      return Status::FromErrno(errno, "cgroup " + rel + ": write memory.reclaim");
    return Status::Ok();
  }

  bool Empty(const std::string& rel) override {
    if (Pids(rel).empty()) return true;
    UniqueFd kill(::open((Dir(rel) + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC));
    if (kill) {
      (void)!::write(kill.get(), "1", 1);  // the whole subtree, frozen or not (5.14+)
    } else {
      bool froze = CanFreeze() && Freeze(rel, true).ok();
      for (pid_t p : Pids(rel)) ::kill(p, SIGKILL);
      if (froze) (void)Freeze(rel, false);  // killed tasks go whether thawed or not; Pids says
    }
    WaitForKilled([&] { return Pids(rel).empty(); }, SteadyClockMs());
    if (Frozen(rel)) (void)Freeze(rel, false);  // the answer is whether tasks are left, below
    return Pids(rel).empty();
  }

  bool CanRename() const override { return false; }
  Status Rename(const std::string& rel, const std::string& to) override {
    return Status::Unimplemented("cgroup v2 cannot rename a group (" + Dir(rel) + " to " + to +
                                 "); make a new one instead");
  }

  void KillAndRemove(const std::string& rel) override {
    if (!Exists(rel)) return;
    for (const auto& sub : List(rel)) KillAndRemove(rel + "/" + sub);
    (void)Empty(rel);  // what it cannot empty keeps the group: rmdir fails and the next sweep tries again
    ::rmdir(Dir(rel).c_str());
  }

  void RemoveDirs(const std::string& rel) override { ::rmdir(Dir(rel).c_str()); }

  Result<std::unique_ptr<RunSlot>> MakeRunSlot(const std::string& rel) override;

  int SweepStaleSpawners(const std::string& parent) override {
    int removed = 0;
    for (const auto& name : List(parent)) {
      if (name.compare(0, 2, "sp") != 0) continue;
      pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + 2));
      if (pid <= 0 || ::kill(pid, 0) == 0 || errno == EPERM) continue;  // its spawner is alive
      KillAndRemove(parent + "/" + name);
      ++removed;
    }
    return removed;
  }

  std::string Dir(const std::string& rel) const { return root_ + "/" + rel; }

  // Says that <rel>/<file> is missing because its controller is not there.
  Status MissingController(const std::string& rel, const char* file, const char* controller) const {
    return Status::FailedPrecondition("cgroup v2 group " + rel + " has no " + file + ": the " + controller +
                                      " controller is not available in " + root_ +
                                      " (cgroup.controllers lists what is; a v1 hierarchy may hold it)");
  }

 private:

  static std::string Value(int64_t v) { return v < 0 ? "max" : std::to_string(v); }

  // Writes <rel>/<file>. A file that is not there means its controller is
  // not enabled for the group: fine when `unlimited` (the kernel's default
  // is no limit), else said, naming the controller.
  Status Write(const std::string& rel, const char* file, const std::string& v, bool unlimited, const char* controller) {
    UniqueFd fd(::open((Dir(rel) + "/" + file).c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd && errno == ENOENT) return unlimited ? Status::Ok() : MissingController(rel, file, controller);
    if (!fd) return Status::FromErrno(errno, "cgroup " + rel + ": open " + file);
    if (::write(fd.get(), v.data(), v.size()) < 0) return Status::FromErrno(errno, "cgroup " + rel + ": write " + file + "=" + v);
    return Status::Ok();
  }

  // Lets the children of `dir` have the memory, pids and cpu controllers
  // that `dir` has (best effort: what cannot be enabled shows up as a
  // missing file when a limit is written).
  static void EnableControllers(const std::string& dir) {
    auto have = ReadFileToString(dir + "/cgroup.controllers");
    auto on = ReadFileToString(dir + "/cgroup.subtree_control");
    if (!have.ok()) return;
    for (const char* c : {"memory", "pids", "cpu"}) {
      if (!Contains(*have, c) || (on.ok() && Contains(*on, c))) continue;
      UniqueFd fd(::open((dir + "/cgroup.subtree_control").c_str(), O_WRONLY | O_CLOEXEC));
      std::string v = std::string("+") + c;
      if (fd) (void)!::write(fd.get(), v.data(), v.size());
    }
  }

  bool FreezeSupported() const {
    // Any non-root group has cgroup.freeze on kernels that can freeze.
    for (const auto& sub : ListSubdirs(root_)) {
      struct stat st;
      return ::stat((root_ + "/" + sub + "/cgroup.freeze").c_str(), &st) == 0;
    }
    return true;  // no group to look at yet: assume a kernel of this decade
  }

  std::string root_;
};

std::string ReadFd(int fd) {
  char buf[1024];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// A run group in the unified hierarchy: one directory holds every
// controller, so a run joins one cgroup.procs and there is no separate cpu
// group. CPU usage (cpu.stat) cannot be reset: it is counted from a
// baseline. The peak (memory.peak) is reset by writing to the descriptor
// that reads it (Linux 6.12+); before that the group serves one run.
class RunSlotV2 final : public RunSlot {
 public:
  static Result<std::unique_ptr<RunSlot>> Create(GroupsV2* groups, const std::string& rel) {
    DSEC_RETURN_IF_ERROR(groups->Make(rel));
    auto s = std::unique_ptr<RunSlotV2>(new RunSlotV2(groups, rel));
    Status st = s->Open();
    if (!st.ok()) {
      groups->KillAndRemove(rel);
      return st;
    }
    return std::unique_ptr<RunSlot>(std::move(s));
  }

  std::vector<int> JoinFds() const override { return {procs_.get()}; }
  std::vector<int> CpuJoinFds() const override { return {}; }

  Status SetMemoryLimit(uint64_t bytes) override {
    if (bytes == cur_mem_) return Status::Ok();
    cur_mem_ = UINT64_MAX - 1;  // unknown until both are written
    std::string v = std::to_string(bytes);
    DSEC_RETURN_IF_ERROR(Write(mem_max_.get(), v, "memory.max"));
    // No swap beyond the memory limit (v1: memory+swap = memory).
    if (swap_max_) DSEC_RETURN_IF_ERROR(Write(swap_max_.get(), "0", "memory.swap.max"));
    cur_mem_ = bytes;
    return Status::Ok();
  }
  Status SetPidsMax(uint32_t n) override {
    if (static_cast<int64_t>(n) == cur_pids_) return Status::Ok();
    DSEC_RETURN_IF_ERROR(Write(pids_max_.get(), n ? std::to_string(n) : std::string("max"), "pids.max"));
    cur_pids_ = n;
    return Status::Ok();
  }
  Status SetCpuQuota(uint32_t millis) override {
    int64_t quota = millis == 0 ? -1 : static_cast<int64_t>(millis) * 100;  // period 100 ms
    if (quota == cur_quota_) return Status::Ok();
    DSEC_RETURN_IF_ERROR(Write(cpu_max_.get(), (quota < 0 ? std::string("max") : std::to_string(quota)) + " 100000", "cpu.max"));
    cur_quota_ = quota;
    return Status::Ok();
  }
  void ResetCounters(bool) override {
    if (peak_resettable_) (void)!::pwrite(mem_peak_.get(), "reset", 5, 0);
    cpu0_ns_ = UsageNs();
  }
  uint64_t CpuUsageNs() override {
    uint64_t now = UsageNs();
    return now > cpu0_ns_ ? now - cpu0_ns_ : 0;
  }
  uint64_t PeakBytes() override { return mem_peak_ ? std::strtoull(ReadFd(mem_peak_.get()).c_str(), nullptr, 10) : 0; }
  uint64_t OomKills() override { return KeyedText(ReadFd(mem_events_.get()), "oom_kill"); }
  // Without memory.peak at all (before Linux 5.19) there is no peak to
  // keep apart, so the group is reused like a resettable one.
  bool Reusable() const override { return peak_resettable_ || !mem_peak_; }
  void Remove() override {
    for (auto* f : {&procs_, &mem_max_, &swap_max_, &mem_peak_, &mem_events_, &pids_max_, &cpu_max_, &cpu_stat_})
      f->Reset();
    groups_->KillAndRemove(rel_);
  }

 private:
  RunSlotV2(GroupsV2* groups, std::string rel) : groups_(groups), rel_(std::move(rel)), dir_(groups->Dir(rel_)) {}

  UniqueFd OpenFile(const char* file, int flags) const {
    return UniqueFd(::open((dir_ + "/" + file).c_str(), flags | O_CLOEXEC));
  }

  Status Open() {
    struct File {
      UniqueFd* fd;
      const char* name;
      int flags;
      const char* controller;
    };
    for (const File& f : {File{&procs_, "cgroup.procs", O_WRONLY, nullptr}, File{&mem_max_, "memory.max", O_WRONLY, "memory"},
                          File{&mem_events_, "memory.events", O_RDONLY, "memory"},
                          File{&pids_max_, "pids.max", O_WRONLY, "pids"}, File{&cpu_max_, "cpu.max", O_WRONLY, "cpu"},
                          File{&cpu_stat_, "cpu.stat", O_RDONLY, nullptr}}) {
      *f.fd = OpenFile(f.name, f.flags);
      if (*f.fd) continue;
      if (errno == ENOENT && f.controller) return groups_->MissingController(rel_, f.name, f.controller);
      return Status::FromErrno(errno, "cgroup " + rel_ + ": open " + f.name);
    }
    swap_max_ = OpenFile("memory.swap.max", O_WRONLY);  // absent without swap accounting
    // Writable (resettable) from Linux 6.12; read-only before (5.19+).
    mem_peak_ = OpenFile("memory.peak", O_RDWR);
    peak_resettable_ = static_cast<bool>(mem_peak_);
    if (!mem_peak_) mem_peak_ = OpenFile("memory.peak", O_RDONLY);
    return Status::Ok();
  }

  Status Write(int fd, const std::string& v, const char* what) {
    if (::pwrite(fd, v.data(), v.size(), 0) < 0) return Status::FromErrno(errno, "cgroup " + rel_ + ": write " + what + "=" + v);
    return Status::Ok();
  }

  uint64_t UsageNs() { return KeyedText(ReadFd(cpu_stat_.get()), "usage_usec") * 1000; }

  GroupsV2* groups_;  // outlives its slots (the spawner's)
  std::string rel_, dir_;
  UniqueFd procs_, mem_max_, swap_max_, mem_peak_, mem_events_, pids_max_, cpu_max_, cpu_stat_;
  bool peak_resettable_ = false;
  uint64_t cpu0_ns_ = 0;
  uint64_t cur_mem_ = UINT64_MAX;  // a new group is unlimited
  int64_t cur_pids_ = -2, cur_quota_ = -2;
};

Result<std::unique_ptr<RunSlot>> GroupsV2::MakeRunSlot(const std::string& rel) { return RunSlotV2::Create(this, rel); }

}  // namespace

std::unique_ptr<Groups> Groups::V2(const std::string& root) { return std::make_unique<GroupsV2>(root); }

}  // namespace dsec::cgroup
