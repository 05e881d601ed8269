// A node's snapshots (DESIGN.md section 14): named, read-only states of
// sandboxes that new sandboxes start from. Each is a directory of its own
// under <data>/snapshots (a container's: its changes to its image, a layer
// stacked above the image and above the layers of the snapshot its source
// started from) and a SnapshotInfo in the `snapshots` table.
//
// Whole or not at all: the layer is written to <id>.part, renamed to <id>
// and fsync'd before its record is written (sync); at start, a directory no
// record names is removed and a record whose directory is gone is dropped,
// each said. Who needs a snapshot (sandboxes made from it, snapshots above
// it) is kept here under one lock, so a removal never races a creation.
// A container layer's files equal to an earlier layer's are stored once
// (hard links through <data>/snapshots/objects, layer_dedup.hpp).
//
// Blocking (files and the store): call it off the actor threads where it
// copies or removes. Nothing here knows about CAF.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "drivers/images/layer_dedup.hpp"
#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"
#include "state/store.hpp"

namespace dsec::images {

class SnapshotStore {
 public:
  // Layers a sandbox may stack (a snapshot of a sandbox made from one of
  // this depth is flattened: the sandbox actor begins it without a parent).
  static constexpr uint32_t kMaxDepth = 8;

  // `root`: <data>/snapshots (made when missing). `max_bytes`: what all
  // snapshots' layers may take together (dsecd --snapshot-bytes).
  SnapshotStore(state::Store* store, std::string root, std::string node_id, uint64_t max_bytes);

  // At start: loads the records, removes what a crash left half made.
  // Lines for the log, one per thing put right.
  std::vector<std::string> Load();

  // A snapshot being taken (of a sandbox made from `parent`, "" for none):
  // its name is reserved until Commit or Abort.
  struct Pending {
    std::string name;
    std::string part;       // write the layer here (does not exist yet)
    std::string dir;        // where it lives once committed
    uint64_t bytes_left = 0;  // of the node's snapshot space
  };
  // InvalidArgument for a bad name, AlreadyExists for a taken one (naming
  // its source), ResourceExhausted when the node's snapshot space is full,
  // FailedPrecondition past kMaxDepth layers.
  Result<Pending> Begin(const std::string& name, const std::string& parent);
  // Makes it durable: `info` is completed (name, dir, node, created,
  // depth from its parent) and returned.
  Result<v1::SnapshotInfo> Commit(const Pending& p, v1::SnapshotInfo info);
  // A container layer's files equal to those of layers taken before it
  // become links of theirs (drivers/images/layer_dedup.hpp); call it
  // before Commit, and set the info's shared_bytes from it.
  Result<DedupStats> Share(const Pending& p);
  // Forgets a snapshot that was not made; its part dir is removed.
  void Abort(const Pending& p);

  // NotFound naming the name and how to list them.
  Result<v1::SnapshotInfo> Get(const std::string& name) const;
  std::vector<v1::SnapshotInfo> List() const;
  // Refused (FailedPrecondition) while sandboxes or snapshots need it.
  Status Remove(const std::string& name);

  // What a new sandbox of `name` stacks (its dirs, newest first, and the
  // image's digest) and the snapshot; NotFound when there is none.
  Result<v1::SnapshotInfo> Resolve(const std::string& name, v1::SnapshotLayers* layers) const;
  // Sandbox `id` needs `name` (idempotent) / no longer does. An ephemeral
  // snapshot (a fork's) that nothing needs any more is forgotten by
  // Release and returned: the caller removes it (Drop), off its thread.
  void Hold(const std::string& name, const std::string& id);
  std::vector<v1::SnapshotInfo> Release(const std::string& id);
  // Removes a forgotten snapshot's record and layer.
  void Drop(const v1::SnapshotInfo& gone);
  // The snapshots on an image (an image they stand on is in use).
  std::vector<std::string> OnImage(const std::string& image) const;
  // What the snapshots take on disk: their layers less what they share.
  uint64_t used_bytes() const;
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  std::vector<std::string> UsersLocked(const std::string& name) const;
  // Forgets `name` and the ephemeral snapshots under it that nothing needs.
  void CollectUnused(std::string name, std::vector<v1::SnapshotInfo>* gone);
  v1::SnapshotInfo Shown(const v1::SnapshotInfo& s) const;
  uint64_t UsedLocked() const;

  state::Store* store_;
  std::string root_, node_id_, objects_;
  uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, v1::SnapshotInfo> snaps_;  // committed, by name
  std::set<std::string> pending_;                  // names being taken
  std::map<std::string, std::string> held_;        // sandbox id -> snapshot
};

}  // namespace dsec::images
