// Containers' snapshots (DESIGN.md section 14): a snapshot is what the
// container changed, its overlay's upper dir, copied while it is frozen
// into a directory that new containers stack as a read-only layer above
// their image (and above the layers of the snapshot the source itself
// started from: a fork of a fork stacks). Unchanged image files are never
// copied; whiteouts and opaque directories carry deletions as the overlay
// made them.
#include <sys/stat.h>

#include <chrono>

#include "drivers/container/container_box.hpp"
#include "drivers/container/container_driver.hpp"
#include "drivers/guard/carry.hpp"
#include "drivers/images/snapshot_store.hpp"

namespace dsec::drivers {

Result<guard::CarryStats> ContainerDriver::CopyFrozen(const std::shared_ptr<Box>& box, const std::string& what,
                                                      const std::function<Result<guard::CarryStats>()>& copy) {
  // The container stands still while its changes are read (frozen unless
  // it is already), so the copy is one moment of its tree. Calls to it
  // wait meanwhile (the lock is not held: they queue on the frozen agent).
  bool froze = false;
  {
    std::lock_guard<std::mutex> lk(box->idle_mu);
    if (!box->groups)
      return Status::FailedPrecondition("sandbox " + box->id + " has no cgroup here to freeze while " + what);
    if (!box->user_paused && !box->idle_frozen) {
      Status frozen = box->groups->Freeze(box->cgroup_rel, true);
      if (!frozen.ok())
        return Status::Unavailable("sandbox " + box->id + " could not be frozen while " + what + " (" +
                                   frozen.message() + "); try again");
      froze = true;
    }
    box->carrying = true;
  }
  auto copied = copy();
  {
    std::lock_guard<std::mutex> lk(box->idle_mu);
    box->carrying = false;
    if (froze && !box->user_paused) (void)box->groups->Freeze(box->cgroup_rel, false);
  }
  return copied;
}

void ContainerDriver::Snapshot(const v1::SandboxRecord& sb, const std::string& dest, uint64_t max_bytes,
                               SnapshotCallback done) {
  Answer(std::move(done), [this, sb, dest, max_bytes]() -> Result<SnapshotStats> {
    auto t0 = std::chrono::steady_clock::now();
    auto box = Find(sb.id());
    if (!box) return Status::NotFound("container " + sb.id() + " is not on this node");
    guard::CarryOptions opts;  // everything it changed, from its root
    if (max_bytes) opts.max_bytes = max_bytes;
    std::string upper = SandboxDir(opts_.data_dir, sb.id()) + "/upper";
    // Its snapshot layers as deep as they may stack: flattened into this
    // one (each merged under the newer ones), which then stands on the
    // image alone.
    const auto& layers = sb.spec().layers().dirs();
    bool flatten = static_cast<uint32_t>(layers.size()) >= images::SnapshotStore::kMaxDepth;
    auto copied = CopyFrozen(box, "its changes are copied into a snapshot", [&]() -> Result<guard::CarryStats> {
      auto c = guard::CarryChanges(upper, mounts_->PathFor(box->digest), dest, opts);
      for (int i = 0; c.ok() && flatten && i < layers.size(); ++i) {
        auto merged = guard::MergeUnder(layers[i], dest, opts.max_entries - c->entries, opts.max_bytes - c->bytes);
        if (!merged.ok()) return merged.status().Annotate("flatten " + layers[i]);
        c->entries += merged->entries;
        c->bytes += merged->bytes;
      }
      return c;
    });
    if (!copied.ok()) return copied.status().Annotate("snapshot of container " + sb.id());
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    Log(1, "container " + sb.id() + ": snapshot of " + std::to_string(copied->entries) + " changed entries (" +
               std::to_string(copied->bytes) + " bytes, " + std::to_string(copied->reflinked) + " reflinked) in " +
               std::to_string(ms) + " ms");
    return SnapshotStats{copied->bytes, copied->entries, box->digest};
  });
}

Result<std::string> ContainerDriver::SnapshotLayers(const v1::SandboxSpec& spec, const std::string& digest) const {
  if (spec.snapshot().empty()) return std::string();
  const auto& layers = spec.layers();
  if (layers.dirs().empty())
    return Status::FailedPrecondition("snapshot '" + spec.snapshot() + "' was not resolved to its layers by the node");
  if (layers.image_digest() != digest)
    return Status::FailedPrecondition("snapshot '" + spec.snapshot() + "' stands on image " + spec.image() +
                                      " as it was (" + layers.image_digest() + "); that name now holds " + digest +
                                      ": a snapshot needs the image it was taken on");
  std::string out;
  for (const auto& d : layers.dirs()) {
    struct stat st;
    if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return Status::FailedPrecondition("snapshot '" + spec.snapshot() + "': its layer " + d + " is gone");
    out += d + ":";
  }
  return out;
}

// Pause with memory (DSec's freeze, swap, memory.reclaim): frozen, then
// what the kernel can reclaim of its group now goes (its page cache; its
// anonymous memory only where the node has swap). Resume thaws it, and
// what it needs comes back as it reads.
void ContainerDriver::PauseMemory(const v1::SandboxRecord& sb, StatusCallback done) {
  Pause(sb, true, [this, id = sb.id(), done = std::move(done)](const Status& frozen) {
    if (!frozen.ok()) return done(frozen);
    auto box = Find(id);  // on a worker thread (Pause's)
    if (!box) return done(Status::Unavailable("container " + id + " is not running on this node"));
    Status reclaimed = groups_->ReclaimMemory(box->cgroup_rel);
    if (!reclaimed.ok()) {
      // Not paused with memory: left as it was (running), saying why.
      std::lock_guard<std::mutex> lk(box->idle_mu);
      if (groups_->Freeze(box->cgroup_rel, false).ok()) box->user_paused = false;
    }
    done(reclaimed.Annotate("container " + id + ": reclaim its memory (it runs on)"));
  });
}

}  // namespace dsec::drivers
