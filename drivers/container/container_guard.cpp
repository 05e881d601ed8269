// A container's task guard (spec.task, drivers/guard): the mounts made at
// its creation, and what it changed of its image, read after a step.
#include <sys/stat.h>

#include <cerrno>
#include <chrono>

#include "drivers/container/container_box.hpp"
#include "drivers/guard/carry.hpp"
#include "drivers/images/image_store.hpp"
#include "drivers/images/mounts.hpp"
#include "drivers/guard/mask_layer.hpp"
#include "drivers/guard/task_guard.hpp"
#include "drivers/guard/task_paths.hpp"

namespace dsec::drivers {

Result<ContainerDriver::Guarded> ContainerDriver::GuardMounts(const std::string& id, const std::string& base,
                                                            const std::string& image_root,
                                                            const v1::TaskGuard& task) const {
  Guarded out;
  auto g = guard::ParseGuard(task);
  if (!g.ok()) return g.status();
  if (!g->active()) return out;
  auto t0 = std::chrono::steady_clock::now();
  std::string root_rel = g->root.empty() ? "" : g->root.substr(1);
  std::string task_root = image_root + g->root;
  struct stat st;
  // No symlink on the way to the root: the walk must stay in the image.
  for (size_t at = g->root.find('/', 1); ; at = g->root.find('/', at + 1)) {
    std::string part = image_root + g->root.substr(0, at);
    if (::lstat(part.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      return Status::InvalidArgument("task: root " + g->root + " goes through a symlink of the image (" +
                                     g->root.substr(0, at) + "); give the real directory");
    if (at == std::string::npos) break;
  }
  if ((::stat(task_root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) &&
      ::stat((skeleton_ + g->root).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    // A directory dsec makes in every container (/work) and the image
    // lacks: nothing of the image to guard there; new files are flagged.
    Log(1, "container " + id + ": task guard under " + g->root + ": the image has nothing there");
    return out;
  }
  auto in_image = [&](const std::string& p) { return root_rel.empty() ? p : root_rel + "/" + p; };
  if (!g->hide.empty()) {
    auto hidden = guard::FindTaskPaths(task_root, g->hide, guard::kMaxGuardedPaths);
    if (!hidden.ok()) return hidden.status().Annotate("task: hidden paths");
    out.mask = base + "/mask";
    if (::mkdir(out.mask.c_str(), 0755) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + out.mask);
    std::vector<std::string> paths;
    for (const auto& p : hidden->paths) paths.push_back(in_image(p));
    DSEC_RETURN_IF_ERROR(guard::MakeMaskLayer(out.mask, image_root, paths));
    out.hidden = hidden->paths.size();
  }
  if (!g->protect.empty()) {
    auto kept = guard::FindTaskPaths(task_root, g->protect, guard::kMaxGuardedPaths);
    if (!kept.ok()) return kept.status().Annotate("task: protected paths");
    std::vector<std::string> hidden_paths;
    if (!g->hide.empty()) {
      auto h = guard::FindTaskPaths(task_root, g->hide, guard::kMaxGuardedPaths);
      if (h.ok()) hidden_paths = h->paths;
    }
    for (const auto& p : kept->paths) {
      // Under a hidden path: not there to bind.
      bool hidden = false;
      for (const auto& h : hidden_paths) hidden = hidden || p == h || p.rfind(h + "/", 0) == 0;
      if (hidden) continue;
      // A symlink is not bound: mount(2) would follow it (to wherever it
      // points, before the init enters the root). Changing it is flagged.
      struct stat ls;
      if (::lstat((task_root + "/" + p).c_str(), &ls) == 0 && S_ISLNK(ls.st_mode)) continue;
      out.read_only.push_back("/" + in_image(p));
    }
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  Log(1, "container " + id + ": task guard under " + (g->root.empty() ? std::string("/") : g->root) + ": " +
             std::to_string(out.read_only.size()) + " protected and " + std::to_string(out.hidden) +
             " hidden path(s) of the image, found in " + std::to_string(ms) + " ms");
  return out;
}

}  // namespace dsec::drivers

namespace dsec::drivers {

Result<std::string> ContainerDriver::CarryLayers(const std::string& id, const std::string& base,
                                                 const std::string& image_root, const std::string& digest,
                                                 const v1::CarriedChanges& carry) {
  auto t0 = std::chrono::steady_clock::now();
  const std::string& from = carry.sandbox_id();
  auto agent = Find(from);
  if (!agent) return Status::FailedPrecondition("the sandbox to grade (" + from + ") is not a container on this node");
  if (agent->digest != digest)
    return Status::FailedPrecondition("the image of the sandbox to grade (" + from + ", " + agent->digest +
                                      ") was replaced under its name since (now " + digest +
                                      "): grade before rebuilding a task's image, or open a new session");
  auto g = guard::ParseGuard(carry.task());
  if (!g.ok()) return g.status();
  guard::CarryOptions opts;
  opts.root = g->root.empty() ? "" : g->root.substr(1);
  opts.image_wins = g->protect;
  opts.image_wins.insert(opts.image_wins.end(), g->hide.begin(), g->hide.end());
  std::string prefix;
  if (!carry.grader_image().empty()) {
    // First, while nothing is frozen: the grader's files, from its image.
    auto image = opts_.images->Get(carry.grader_image());
    if (!image.ok()) return image.status().Annotate("grader image");
    auto file = opts_.images->Open(*image);
    if (!file.ok()) return file.status().Annotate("grader image " + carry.grader_image());
    image->set_file(*file);
    auto mounted = mounts_->Acquire(*image);
    if (!mounted.ok()) return mounted.status().Annotate("grader image " + carry.grader_image());
    auto copied = guard::CopyLayer(*mounted, base + "/grader");
    mounts_->Release(image->digest());
    if (!copied.ok()) return copied.status().Annotate("grader image " + carry.grader_image());
    prefix = base + "/grader:";
  }
  // The agent stands still while its changes are read (frozen unless it
  // is already), so the copy is one moment of its tree. Calls to it wait
  // meanwhile (the lock is not held: they queue on the frozen agent).
  if (agent->limits.disk_bytes()) opts.max_bytes = agent->limits.disk_bytes();
  bool froze = false;
  {
    std::lock_guard<std::mutex> lk(agent->idle_mu);
    if (!agent->groups)
      return Status::FailedPrecondition("the sandbox to grade (" + from + ") has no cgroup here to freeze while "
                                        "its changes are copied");
    if (!agent->user_paused && !agent->idle_frozen) {
      Status frozen = agent->groups->Freeze(agent->cgroup_rel, true);
      if (!frozen.ok())
        return Status::Unavailable("the sandbox to grade (" + from + ") could not be frozen while its changes are "
                                   "copied (" + frozen.message() + "); grade again");
      froze = true;
    }
    agent->carrying = true;
  }
  auto carried = guard::CarryChanges(SandboxDir(opts_.data_dir, from) + "/upper", image_root, base + "/changes", opts);
  {
    std::lock_guard<std::mutex> lk(agent->idle_mu);
    agent->carrying = false;
    if (froze && !agent->user_paused) (void)agent->groups->Freeze(agent->cgroup_rel, false);
  }
  if (!carried.ok()) return carried.status().Annotate("carrying the changes of " + from);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  Log(1, "container " + id + ": carries " + std::to_string(carried->entries) + " changed entries (" +
             std::to_string(carried->bytes) + " bytes, " + std::to_string(carried->reflinked) + " reflinked) of " +
             from + "; " + std::to_string(carried->skipped) + " under protected or hidden paths left to the image, " +
             std::to_string(carried->restored) + " put back; " + std::to_string(ms) + " ms");
  return prefix + base + "/changes:";
}

}  // namespace dsec::drivers

namespace dsec::drivers {

std::map<std::string, uint64_t> ContainerDriver::DeniedCalls(const v1::SandboxRecord& sb) const {
  auto box = Find(sb.id());
  if (!box) return {};
  std::lock_guard<std::mutex> lk(box->denied_mu);
  return box->denied;
}

}  // namespace dsec::drivers
