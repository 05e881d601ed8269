// GroupCommitter: one writer thread turns many small durable writes into few
// fsyncs. See group_commit.hpp for the contract.
#include "state/group_commit.hpp"

#include <future>
#include <utility>
#include <vector>

namespace dsec::state {

namespace {

// Rebuilds ops [begin, end) of `merged` as a batch of its own, to retry one
// caller's batch after the merged write failed.
WriteBatch Slice(const WriteBatch& merged, size_t begin, size_t end) {
  WriteBatch out;
  for (size_t i = begin; i < end; ++i) {
    const auto& op = merged.ops()[i];
    switch (op.kind) {
      case WriteBatch::Op::Kind::kPut: out.Put(op.table, op.key, op.value); break;
      case WriteBatch::Op::Kind::kDelete: out.Delete(op.table, op.key); break;
      case WriteBatch::Op::Kind::kDeletePrefix: out.DeletePrefix(op.table, op.key); break;
    }
  }
  return out;
}

}  // namespace

GroupCommitter::GroupCommitter(Store* store, GroupCommitOptions options)
    : store_(store), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

GroupCommitter::~GroupCommitter() { Stop(); }

void GroupCommitter::Submit(WriteBatch batch, Callback done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queue_.push_back(Pending{std::move(batch), std::move(done)});
      cv_.notify_one();
      return;
    }
  }
  done(Status::Unavailable("group commit on store " + store_->Describe() +
                           " is stopped (shutting down); the batch was not written"));
}

Status GroupCommitter::WriteSync(WriteBatch batch) {
  std::promise<Status> promise;
  auto result = promise.get_future();
  Submit(std::move(batch), [&promise](const Status& st) { promise.set_value(st); });
  return result.get();
}

void GroupCommitter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::call_once(join_once_, [this] {
    if (thread_.joinable()) thread_.join();
  });
}

GroupCommitter::Stats GroupCommitter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void GroupCommitter::Loop() {
  std::vector<Pending> group;
  std::vector<size_t> ends;  // ends[i]: one past group[i]'s last op in `merged`
  std::vector<Status> results;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything submitted is done

    // Take whole batches only (each must stay atomic); one larger than the
    // limit goes alone rather than never.
    WriteBatch merged;
    group.clear();
    ends.clear();
    while (!queue_.empty()) {
      size_t n = queue_.front().batch.size();
      if (!group.empty() && merged.size() + n > options_.max_ops_per_write) break;
      group.push_back(std::move(queue_.front()));
      queue_.pop_front();
      merged.Append(std::move(group.back().batch));
      ends.push_back(merged.size());
    }
    lock.unlock();

    uint64_t writes = 0;
    uint64_t ops = 0;
    results.assign(group.size(), Status::Ok());
    // Empty batches need no write: everything before them is already durable.
    if (!merged.empty()) {
      Status st = store_->Write(merged, options_.sync);
      ++writes;
      if (st.ok()) {
        ops = merged.size();
      } else if (group.size() == 1) {
        results[0] = st;
      } else {
        // The merged write was atomic, so none of it landed. Retry each batch
        // alone so one bad batch fails only its own caller.
        size_t begin = 0;
        for (size_t i = 0; i < group.size(); begin = ends[i], ++i) {
          if (ends[i] == begin) continue;
          results[i] = store_->Write(Slice(merged, begin, ends[i]), options_.sync);
          ++writes;
          if (results[i].ok()) ops += ends[i] - begin;
        }
      }
    }

    // Count before the callbacks run, so a caller woken by one sees its batch.
    lock.lock();
    stats_.writes += writes;
    stats_.batches += group.size();
    stats_.ops += ops;
    lock.unlock();
    for (size_t i = 0; i < group.size(); ++i) group[i].done(results[i]);
    group.clear();  // drop callbacks (and what they capture) before waiting
    lock.lock();
  }
}

}  // namespace dsec::state
