// GroupCommitter: durable writes off the actor threads. Callers submit batches
// from any thread; one writer thread merges everything queued into a single
// synced RocksDB write (group commit) and then runs each caller's callback.
// A callback runs on the writer thread: post the result to your actor, do not
// do real work there.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "state/store.hpp"

namespace dsec::state {

struct GroupCommitOptions {
  // Most ops merged into one write (default 8192); more wait for the next.
  size_t max_ops_per_write = 8192;
  // Durable writes (default true). false is for benchmarks comparing the cost.
  bool sync = true;
};

class GroupCommitter {
 public:
  using Callback = std::function<void(const Status&)>;
  struct Stats {
    uint64_t writes = 0;    // store writes issued
    uint64_t batches = 0;   // batches submitted and completed
    uint64_t ops = 0;       // ops written
  };

  GroupCommitter(Store* store, GroupCommitOptions options = {});
  // Completes everything already submitted, then stops the thread.
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Queues `batch`; `done` runs once it is durable (or failed). After
  // Stop() it runs at once with Unavailable.
  void Submit(WriteBatch batch, Callback done);
  // Blocking convenience for start-up code and tests: Submit and wait. Not
  // from a callback.
  Status WriteSync(WriteBatch batch);
  // Drains the queue and joins the writer thread. Idempotent. Not from a
  // callback (the writer thread would wait for itself).
  void Stop();
  Stats stats() const;

 private:
  struct Pending {
    WriteBatch batch;
    Callback done;
  };
  void Loop();

  Store* store_;
  GroupCommitOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  Stats stats_;
  std::once_flag join_once_;  // Stop() may race with itself or the destructor
  std::thread thread_;
};

}  // namespace dsec::state
