// StepCache: lookups, replacement, least-recently-used eviction within the
// byte budget, and records too large to cache.
#include "actors/node/step_cache.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace dsec {
namespace {

StepCache::Ptr Step(uint64_t index, size_t stdout_bytes = 0) {
  auto s = std::make_shared<v1::StepRecord>();
  s->set_session("job/s");
  s->set_index(index);
  s->mutable_result()->set_stdout(std::string(stdout_bytes, 'x'));
  return s;
}

size_t Cost(uint64_t index, size_t stdout_bytes = 0) {
  return Step(index, stdout_bytes)->SpaceUsedLong() + StepCache::kOverheadBytes;
}

TEST(StepCache, FindsWhatWasPutAndNothingElse) {
  StepCache c;
  c.Put(Step(3));
  ASSERT_NE(c.Find(3), nullptr);
  EXPECT_EQ(c.Find(3)->index(), 3u);
  EXPECT_EQ(c.Find(4), nullptr);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.bytes(), Cost(3));
}

TEST(StepCache, APutReplacesTheRecordOfTheSameStep) {
  StepCache c;
  c.Put(Step(1));
  auto annotated = std::make_shared<v1::StepRecord>(*Step(1));
  annotated->mutable_meta()->set_reward(0.5);
  c.Put(annotated);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.bytes(), annotated->SpaceUsedLong() + StepCache::kOverheadBytes);
  EXPECT_DOUBLE_EQ(c.Find(1)->meta().reward(), 0.5);
}

TEST(StepCache, DropsTheLeastRecentlyUsedBeyondTheBudget) {
  StepCache c(3 * Cost(1));  // steps 1..4 all cost the same
  c.Put(Step(1));
  c.Put(Step(2));
  c.Put(Step(3));
  ASSERT_NE(c.Find(1), nullptr);  // 1 is now the most recently used; 2 the least
  c.Put(Step(4));
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.Find(2), nullptr);
  EXPECT_NE(c.Find(1), nullptr);
  EXPECT_NE(c.Find(3), nullptr);
  EXPECT_NE(c.Find(4), nullptr);
  EXPECT_LE(c.bytes(), c.max_bytes());
}

TEST(StepCache, ARecordLargerThanTheBudgetIsNotCachedAndEvictsNothing) {
  StepCache c(4096);
  c.Put(Step(0));
  c.Put(Step(1, 8192));
  EXPECT_EQ(c.Find(1), nullptr);
  EXPECT_NE(c.Find(0), nullptr);
  EXPECT_EQ(c.bytes(), Cost(0));
}

TEST(StepCache, ClearForgetsEverything) {
  StepCache c;
  c.Put(Step(0));
  c.Put(Step(1));
  c.Clear();
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.bytes(), 0u);
  EXPECT_EQ(c.Find(0), nullptr);
}

TEST(StepCache, EraseForgetsTheStepAndItsBytes) {
  StepCache c;
  c.Put(Step(0));
  c.Put(Step(1, 100));
  c.Erase(1);
  c.Erase(7);  // absent: nothing happens
  EXPECT_EQ(c.Find(1), nullptr);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.bytes(), Cost(0));
}

TEST(StepCache, GrewRecountsARecordChangedInPlaceAndMakesItRecent) {
  StepCache c(3 * Cost(1) + 200);
  auto one = Step(1);
  c.Put(one);
  c.Put(Step(2));
  c.Put(Step(3));
  one->mutable_result()->set_stdout(std::string(100, 'x'));  // changed in place, as an annotation does
  ASSERT_TRUE(c.Grew(1, 150));
  EXPECT_EQ(c.bytes(), 3 * Cost(1) + 150);
  c.Put(Step(4));  // over budget: 2, now the least recently used, goes; 1 stays
  EXPECT_NE(c.Find(1), nullptr);
  EXPECT_EQ(c.Find(2), nullptr);
  EXPECT_FALSE(c.Grew(2, 10)) << "not cached: the caller puts it instead";
  EXPECT_TRUE(c.Grew(1, -150));
  EXPECT_EQ(c.bytes(), 3 * Cost(1));
}

TEST(StepCache, ARecordThatGrowsPastTheBudgetLeavesTheCache) {
  StepCache c(4096);
  c.Put(Step(0));
  c.Put(Step(1));
  EXPECT_TRUE(c.Grew(1, 8192));
  EXPECT_EQ(c.Find(1), nullptr);
  EXPECT_NE(c.Find(0), nullptr);
  EXPECT_EQ(c.bytes(), Cost(0));
}

}  // namespace
}  // namespace dsec
