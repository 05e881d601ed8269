// What a container changed in its image: read from its overlay's upper
// directory, which holds exactly that (DESIGN.md section 13). Cheap after
// every step: the walk is over what the container wrote, never over the
// image.
//
//   created   in upper, not in any lower layer
//   modified  in upper and in a lower layer (a copy-up: content, mode or
//             owner changed; a directory that gained or lost entries)
//   deleted   a whiteout (a 0:0 character device) hiding a lower entry
//   replaced  an opaque directory (removed and made again): nothing of the
//             lower one under it is seen any more
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::guard {

enum class ChangeKind { kCreated, kModified, kDeleted, kReplaced };
const char* ChangeKindName(ChangeKind k);  // "created", ...

struct Change {
  std::string path;  // relative to the root, no leading '/'
  ChangeKind kind = ChangeKind::kCreated;
  bool dir = false;
};

struct UpperDiff {
  std::vector<Change> changes;  // sorted by path
  bool truncated = false;       // more than the limit: the rest not listed
};

// The changes in `upper` against the lower layers `lowers` (the image's
// mount first), at most `limit` of them. A path that is only a directory
// the container went through (made by a copy-up of something under it,
// unchanged itself) is not a change.
Result<UpperDiff> ReadUpperDiff(const std::string& upper, const std::vector<std::string>& lowers, size_t limit);

}  // namespace dsec::guard
