// The paths of an image a task's globs name (path_glob.hpp), found once per
// image and task: what a container's mount set-up makes read-only
// (protected) or takes out of its view (hidden). The walk goes only into
// directories a glob could lead into (PathGlob::MayMatchUnder), so
// `tests/**` in a tree of 100 000 files reads `tests` and the root.
//
// A matched directory is listed, not what is under it (one read-only bind
// mount, or one whiteout, covers its tree). Symlinks are never followed: a
// link that matches is itself the path.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "drivers/guard/path_glob.hpp"
#include "dsec/status.hpp"

namespace dsec::guard {

struct TaskPaths {
  std::vector<std::string> paths;  // relative to the task's root, sorted
  size_t read_entries = 0;         // what the walk read (its cost)
};

// The entries under `root` (a directory of the image's tree) that `globs`
// match, at most `limit` (ResourceExhausted past it, naming a glob that
// matched).
Result<TaskPaths> FindTaskPaths(const std::string& root, const std::vector<PathGlob>& globs, size_t limit);

}  // namespace dsec::guard
