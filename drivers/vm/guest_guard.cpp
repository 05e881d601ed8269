// A VM guest's task guard (spec.task, drivers/guard): the paths its globs
// name are found in the image on the host (mounted for the walk, once per
// image, root and globs) and go to the guest on its kernel command line
// (dsec.guard=1, dsec.hide=, dsec.ro=): its init makes the hidden ones
// whiteouts of a layer above the image and binds the protected ones
// read-only, and its agent runs programs with only the capabilities a
// container keeps (tools/guest/init). What the guest changed is read by its
// agent from the overlay's upper layer (the Changes request).
#include <sys/stat.h>

#include "drivers/guard/task_guard.hpp"
#include "drivers/guard/task_paths.hpp"
#include "drivers/images/mounts.hpp"
#include "drivers/vm/guest_driver.hpp"

namespace dsec::drivers {

namespace {

// The kernel takes 2048 bytes of command line on x86; the rest of ours is
// about 350.
constexpr size_t kMaxGuardCmdline = 1400;

bool PlainPath(const std::string& p) {
  for (char c : p)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '.' || c == '_' || c == '-' || c == '+' ||
          c == '@' || c == '~'))
      return false;
  return !p.empty();
}

}  // namespace

Result<std::string> GuestDriver::GuardCmdline(const v1::SandboxSpec& spec, const v1::ImageManifest& image) {
  auto g = guard::ParseGuard(spec.task());
  if (!g.ok()) return g.status();
  if (!g->active()) return std::string();
  std::string key = image.digest() + "\n" + spec.task().SerializeAsString();
  {
    std::lock_guard<std::mutex> lk(guard_mu_);
    if (auto it = guard_cmdlines_.find(key); it != guard_cmdlines_.end()) return it->second;
  }
  if (!guard_mounts_) return Status::FailedPrecondition("guarding a task's paths needs the image mounted on the host");
  auto mounted = guard_mounts_->Acquire(image);
  if (!mounted.ok()) return mounted.status().Annotate("task: mount the image to find its paths");
  std::string root_rel = g->root.empty() ? "" : g->root.substr(1);
  std::string task_root = *mounted + g->root;
  auto in_image = [&](const std::string& p) { return "/" + (root_rel.empty() ? p : root_rel + "/" + p); };
  std::vector<std::string> hide, ro;
  Status found = Status::Ok();
  struct stat st;
  if (::stat(task_root.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    if (!g->hide.empty()) {
      auto h = guard::FindTaskPaths(task_root, g->hide, guard::kMaxGuardedPaths);
      if (h.ok()) for (const auto& p : h->paths) hide.push_back(in_image(p));
      else found = h.status().Annotate("task: hidden paths");
    }
    if (found.ok() && !g->protect.empty()) {
      auto k = guard::FindTaskPaths(task_root, g->protect, guard::kMaxGuardedPaths);
      if (!k.ok()) found = k.status().Annotate("task: protected paths");
      for (const auto& p : k.ok() ? k->paths : std::vector<std::string>{}) {
        std::string abs = in_image(p);
        bool hidden = false;
        for (const auto& h : hide) hidden = hidden || abs == h || abs.rfind(h + "/", 0) == 0;
        // Not under a hidden path (not there to bind), not a symlink (a bind
        // would follow it): changing those is flagged.
        if (!hidden && ::lstat((*mounted + abs).c_str(), &st) == 0 && !S_ISLNK(st.st_mode)) ro.push_back(abs);
      }
    }
  }
  guard_mounts_->Release(image.digest());
  if (!found.ok()) return found;
  std::string out = " dsec.guard=1";
  for (auto* list : {&hide, &ro}) {
    if (list->empty()) continue;
    out += list == &hide ? " dsec.hide=" : " dsec.ro=";
    for (size_t i = 0; i < list->size(); ++i) {
      if (!PlainPath((*list)[i]))
        return Status::InvalidArgument("task: " + std::string(list == &hide ? "hidden" : "protected") + " path " +
                                       (*list)[i] + " goes to a " + kind_name() +
                                       " guest on its kernel command line, which takes letters, digits and "
                                       "/._-+@~ only: guard it with a glob of its directory, or use a container");
      out += (i ? "," : "") + (*list)[i];
    }
  }
  if (out.size() > kMaxGuardCmdline)
    return Status::InvalidArgument("task: the " + std::to_string(hide.size() + ro.size()) + " guarded paths (" +
                                   std::to_string(out.size()) + " bytes) go to a " + kind_name() +
                                   " guest on its kernel command line, which has room for " +
                                   std::to_string(kMaxGuardCmdline) +
                                   ": guard whole directories (tests/**) rather than files, or use a container");
  std::lock_guard<std::mutex> lk(guard_mu_);
  if (guard_cmdlines_.size() >= 256) guard_cmdlines_.clear();
  guard_cmdlines_[key] = out;
  return out;
}

Result<guard::UpperDiff> GuestDriver::Changes(const v1::SandboxRecord& sb) const {
  auto running = RunningBox(sb.id());
  if (!running.ok()) return running.status();
  auto list = (*running)->agent->ChangesSync(kMaxChanges, std::chrono::seconds(30));
  if (!list.ok()) return list.status().Annotate(std::string(kind_name()) + " " + sb.id() + ": its changes");
  guard::UpperDiff out;
  out.truncated = list->truncated();
  for (const auto& c : list->changes()) {
    if (c.kind() > static_cast<uint32_t>(guard::ChangeKind::kReplaced)) continue;
    out.changes.push_back({c.path(), static_cast<guard::ChangeKind>(c.kind()), c.dir()});
  }
  return out;
}

}  // namespace dsec::drivers
