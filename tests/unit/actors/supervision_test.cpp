// Restart intensity (MaxR restarts in MaxT), driven with explicit time
// points: the test owns the clock, nothing sleeps.
#include "actors/node/supervision.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace dsec {
namespace {

using namespace std::chrono_literals;
using Clock = RestartIntensity::Clock;

class RestartIntensityTest : public ::testing::Test {
 protected:
  // An arbitrary origin far from the clock's epoch, so "now - window" never
  // goes below it.
  const Clock::time_point t0_ = Clock::time_point(24h);
};

TEST_F(RestartIntensityTest, ReportsItsConfiguration) {
  RestartIntensity ri(3, 10s);
  EXPECT_EQ(ri.max_restarts(), 3);
  EXPECT_EQ(ri.window(), Clock::duration(10s));
}

TEST_F(RestartIntensityTest, AllowsMaxRestartsWithinTheWindowThenRefuses) {
  RestartIntensity ri(3, 10s);
  EXPECT_TRUE(ri.Allow("sb-1", t0_));
  EXPECT_TRUE(ri.Allow("sb-1", t0_ + 1s));
  EXPECT_TRUE(ri.Allow("sb-1", t0_ + 2s));
  EXPECT_FALSE(ri.Allow("sb-1", t0_ + 3s));
  EXPECT_FALSE(ri.Allow("sb-1", t0_ + 9s)) << "still within 10 s of the first restart";
}

TEST_F(RestartIntensityTest, ManyFailuresAtTheSameInstant) {
  RestartIntensity ri(2, 1min);
  EXPECT_TRUE(ri.Allow("c", t0_));
  EXPECT_TRUE(ri.Allow("c", t0_));
  EXPECT_FALSE(ri.Allow("c", t0_));
  EXPECT_EQ(ri.Recent("c", t0_), 2);
}

TEST_F(RestartIntensityTest, RefusalsDoNotCountAsRestarts) {
  RestartIntensity ri(2, 10s);
  ASSERT_TRUE(ri.Allow("c", t0_));
  ASSERT_TRUE(ri.Allow("c", t0_ + 1s));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(ri.Allow("c", t0_ + 2s));
  EXPECT_EQ(ri.Recent("c", t0_ + 2s), 2);
}

TEST_F(RestartIntensityTest, AllowsAgainOnceTheWindowSlidesPastOldRestarts) {
  RestartIntensity ri(2, 10s);
  ASSERT_TRUE(ri.Allow("c", t0_));
  ASSERT_TRUE(ri.Allow("c", t0_ + 4s));
  ASSERT_FALSE(ri.Allow("c", t0_ + 5s));

  // At t0+10s the restart at t0 is a full window old and no longer counts;
  // the one at t0+4s still does.
  EXPECT_EQ(ri.Recent("c", t0_ + 10s - 1ns), 2);
  EXPECT_EQ(ri.Recent("c", t0_ + 10s), 1);
  EXPECT_TRUE(ri.Allow("c", t0_ + 10s));
  EXPECT_FALSE(ri.Allow("c", t0_ + 11s)) << "t0+4s and t0+10s are both within the window";

  // Long after everything, the full budget is back.
  EXPECT_EQ(ri.Recent("c", t0_ + 1h), 0);
  EXPECT_TRUE(ri.Allow("c", t0_ + 1h));
  EXPECT_TRUE(ri.Allow("c", t0_ + 1h));
  EXPECT_FALSE(ri.Allow("c", t0_ + 1h));
}

TEST_F(RestartIntensityTest, SteadyFailureRateBelowTheLimitIsAlwaysAllowed) {
  // 3 restarts per 10 s allowed; failing every 4 s keeps at most 3 in any window.
  RestartIntensity ri(3, 10s);
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE(ri.Allow("c", t0_ + i * 4s)) << "failure " << i;
  EXPECT_LE(ri.Recent("c", t0_ + 99 * 4s), 3);
}

TEST_F(RestartIntensityTest, ForgetResetsTheHistory) {
  RestartIntensity ri(1, 1h);
  ASSERT_TRUE(ri.Allow("c", t0_));
  ASSERT_FALSE(ri.Allow("c", t0_ + 1s));
  ri.Forget("c");
  EXPECT_EQ(ri.Recent("c", t0_ + 2s), 0);
  EXPECT_TRUE(ri.Allow("c", t0_ + 2s));
  EXPECT_FALSE(ri.Allow("c", t0_ + 3s));
  ri.Forget("never-seen");  // harmless
  EXPECT_EQ(ri.Recent("c", t0_ + 3s), 1);
}

TEST_F(RestartIntensityTest, ChildrenAreIndependent) {
  RestartIntensity ri(2, 10s);
  ASSERT_TRUE(ri.Allow("a", t0_));
  ASSERT_TRUE(ri.Allow("a", t0_ + 1s));
  ASSERT_FALSE(ri.Allow("a", t0_ + 2s));

  EXPECT_EQ(ri.Recent("b", t0_ + 2s), 0);
  EXPECT_TRUE(ri.Allow("b", t0_ + 2s));
  EXPECT_TRUE(ri.Allow("b", t0_ + 3s));
  EXPECT_FALSE(ri.Allow("b", t0_ + 4s));
  EXPECT_EQ(ri.Recent("a", t0_ + 4s), 2);

  ri.Forget("a");
  EXPECT_EQ(ri.Recent("a", t0_ + 4s), 0);
  EXPECT_EQ(ri.Recent("b", t0_ + 4s), 2) << "forgetting one child must not touch another";
}

TEST_F(RestartIntensityTest, RecentCountsRestartsInTheWindowOnly) {
  RestartIntensity ri(10, 10s);
  EXPECT_EQ(ri.Recent("c", t0_), 0);
  ri.Allow("c", t0_);
  ri.Allow("c", t0_ + 3s);
  ri.Allow("c", t0_ + 6s);
  EXPECT_EQ(ri.Recent("c", t0_ + 6s), 3);
  EXPECT_EQ(ri.Recent("c", t0_ + 9s), 3);
  EXPECT_EQ(ri.Recent("c", t0_ + 10s), 2);
  EXPECT_EQ(ri.Recent("c", t0_ + 13s), 1);
  EXPECT_EQ(ri.Recent("c", t0_ + 16s), 0);
}

TEST_F(RestartIntensityTest, ZeroMaxRestartsNeverAllows) {
  RestartIntensity ri(0, 10s);
  EXPECT_FALSE(ri.Allow("c", t0_));
  EXPECT_FALSE(ri.Allow("c", t0_ + 1h));
  EXPECT_EQ(ri.Recent("c", t0_ + 1h), 0);
}

}  // namespace
}  // namespace dsec
