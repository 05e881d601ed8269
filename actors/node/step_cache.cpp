#include "actors/node/step_cache.hpp"

#include <algorithm>
#include <utility>

namespace dsec {

StepCache::Ptr StepCache::Find(uint64_t index) {
  auto it = by_index_.find(index);
  if (it == by_index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->step;
}

void StepCache::Put(Ptr step) {
  if (!step) return;
  uint64_t index = step->index();
  Erase(index);
  // The message's own reckoning of its memory, plus the list and index
  // nodes around it.
  size_t bytes = step->SpaceUsedLong() + kOverheadBytes;
  if (bytes > max_bytes_) return;
  lru_.push_front(Entry{index, std::move(step), bytes});
  by_index_[index] = lru_.begin();
  bytes_ += bytes;
  Trim();
}

bool StepCache::Grew(uint64_t index, std::ptrdiff_t delta) {
  auto it = by_index_.find(index);
  if (it == by_index_.end()) return false;
  Entry& e = *it->second;
  size_t bytes = static_cast<size_t>(std::max<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(e.bytes) + delta,
                                                               static_cast<std::ptrdiff_t>(kOverheadBytes)));
  if (bytes > max_bytes_) {
    Erase(index);
    return true;
  }
  bytes_ = bytes_ - e.bytes + bytes;
  e.bytes = bytes;
  lru_.splice(lru_.begin(), lru_, it->second);
  Trim();
  return true;
}

void StepCache::Trim() {
  while (bytes_ > max_bytes_) {
    const Entry& old = lru_.back();
    bytes_ -= old.bytes;
    by_index_.erase(old.index);
    lru_.pop_back();
  }
}

void StepCache::Clear() {
  lru_.clear();
  by_index_.clear();
  bytes_ = 0;
}

void StepCache::Erase(uint64_t index) {
  auto it = by_index_.find(index);
  if (it == by_index_.end()) return;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  by_index_.erase(it);
}

}  // namespace dsec
