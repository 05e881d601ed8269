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

// The value after `key ` in a flat keyed file (cgroup.events, cpu.stat,
// memory.events); 0 when absent.
uint64_t Keyed(const std::string& file, const std::string& key) {
  std::ifstream in(file);
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

  Status Make(const std::string& rel) override {
    std::string path = root_;
    std::stringstream ss(rel);
    std::string part;
    while (std::getline(ss, part, '/')) {
      if (part.empty()) continue;
      EnableControllers(path);
      path += "/" + part;
      if (::mkdir(path.c_str(), 0755) < 0 && errno != EEXIST) return Status::FromErrno(errno, "cgroup mkdir " + path);
    }
    return Status::Ok();
  }

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

  bool Empty(const std::string& rel) override {
    if (Pids(rel).empty()) return true;
    UniqueFd kill(::open((Dir(rel) + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC));
    if (kill) {
      (void)!::write(kill.get(), "1", 1);  // the whole subtree, frozen or not (5.14+)
    } else {
      bool froze = CanFreeze() && Freeze(rel, true).ok();
      for (pid_t p : Pids(rel)) ::kill(p, SIGKILL);
      if (froze) (void)Freeze(rel, false);
    }
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (Pids(rel).empty()) break;
      ::usleep(5000);  // killed processes leave the group asynchronously
    }
    if (Frozen(rel)) (void)Freeze(rel, false);
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
    (void)Empty(rel);
    ::rmdir(Dir(rel).c_str());
  }

  void RemoveDirs(const std::string& rel) override { ::rmdir(Dir(rel).c_str()); }

 private:
  std::string Dir(const std::string& rel) const { return root_ + "/" + rel; }

  static std::string Value(int64_t v) { return v < 0 ? "max" : std::to_string(v); }

  // Writes <rel>/<file>. A file that is not there means its controller is
  // not enabled for the group: fine when `unlimited` (the kernel's default
  // is no limit), else said, naming the controller.
  Status Write(const std::string& rel, const char* file, const std::string& v, bool unlimited, const char* controller) {
    UniqueFd fd(::open((Dir(rel) + "/" + file).c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd && errno == ENOENT) {
      if (unlimited) return Status::Ok();
      return Status::FailedPrecondition("cgroup v2 group " + rel + " has no " + file + ": the " + controller +
                                        " controller is not available in " + root_ +
                                        " (cgroup.controllers lists what is; a v1 hierarchy may hold it)");
    }
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

}  // namespace

std::unique_ptr<Groups> Groups::V2(const std::string& root) { return std::make_unique<GroupsV2>(root); }

}  // namespace dsec::cgroup
