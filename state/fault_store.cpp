// FaultStore: see fault_store.hpp.
#include "state/fault_store.hpp"

#include <utility>

namespace dsec::state {

void FaultStore::FailNextWrites(int n, Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ = n;
  fail_next_error_ = std::move(error);
}

void FaultStore::FailWritesTouching(Table t, std::string key, Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  poisoned_ = true;
  poison_table_ = t;
  poison_key_ = std::move(key);
  poison_error_ = std::move(error);
}

void FaultStore::ClearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ = 0;
  poisoned_ = false;
}

void FaultStore::PauseWrites() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
}

void FaultStore::ResumeWrites() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

void FaultStore::WaitForPausedWrites(uint64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return paused_writes_ >= n; });
}

uint64_t FaultStore::writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

uint64_t FaultStore::failed_writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_writes_;
}

bool FaultStore::Touches(const WriteBatch& batch) const {
  for (const auto& op : batch.ops()) {
    if (op.table != poison_table_) continue;
    bool hit = op.kind == WriteBatch::Op::Kind::kDeletePrefix
                   ? poison_key_.compare(0, op.key.size(), op.key) == 0
                   : op.key == poison_key_;
    if (hit) return true;
  }
  return false;
}

Status FaultStore::Write(const WriteBatch& batch, bool sync) {
  Status injected;
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++writes_;
    if (paused_) {
      ++paused_writes_;
      cv_.notify_all();  // wake WaitForPausedWrites
      cv_.wait(lock, [this] { return !paused_; });
    }
    if (fail_next_ > 0) {
      --fail_next_;
      injected = fail_next_error_;
    } else if (poisoned_ && Touches(batch)) {
      injected = poison_error_;
    }
    if (!injected.ok()) ++failed_writes_;
  }
  if (!injected.ok()) return injected;
  return base_->Write(batch, sync);
}

}  // namespace dsec::state
