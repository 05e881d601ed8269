// GroupCommitter: every submission completes exactly once, groups really
// merge, and a failure stays with the batch that caused it. Ordering is forced
// with FaultStore's pause, never with sleeps.
#include "state/group_commit.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "state/fault_store.hpp"
#include "tests/unit/state/temp_dir.hpp"

namespace dsec::state {
namespace {

using ::testing::HasSubstr;

// Counts callbacks and remembers their statuses; Wait() blocks until `n` ran.
class Completions {
 public:
  GroupCommitter::Callback Add(size_t slot) {
    return [this, slot](const Status& st) {
      std::lock_guard<std::mutex> lock(mu_);
      statuses_[slot] = st;
      ++calls_[slot];
      ++done_;
      cv_.notify_all();
    };
  }
  explicit Completions(size_t n) : statuses_(n), calls_(n, 0) {}
  void Wait(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= n; });
  }
  Status status(size_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_[slot];
  }
  int calls(size_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[slot];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> statuses_;
  std::vector<int> calls_;
  size_t done_ = 0;
};

std::string Key(size_t i) { return "k" + std::to_string(i); }

WriteBatch OnePut(size_t i) {
  WriteBatch b;
  b.Put(Table::kSteps, StepKey("s", i), "v" + std::to_string(i));
  return b;
}

class GroupCommitTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> mem_ = NewMemStore();
  FaultStore fault_{mem_.get()};
};

TEST_F(GroupCommitTest, ConcurrentSubmittersAllSucceed) {
  constexpr size_t kThreads = 8;
  constexpr size_t kPerThread = 250;
  Completions done(kThreads * kPerThread);
  {
    GroupCommitter gc(&fault_);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (size_t j = 0; j < kPerThread; ++j) {
          size_t i = t * kPerThread + j;
          WriteBatch b = OnePut(i);
          b.Put(Table::kMeta, Key(i), "meta");
          gc.Submit(std::move(b), done.Add(i));
        }
      });
    }
    for (auto& th : threads) th.join();
    done.Wait(kThreads * kPerThread);
    auto stats = gc.stats();
    EXPECT_EQ(stats.batches, kThreads * kPerThread);
    EXPECT_EQ(stats.ops, 2 * kThreads * kPerThread);
    EXPECT_LE(stats.writes, stats.batches);
  }
  for (size_t i = 0; i < kThreads * kPerThread; ++i) {
    EXPECT_EQ(done.calls(i), 1) << i;
    EXPECT_TRUE(done.status(i).ok()) << i << ": " << done.status(i).ToString();
    auto step = mem_->Get(Table::kSteps, StepKey("s", i));
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, "v" + std::to_string(i));
    EXPECT_TRUE(mem_->Get(Table::kMeta, Key(i)).ok()) << i;
  }
}

TEST_F(GroupCommitTest, BatchesQueuedBehindAWriteMergeIntoOne) {
  GroupCommitter gc(&fault_);
  fault_.PauseWrites();
  Completions first(1);
  gc.Submit(OnePut(0), first.Add(0));
  fault_.WaitForPausedWrites(1);  // the writer is inside Write; the rest queue

  constexpr size_t kThreads = 4;
  constexpr size_t kPerThread = 50;
  Completions done(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t j = 0; j < kPerThread; ++j) {
        gc.Submit(OnePut(1 + t * kPerThread + j), done.Add(t * kPerThread + j));
      }
    });
  }
  for (auto& th : threads) th.join();
  fault_.ResumeWrites();
  first.Wait(1);
  done.Wait(kThreads * kPerThread);

  auto stats = gc.stats();
  EXPECT_EQ(stats.batches, 1 + kThreads * kPerThread);
  EXPECT_EQ(stats.writes, 2u);  // the paused one, then everything queued at once
  EXPECT_EQ(fault_.writes(), 2u);
  EXPECT_TRUE(first.status(0).ok());
  for (size_t i = 0; i < kThreads * kPerThread; ++i) EXPECT_TRUE(done.status(i).ok()) << i;
}

TEST_F(GroupCommitTest, GroupsRespectMaxOpsButNeverSplitABatch) {
  GroupCommitOptions options;
  options.max_ops_per_write = 10;
  GroupCommitter gc(&fault_, options);
  fault_.PauseWrites();
  Completions done(12);
  gc.Submit(OnePut(0), done.Add(0));
  fault_.WaitForPausedWrites(1);

  for (size_t i = 1; i <= 10; ++i) {  // 3 ops each: groups of 3, 3, 3, 1 batches
    WriteBatch b;
    for (size_t j = 0; j < 3; ++j) b.Put(Table::kMeta, Key(i * 10 + j), "v");
    gc.Submit(std::move(b), done.Add(i));
  }
  WriteBatch big;  // larger than the limit: written alone
  for (size_t j = 0; j < 25; ++j) big.Put(Table::kImages, Key(j), "v");
  gc.Submit(std::move(big), done.Add(11));
  fault_.ResumeWrites();
  done.Wait(12);

  auto stats = gc.stats();
  EXPECT_EQ(stats.writes, 1u + 4u + 1u);
  EXPECT_EQ(stats.batches, 12u);
  EXPECT_EQ(stats.ops, 1u + 30u + 25u);
  for (size_t i = 0; i < 12; ++i) EXPECT_TRUE(done.status(i).ok()) << i;
}

