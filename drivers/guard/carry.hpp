// The layer a grade sandbox gets of the agent's sandbox (DESIGN.md section
// 13, Session.Grade): what the agent's overlay upper dir holds under the
// task's root, copied into a directory that becomes a lower layer of the
// grade sandbox's overlay, between the grader's files and the image.
//
// A copy, not the live upper dir: overlayfs leaves a lower layer that
// changes under a mounted overlay undefined, and the agent goes on. The copy
// is of the changes only (not of the image), and each file is a reflink
// (FICLONE) where the disk can (btrfs sandbox disks), else copied.
//
// What the agent may not decide is left to the image: paths the task's
// protected or hidden globs match are not carried, so the image's version
// shows (a test the agent deleted is back, a conftest.py it made is not
// there), and where the agent removed or replaced a directory the image
// has such paths under, they are put back from the image.
//
// Whiteouts (0:0 character devices) and opaque directories are carried as
// the overlay made them (they delete in a lower layer as in the upper);
// other trusted.overlay.* attributes (origin, impure, redirect) and any
// user.overlay.* are not. Symlinks are copied, never followed; the walk
// opens each directory relative to its parent with O_NOFOLLOW and skips
// one swapped meanwhile (the upper dir is the agent's), holds no more than
// a directory's names at once, recurses nowhere (the depth is the agent's
// to choose), copies hard links once and files up to the size seen.
// Where the agent removed, replaced or made anew a directory above the
// task root, the root is opaque in the copy (empty when it is gone), with
// the image's protected and hidden paths back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "drivers/guard/path_glob.hpp"
#include "dsec/status.hpp"

namespace dsec::guard {

struct CarryOptions {
  std::string root;                  // the task's root, relative ("work/repo"); "" for the whole tree
  std::vector<PathGlob> image_wins;  // protected and hidden globs, relative to the root
  // What image_wins names in the image, when the caller knows it
  // (FindTaskPaths' paths): no walk of the image then.
  const std::vector<std::string>* image_kept = nullptr;
  size_t max_entries = 200000;       // ResourceExhausted past any of these
  uint64_t max_bytes = 4ull << 30;   // of regular files (hard links count once)
  int max_depth = 512;               // directory levels under the root
};

struct CarryStats {
  size_t entries = 0;     // copied (files, dirs, links, whiteouts)
  size_t skipped = 0;     // the agent's, under a path the image decides
  size_t restored = 0;    // the image's, put back under a dir the agent replaced
  uint64_t bytes = 0;     // of regular files
  size_t reflinked = 0;   // files cloned rather than copied
};

// Copies the changes in `upper` under opts.root into `dest` (made, mode
// 0755; must not exist). `image` is the image's tree (its mount), where
// restored paths come from. An error names the path it stopped at; `dest`
// is then incomplete (the caller removes it).
Result<CarryStats> CarryChanges(const std::string& upper, const std::string& image, const std::string& dest,
                                const CarryOptions& opts);

// Copies the tree `src` into `dest` (made; must not exist): files, dirs,
// symlinks, owners, modes, times. A grader image's files, for one.
Result<CarryStats> CopyLayer(const std::string& src, const std::string& dest, size_t max_entries = 200000,
                             uint64_t max_bytes = 4ull << 30);

// Flattens overlay layers: copies what of `layer` (an older one) the
// layers already merged into `dest` (newer ones) do not hide: entries
// `dest` lacks, whiteouts and opaque directories included; nothing under a
// file, a whiteout or an opaque directory of `dest`; a directory both have
// keeps `dest`'s metadata and becomes opaque if `layer`'s is (the image
// stays hidden below). Call it for each layer, newest first. `merge` false:
// CopyLayer (dest must not exist).
Result<CarryStats> MergeUnder(const std::string& layer, const std::string& dest, size_t max_entries = 200000,
                              uint64_t max_bytes = 4ull << 30, bool merge = true);

}  // namespace dsec::guard
