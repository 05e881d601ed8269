// A spec's task guard (types.proto, TaskGuard), checked once where the node
// admits the spec: its root and globs, bounded, each error naming the entry.
#pragma once

#include <string>
#include <vector>

#include "drivers/guard/path_glob.hpp"
#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"

namespace dsec::guard {

inline constexpr size_t kMaxGuardedPaths = 4096;  // image paths one task's globs may name

struct ParsedGuard {
  std::string root;  // absolute, without a trailing '/'
  std::vector<PathGlob> protect, hide;
  bool active() const { return !protect.empty() || !hide.empty(); }
};

// Ok with an inactive guard when `g` names no path.
Result<ParsedGuard> ParseGuard(const v1::TaskGuard& g);

}  // namespace dsec::guard
