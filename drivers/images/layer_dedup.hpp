// Snapshot layers deduplicated where they are the same (DESIGN.md section
// 14): a regular file of a new container layer whose contents AND
// metadata (mode, owner, modification time, extended attributes) equal a
// file of a layer taken before becomes a hard link of that file, so it is
// stored once. The common case: a sandbox snapshotted at step k and again
// at step k+1 (a session's, a fork's fork), whose second layer copies
// again every file it changed before step k.
//
// Files are found by key (SHA-256 over the contents and the metadata)
// under `objects`: <objects>/<2 hex>/<key> is one more link of the file
// first stored with that key. An object no layer links any more (link
// count 1) is garbage: CollectObjects removes it. A link count says how
// many layers share a file; overlayfs shows the lower file's, so a shared
// file in a sandbox shows a link count above 1 (docs/running.md).
// Within one layer two equal files stay apart (the sandbox would see two
// paths with one inode, which tar and rsync -H take for a hard link).
//
// Blocking (reads every file it shares): call it off the actor threads.
// The layer is dsecd's copy (no one writes it meanwhile); names in it are
// the agent's: the walk opens each directory relative to its parent with
// O_NOFOLLOW and holds at most one descriptor per level.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dsec/status.hpp"

namespace dsec::images {

struct DedupStats {
  size_t files = 0;          // regular files looked at
  size_t shared_files = 0;   // made links of an earlier layer's file
  uint64_t shared_bytes = 0;  // their size
};

// Shares `layer`'s files with the objects under `objects` (made when
// missing), and makes its other files objects for later layers. An error
// names the path it stopped at; what it shared so far stays shared (each
// link replaces its file by a rename: a file is whole either way).
Result<DedupStats> ShareFiles(const std::string& layer, const std::string& objects);

// Removes objects no layer links any more; how many it removed.
size_t CollectObjects(const std::string& objects);

}  // namespace dsec::images
