// FaultStore: a Store wrapper that fails or pauses writes on command, for
// tests of everything built on a Store (group commit, actors' recovery).
// Reads pass through untouched.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "state/store.hpp"

namespace dsec::state {

class FaultStore final : public Store {
 public:
  // `base` must outlive this wrapper.
  explicit FaultStore(Store* base) : base_(base) {}

  // The next `n` writes fail with `error` and change nothing.
  void FailNextWrites(int n, Status error = Status::Internal("injected write fault"));
  // Until cleared, every write whose batch touches `key` of `t` (put, delete,
  // or a delete-prefix covering it) fails with `error`: a poisoned row, for
  // checking that a failure stays with the batch that caused it.
  void FailWritesTouching(Table t, std::string key,
                          Status error = Status::Internal("injected write fault"));
  // Back to passing every write through (a paused writer stays paused).
  void ClearFaults();

  // Writes block on entry until ResumeWrites(): lets a test queue work behind
  // a write in progress without sleeping.
  void PauseWrites();
  void ResumeWrites();
  // Blocks until at least `n` writes in total have been held by a pause.
  void WaitForPausedWrites(uint64_t n = 1);

  // Writes attempted (failed and paused ones included) and failed so far.
  uint64_t writes() const;
  uint64_t failed_writes() const;

  Status Write(const WriteBatch& batch, bool sync) override;
  Result<std::string> Get(Table t, const std::string& key) override { return base_->Get(t, key); }
  Status ScanFrom(Table t, const std::string& prefix, const std::string& start, const ScanFn& fn) override {
    return base_->ScanFrom(t, prefix, start, fn);
  }
  std::string Describe() const override { return base_->Describe() + " (fault-injecting)"; }

 private:
  bool Touches(const WriteBatch& batch) const;

  Store* base_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int fail_next_ = 0;
  Status fail_next_error_;
  bool poisoned_ = false;
  Table poison_table_ = Table::kMeta;
  std::string poison_key_;
  Status poison_error_;
  bool paused_ = false;
  uint64_t paused_writes_ = 0;
  uint64_t writes_ = 0;
  uint64_t failed_writes_ = 0;
};

}  // namespace dsec::state
