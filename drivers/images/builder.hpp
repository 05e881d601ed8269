// Builds an image: a directory, a tarball (plain or compressed), or an OCI
// image layout / `docker save` archive (directory or tarball) becomes one
// EROFS file in the store (mkfs.erofs), plus a manifest to register.
// Archives are unpacked with libarchive; no member lands outside the tree
// (".." is refused, absolute paths are taken as relative, a symlink in a
// member's way is replaced, never followed), and
// OCI whiteouts (.wh.<name>, .wh..wh..opq) are applied layer by layer.
#pragma once

#include <functional>
#include <string>

#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"

namespace dsec::images {

struct BuildOptions {
  std::string compression = "lz4";  // none | lz4 | lz4hc
  // Directory sources: keep file owners (default: every file owned by root,
  // as a tree unpacked by hand usually should be). Archives keep their owners.
  bool keep_owners = false;
  // Git repositories in the tree keep only the history reachable from
  // their checked-out commit (git_scrub.hpp); a directory source is copied
  // first (it is never changed). What went is said through `progress`.
  bool git_scrub = false;
  // Without git_scrub: each repository's files that hold only its future
  // history (objects its checked-out commit does not reach) go to the
  // manifest's watched list, whose reads a session flags (git_scrub.hpp).
  bool git_watch = true;
  // Scratch space for unpacking (default: a fresh dir under the store root).
  std::string scratch_dir;
  // Progress lines for the user; may be empty.
  std::function<void(const std::string&)> progress;
};

enum class SourceKind { kDirectory, kTarball, kOciLayout, kDockerArchive };
const char* SourceKindName(SourceKind k);

// Builds <store_root>/<hex>.erofs and returns its manifest (not registered).
// NotFound when the source is missing, InvalidArgument when it cannot be
// read as any of the kinds (saying which member or why), Unavailable when
// mkfs.erofs is missing.
Result<v1::ImageManifest> BuildImage(const std::string& source, const std::string& name,
                                     const std::string& store_root, const BuildOptions& options);

// Takes an EROFS file made elsewhere (dsec-image push): checked (CheckErofs),
// copied to <store_root>/<hex>.erofs (padded as BuildImage pads) and
// described (not registered). The file itself is not changed.
Result<v1::ImageManifest> PushImage(const std::string& file, const std::string& name, const std::string& store_root);

// Unpacks `archive` into the existing directory `dest` (exposed for tests).
// With `whiteouts`, applies OCI whiteouts against what `dest` already holds.
// Changes the process's working directory while it runs: not for threads.
Status Unpack(const std::string& archive, const std::string& dest, bool whiteouts);

}  // namespace dsec::images
