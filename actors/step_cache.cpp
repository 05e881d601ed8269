#include "actors/step_cache.hpp"

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
