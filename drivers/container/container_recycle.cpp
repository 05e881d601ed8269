// Recycling what a removed container leaves for the next one: its cgroup
// (renamed, with the limits it holds) and its sandbox dir (emptied, renamed
// free.<n>), up to kMaxFreeGroups each; what cannot be recycled is removed.
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "drivers/container/container_driver.hpp"
#include "runtime/files.hpp"

namespace dsec::drivers {

namespace {

// rm -rf: never follows symlinks, never leaves the filesystem (a container's
// upper dir holds whatever it wrote, links to host paths included). The
// overlay of a container whose last process just died may still be mounted
// for a moment (its mount namespace goes away asynchronously): retried for
// up to 2 s. Ok, or what stopped it (the start-up sweep retries).
Status RemoveTreeRetrying(const std::string& path) {
  Status s;
  for (int attempt = 0; attempt < 100; ++attempt) {
    s = dsec::RemoveTree(path);
    if (s.ok()) return s;
    ::usleep(20000);  // waiting for the kernel to drop the dead container's mounts
  }
  return s;
}

}  // namespace

Result<cgroup::GroupLimits> ContainerDriver::TakeGroup(const std::string& rel) {
  FreeGroup free;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_groups_.empty()) {
      free = std::move(free_groups_.back());
      free_groups_.pop_back();
    }
  }
  if (!free.rel.empty()) {
    Status st = groups_->Rename(free.rel, rel);
    if (st.ok()) return free.limits;
    Log(2, "recycled " + st.message() + "; making a new group instead");
    groups_->KillAndRemove(free.rel);
  }
  DSEC_RETURN_IF_ERROR(groups_->Make(rel));
  return cgroup::GroupLimits::Fresh();
}

namespace {

// Empties a stopped container's dir for the next container: true when it
// holds again only what a new one does. Anything unexpected: false (the
// caller removes it).
bool EmptySandboxDir(const std::string& base) {
  if (ListEntries(base) != std::vector<std::string>{"run", "upper", "work"}) return false;
  std::string upper = base + "/upper", work = base + "/work";
  if (!RemoveTreeRetrying(upper).ok() || ::mkdir(upper.c_str(), 0755) < 0 || ::chmod(upper.c_str(), 0755) < 0) return false;
  if (!RemoveTreeRetrying(work).ok() || ::mkdir(work.c_str(), 0700) < 0) return false;
  if (::unlink((base + "/run/agent.sock").c_str()) < 0 && errno != ENOENT) return false;
  // The container's /etc files are written anew by the next creation; the
  // container may have replaced them with anything (a directory, a link).
  if (!RemoveTreeRetrying(base + "/run/etc").ok()) return false;
  struct stat st;
  return ListEntries(base + "/run") == std::vector<std::string>{"agent"} &&
         ::lstat((base + "/run/agent").c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0;
}

}  // namespace

Status ContainerDriver::TakeDir(const std::string& id) {
  std::string base = SandboxDir(opts_.data_dir, id), free;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_dirs_.empty()) {
      free = opts_.data_dir + "/sandboxes/" + free_dirs_.back();
      free_dirs_.pop_back();
    }
  }
  if (!free.empty()) {
    if (::rename(free.c_str(), base.c_str()) == 0) return Status::Ok();
    Log(2, "rename " + free + " to " + base + ": " + std::strerror(errno) + "; making a new dir instead");
    if (Status s = RemoveTreeRetrying(free); !s.ok()) Log(2, "removing " + free + ": " + s.message());
  }
  if (disk_) DSEC_RETURN_IF_ERROR(disk_->MakeDir(id));
  for (const char* sub : {"", "/upper", "/work", "/run"}) DSEC_RETURN_IF_ERROR(MakeDirs(base + sub, 0700));
  ::chmod((base + "/upper").c_str(), 0755);
  // The mount point of the agent binary (no content, nothing to sync).
  if (UniqueFd f(::open((base + "/run/agent").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0755)); !f)
    return Status::FromErrno(errno, "create " + base + "/run/agent");
  return Status::Ok();
}

void ContainerDriver::ReleaseDir(const std::string& id, bool stopped) {
  std::string base = SandboxDir(opts_.data_dir, id), name;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped && free_dirs_.size() < kMaxFreeGroups) name = "free." + std::to_string(next_free_dir_++);
  }
  std::string to = opts_.data_dir + "/sandboxes/" + name;
  if (!name.empty() && EmptySandboxDir(base) && ::rename(base.c_str(), to.c_str()) == 0) {
    std::lock_guard<std::mutex> lk(mu_);
    free_dirs_.push_back(name);
    return;
  }
  if (Status rm = RemoveSandboxDir(id); !rm.ok())
    Log(2, "container " + id + ": " + rm.message() + "; the next start of dsecd removes it");
}

Status ContainerDriver::RemoveSandboxDir(const std::string& name) {
  std::string path = opts_.data_dir + "/sandboxes/" + name;
  struct stat st;
  if (::lstat(path.c_str(), &st) < 0 && errno == ENOENT) return Status::Ok();
  // A subvolume goes whole, in one call, however much it holds; a dir
  // that is not one (made before the disk was) the slow way.
  if (disk_ && disk_->RemoveDir(name).ok()) return Status::Ok();
  return RemoveTreeRetrying(path);
}

}  // namespace dsec::drivers