TEST_F(GroupCommitTest, DestructorCompletesPendingSubmissions) {
  constexpr size_t kCount = 500;
  Completions done(kCount);
  {
    GroupCommitter gc(&fault_);
    for (size_t i = 0; i < kCount; ++i) gc.Submit(OnePut(i), done.Add(i));
  }  // no wait: the destructor must drain
  for (size_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(done.calls(i), 1) << i;
    EXPECT_TRUE(done.status(i).ok()) << i;
    EXPECT_TRUE(mem_->Get(Table::kSteps, StepKey("s", i)).ok()) << i;
  }
}

TEST_F(GroupCommitTest, SubmitAfterStopIsUnavailable) {
  GroupCommitter gc(&fault_);
  ASSERT_TRUE(gc.WriteSync(OnePut(1)).ok());
  gc.Stop();
  gc.Stop();  // idempotent
  Completions done(1);
  gc.Submit(OnePut(2), done.Add(0));
  EXPECT_EQ(done.calls(0), 1);  // at once, on this thread
  EXPECT_EQ(done.status(0).code(), Status::Code::kUnavailable);
  EXPECT_THAT(done.status(0).message(), HasSubstr(fault_.Describe()));
  EXPECT_EQ(gc.WriteSync(OnePut(3)).code(), Status::Code::kUnavailable);
  EXPECT_FALSE(mem_->Get(Table::kSteps, StepKey("s", 2)).ok());
}

TEST_F(GroupCommitTest, FailedWriteReportsTheError) {
  GroupCommitter gc(&fault_);
  fault_.FailNextWrites(1, Status::Internal("disk on fire"));
  Status st = gc.WriteSync(OnePut(1));
  EXPECT_EQ(st.code(), Status::Code::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("disk on fire"));
  EXPECT_FALSE(mem_->Get(Table::kSteps, StepKey("s", 1)).ok());
  EXPECT_TRUE(gc.WriteSync(OnePut(1)).ok());  // the fault was one-shot
  EXPECT_TRUE(mem_->Get(Table::kSteps, StepKey("s", 1)).ok());
}

TEST_F(GroupCommitTest, FailureStaysWithTheFailingBatch) {
  GroupCommitter gc(&fault_);
  fault_.PauseWrites();
  Completions done(4);
  gc.Submit(OnePut(0), done.Add(0));
  fault_.WaitForPausedWrites(1);

  // Queued together, so they are merged into one write that fails; the
  // committer must retry them one by one.
  gc.Submit(OnePut(1), done.Add(1));
  WriteBatch bad = OnePut(2);
  bad.Put(Table::kMeta, "poison", "x");
  gc.Submit(std::move(bad), done.Add(2));
  gc.Submit(OnePut(3), done.Add(3));
  fault_.FailWritesTouching(Table::kMeta, "poison", Status::Internal("bad row"));
  fault_.ResumeWrites();
  done.Wait(4);

  EXPECT_TRUE(done.status(0).ok());
  EXPECT_TRUE(done.status(1).ok()) << done.status(1).ToString();
  EXPECT_EQ(done.status(2).code(), Status::Code::kInternal);
  EXPECT_THAT(done.status(2).message(), HasSubstr("bad row"));
  EXPECT_TRUE(done.status(3).ok()) << done.status(3).ToString();
  EXPECT_TRUE(mem_->Get(Table::kSteps, StepKey("s", 1)).ok());
  EXPECT_FALSE(mem_->Get(Table::kSteps, StepKey("s", 2)).ok());  // all of it, atomically
  EXPECT_FALSE(mem_->Get(Table::kMeta, "poison").ok());
  EXPECT_TRUE(mem_->Get(Table::kSteps, StepKey("s", 3)).ok());
  EXPECT_EQ(fault_.failed_writes(), 2u);        // the merged write and the retry
  EXPECT_EQ(gc.stats().writes, 1u + 1u + 3u);   // paused, merged, three retries
  EXPECT_EQ(gc.stats().ops, 1u + 1u + 1u);
}

TEST_F(GroupCommitTest, EmptyBatchCompletesWithoutAWrite) {
  GroupCommitter gc(&fault_);
  EXPECT_TRUE(gc.WriteSync(WriteBatch()).ok());
  EXPECT_EQ(fault_.writes(), 0u);
  EXPECT_EQ(gc.stats().batches, 1u);
}

TEST(GroupCommitRocksTest, DurableWritesLand) {
  testing::TempDir dir;
  auto store = OpenRocksStore(dir.db());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  {
    GroupCommitter gc(store->get());
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int j = 0; j < 20; ++j) {
          if (!gc.WriteSync(OnePut(t * 20 + j)).ok()) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
  }
  for (size_t i = 0; i < 80; ++i) EXPECT_TRUE((*store)->Get(Table::kSteps, StepKey("s", i)).ok());
}

}  // namespace
}  // namespace dsec::state
