// A task's hidden paths taken out of the agent's view by the kernel: an
// overlay layer of whiteouts, put above the image (lowerdir=mask:image).
// A hidden path then does not exist in the agent's sandbox, for every
// process, root in it included: it cannot be read, listed or opened, and a
// file the agent makes in its place is its own (the grade's sandbox, built
// without the mask, sees the image's). Why not Landlock: its rules grant
// rights on trees, so hiding `tests/secret` would mean granting read on
// every sibling and ancestor instead, and it cannot hide a name from its
// directory's listing; a whiteout does both, with no check on the path of
// each access.
//
// The layer's directories on the way to a whiteout take the image's
// directories' mode, owner and times (an overlay shows the top layer's
// directory attributes: a root-owned 0755 one would take a task's
// directory from its user).
#pragma once

#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::guard {

// Makes `layer` (a new, empty directory) hold a whiteout for each of
// `paths` (relative to `image_root`, as FindTaskPaths gives them), with the
// directories on the way as `image_root` has them. Needs CAP_MKNOD.
Status MakeMaskLayer(const std::string& layer, const std::string& image_root, const std::vector<std::string>& paths);

}  // namespace dsec::guard
