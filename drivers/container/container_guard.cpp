// A container's task guard (spec.task, drivers/guard): the mounts made at
// its creation, and what it changed of its image, read after a step.
#include <sys/stat.h>

#include <cerrno>
#include <future>
#include <chrono>

#include "drivers/container/container_box.hpp"
#include "drivers/guard/carry.hpp"
#include "drivers/images/image_store.hpp"
#include "drivers/images/mounts.hpp"
#include "drivers/guard/mask_layer.hpp"
#include "drivers/guard/read_watch.hpp"
#include "drivers/guard/task_guard.hpp"
#include "drivers/guard/task_paths.hpp"
#include "drivers/spawner/spawner.pb.h"

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
  auto find = [&](const std::vector<guard::PathGlob>& globs) { return TaskPathsOf(image_root, g->root, globs); };
  if (!g->hide.empty()) {
    auto hidden = find(g->hide);
    if (!hidden.ok()) return hidden.status().Annotate("task: hidden paths");
    out.mask = base + "/mask";
    if (::mkdir(out.mask.c_str(), 0755) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + out.mask);
    std::vector<std::string> paths;
    for (const auto& p : hidden->paths) paths.push_back(in_image(p));
    DSEC_RETURN_IF_ERROR(guard::MakeMaskLayer(out.mask, image_root, paths));
    out.hidden = hidden->paths.size();
  }
  if (!g->protect.empty()) {
    auto kept = find(g->protect);
    if (!kept.ok()) return kept.status().Annotate("task: protected paths");
    std::vector<std::string> hidden_paths;
    if (!g->hide.empty()) {
      auto h = find(g->hide);
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

Result<guard::TaskPaths> ContainerDriver::TaskPathsOf(const std::string& image_root, const std::string& root,
                                                     const std::vector<guard::PathGlob>& globs) const {
  // An image's files do not change under its mount (EROFS, named by its
  // digest's mount point): one walk per image, root and globs.
  std::string key = image_root + "\n" + root;
  for (const auto& g : globs) key += "\n" + g.text();
  {
    std::lock_guard<std::mutex> lk(paths_mu_);
    auto it = task_paths_.find(key);
    if (it != task_paths_.end()) return it->second;
  }
  auto found = guard::FindTaskPaths(image_root + root, globs, guard::kMaxGuardedPaths);
  if (!found.ok()) return found.status();
  std::lock_guard<std::mutex> lk(paths_mu_);
  if (task_paths_.size() >= kMaxTaskPaths) task_paths_.clear();
  task_paths_.emplace(key, *found);
  return found;
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
  // Found before the agent is frozen (and once per image and task).
  std::vector<std::string> kept;
  if (!opts.image_wins.empty()) {
    struct stat st;
    if (::stat((image_root + g->root).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      for (const auto* globs : {&g->protect, &g->hide}) {
        if (globs->empty()) continue;
        auto found = TaskPathsOf(image_root, g->root, *globs);
        if (!found.ok()) return found.status().Annotate("the image's protected and hidden paths");
        kept.insert(kept.end(), found->paths.begin(), found->paths.end());
      }
    }
    opts.image_kept = &kept;
  }
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
  if (agent->limits.disk_bytes()) opts.max_bytes = agent->limits.disk_bytes();
  auto carried = CopyFrozen(agent, "its changes are copied for a grade", [&] {
    return guard::CarryChanges(SandboxDir(opts_.data_dir, from) + "/upper", image_root, base + "/changes", opts);
  });
  if (!carried.ok()) return carried.status().Annotate("carrying the changes of " + from);
  // A sandbox made from a snapshot changed its image in the snapshot's
  // layers too: each is carried the same way (read-only already, so
  // without a freeze), and stacked in the same order under its upper's.
  std::string below;
  for (size_t i = 0; i < agent->layers.size(); ++i) {
    std::string dest = base + "/changes" + std::to_string(i + 1);
    auto layer = guard::CarryChanges(agent->layers[i], image_root, dest, opts);
    if (!layer.ok()) return layer.status().Annotate("carrying the snapshot layer " + agent->layers[i] + " of " + from);
    carried->entries += layer->entries;
    carried->bytes += layer->bytes;
    carried->skipped += layer->skipped;
    carried->restored += layer->restored;
    carried->reflinked += layer->reflinked;
    below += dest + ":";
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  Log(1, "container " + id + ": carries " + std::to_string(carried->entries) + " changed entries (" +
             std::to_string(carried->bytes) + " bytes, " + std::to_string(carried->reflinked) + " reflinked) of " +
             from + "; " + std::to_string(carried->skipped) + " under protected or hidden paths left to the image, " +
             std::to_string(carried->restored) + " put back; " + std::to_string(ms) + " ms");
  return prefix + base + "/changes:" + below;
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

namespace dsec::drivers {

void ContainerDriver::WatchReads(const Box& box, const v1::ImageManifest& image) const {
  if (image.watched().empty() || !reads_) return;
  std::vector<std::string> paths;
  for (const auto& w : image.watched()) paths.push_back("/" + w);
  auto marked = reads_->Watch(box.id, box.init_pid, paths);
  if (!marked.ok()) Log(2, "container " + box.id + ": its reads of watched files are not flagged: " +
                           marked.status().message());
  else Log(0, "container " + box.id + ": " + std::to_string(*marked) + " of its image's " +
              std::to_string(paths.size()) + " watched file(s) marked");
}

std::map<std::string, uint64_t> ContainerDriver::RefusedWrites(const v1::SandboxRecord& sb) const {
  auto box = Find(sb.id());
  if (!box) return {};
  std::lock_guard<std::mutex> lk(box->denied_mu);
  return box->writes;
}

void ContainerDriver::SyncCounts(const v1::SandboxRecord& sb) const {
  if (!Find(sb.id())) return;
  spawner::Request req;
  std::future<void> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t id = next_flush_++;
    req.mutable_flush()->set_id(id);
    done = flushing_[id].get_future();
  }
  req.mutable_flush()->set_sandbox_id(sb.id());
  // The session actor waits: briefly. A spawner busy past that (a creation
  // in its lane): the counts come with a later step.
  if (link_->Send(req).ok() && done.wait_for(std::chrono::milliseconds(100)) == std::future_status::ready) return;
  std::lock_guard<std::mutex> lk(mu_);
  flushing_.erase(req.flush().id());
}

void ContainerDriver::AdoptListener(const Box& box) const {
  if (box.init_pid <= 0) return;
  spawner::Request req;
  req.mutable_adopt_listener()->set_sandbox_id(box.id);
  req.mutable_adopt_listener()->set_pid(static_cast<uint32_t>(box.init_pid));
  req.mutable_adopt_listener()->set_cgroup(box.cgroup_rel);
  if (Status st = link_->Send(req); !st.ok())
    Log(2, "container " + box.id + ": its seccomp listener is not taken back: " + st.message());
}

std::map<std::string, uint64_t> ContainerDriver::WatchedReads(const v1::SandboxRecord& sb) const {
  return reads_ ? reads_->Reads(sb.id()) : std::map<std::string, uint64_t>{};
}

}  // namespace dsec::drivers
