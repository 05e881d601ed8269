// StepCache: a session's recently used step records, so annotating the step
// just run (the trainer scores it) and fast-forwarding a replayed rollout
// answer from memory instead of reading and parsing the store each time.
// Least recently used first out, within a byte budget per session. Records
// are shared with the session actor, which alone touches them (an
// annotation merges into the cached record, then puts it again so its size
// is counted anew).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>

#include "dsec/v1/types.pb.h"

namespace dsec {

class StepCache {
 public:
  using Ptr = std::shared_ptr<v1::StepRecord>;
  // 32 KiB per session (records counted by their SpaceUsedLong): a few
  // dozen small steps, one or two with long output; 10 000 sessions with a
  // trainer attached hold at most 320 MiB (a session whose trainer is gone
  // drops its cache). A record larger than the budget is not cached.
  static constexpr size_t kDefaultMaxBytes = 32 * 1024;
  // Counted per record on top of its own size: the list and index nodes.
  static constexpr size_t kOverheadBytes = 64;

  explicit StepCache(size_t max_bytes = kDefaultMaxBytes) : max_bytes_(max_bytes) {}

  // The record of step `index`, now the most recently used; null if absent.
  Ptr Find(uint64_t index);
  // Caches `step` under step->index(), replacing what was there (or
  // re-counting it, when it is the same record), and drops the least
  // recently used records beyond the budget.
  void Put(Ptr step);
  // The cached record of step `index` changed by `delta` bytes in place (an
  // annotation merged into it): counts it anew, now most recently used,
  // without walking the whole record again. False if it is not cached.
  bool Grew(uint64_t index, std::ptrdiff_t delta);
  void Erase(uint64_t index);
  void Clear();

  size_t bytes() const { return bytes_; }
  size_t size() const { return by_index_.size(); }
  size_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    uint64_t index;
    Ptr step;
    size_t bytes;
  };
  using List = std::list<Entry>;  // most recently used first
  // Drops the least recently used records beyond the budget.
  void Trim();
  size_t max_bytes_;
  size_t bytes_ = 0;
  List lru_;
  std::unordered_map<uint64_t, List::iterator> by_index_;
};

}  // namespace dsec
