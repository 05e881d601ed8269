// The router's directory: which actor serves a sandbox or session, why an
// ended sandbox ended, and which SDK client owns what. Real actors (of a
// real actor system) give the addresses; nothing is sent to them.
#include "actors/node/directory.hpp"

#include <gtest/gtest.h>

#include <caf/all.hpp>

namespace dsec {
namespace {

class DirectoryTest : public ::testing::Test {
 protected:
  // A live actor of any behaviour, as the handle type the directory keeps.
  template <class Handle>
  Handle NewActor() {
    auto a = sys_.spawn([]() -> caf::behavior { return {[](int) {}}; });
    keep_.push_back(a);
    return caf::actor_cast<Handle>(a);
  }
  void TearDown() override {
    for (auto& a : keep_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  caf::actor_system_config cfg_;
  caf::actor_system sys_{cfg_};
  std::vector<caf::actor> keep_;
  Directory dir_;
};

TEST_F(DirectoryTest, ADeadActorsEntryGivesWayOnlyToItsOwnId) {
  auto old_actor = NewActor<sandbox_actor>();
  auto restarted = NewActor<sandbox_actor>();
  dir_.PutSandbox("sb-1", old_actor);
  dir_.PutSandbox("sb-1", restarted);  // restarted from its checkpoint before the old one's down arrived
  auto id = dir_.DropSandboxActor(old_actor.address());
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, "sb-1");
  EXPECT_EQ(dir_.FindSandbox("sb-1"), restarted) << "the newer actor by that id stays";
  EXPECT_FALSE(dir_.DropSandboxActor(old_actor.address()).has_value()) << "its address is forgotten";
  EXPECT_EQ(dir_.DropSandboxActor(restarted.address()), std::optional<std::string>("sb-1"));
  EXPECT_FALSE(dir_.FindSandbox("sb-1"));
  EXPECT_TRUE(dir_.sandboxes().empty());
}

TEST_F(DirectoryTest, ForgettingASessionForgetsItsActorsAddressToo) {
  auto s = NewActor<session_actor>();
  dir_.PutSession("task/1", s);
  EXPECT_EQ(dir_.FindSession("task/1"), s);
  dir_.ForgetSession("task/1");
  EXPECT_FALSE(dir_.FindSession("task/1"));
  EXPECT_FALSE(dir_.DropSessionActor(s.address()).has_value()) << "its later down is not about a session";
}

TEST_F(DirectoryTest, RemembersWhyTheLastSandboxesEndedAndNoMore) {
  for (size_t i = 0; i < Directory::kMaxEnded + 10; ++i) dir_.NoteEnded("sb-" + std::to_string(i), "ttl");
  EXPECT_EQ(dir_.EndedWhy("sb-0"), nullptr) << "the oldest are forgotten";
  EXPECT_EQ(dir_.EndedWhy("sb-9"), nullptr);
  ASSERT_NE(dir_.EndedWhy("sb-10"), nullptr);
  EXPECT_EQ(*dir_.EndedWhy("sb-10"), "ttl");
  dir_.NoteEnded("sb-10", "destroyed");
  EXPECT_EQ(*dir_.EndedWhy("sb-10"), "destroyed") << "the last reason wins";
  dir_.Reuse("sb-10");
  EXPECT_EQ(dir_.EndedWhy("sb-10"), nullptr) << "a new sandbox by that id has not ended";
}

TEST_F(DirectoryTest, AnOwnerIsGoneFromItsLastConnectionUntilItComesBackOrOwnsNothing) {
  auto conn1 = NewActor<caf::actor>(), conn2 = NewActor<caf::actor>();
  dir_.Claim("client1", "sb-a", 100);
  EXPECT_EQ(dir_.gone_since().at("client1"), 100) << "claimed while not connected";
  bool first = false;
  ASSERT_TRUE(dir_.AddConnection(conn1.address(), "client1", &first));
  EXPECT_TRUE(first);
  EXPECT_EQ(dir_.gone_since().count("client1"), 0u);
  EXPECT_FALSE(dir_.AddConnection(conn1.address(), "client1", &first)) << "a second hello of one connection";
  ASSERT_TRUE(dir_.AddConnection(conn2.address(), "client1", &first));
  EXPECT_FALSE(first);
  dir_.Claim("client1", "sb-b", 200);
  EXPECT_TRUE(dir_.Connected("client1"));
  bool last = false;
  EXPECT_EQ(dir_.DropConnection(conn1.address(), 300, &last), std::optional<std::string>("client1"));
  EXPECT_FALSE(last);
  EXPECT_EQ(dir_.gone_since().count("client1"), 0u) << "one connection is left";
  EXPECT_EQ(dir_.DropConnection(conn2.address(), 400, &last), std::optional<std::string>("client1"));
  EXPECT_TRUE(last);
  EXPECT_FALSE(dir_.Connected("client1"));
  EXPECT_EQ(dir_.gone_since().at("client1"), 400);
  ASSERT_NE(dir_.Owned("client1"), nullptr);
  EXPECT_EQ(dir_.Owned("client1")->size(), 2u);
  ASSERT_NE(dir_.OwnerOf("sb-a"), nullptr);
  EXPECT_EQ(*dir_.OwnerOf("sb-a"), "client1");
  dir_.Unclaim("sb-a");
  EXPECT_EQ(dir_.OwnerOf("sb-a"), nullptr);
  EXPECT_EQ(dir_.gone_since().count("client1"), 1u) << "it still owns sb-b";
  dir_.Unclaim("sb-b");
  EXPECT_EQ(dir_.Owned("client1"), nullptr);
  EXPECT_EQ(dir_.gone_since().count("client1"), 0u) << "an owner of nothing is not waited for";
  EXPECT_FALSE(dir_.DropConnection(conn1.address(), 500, &last).has_value()) << "not a connection any more";
}

TEST_F(DirectoryTest, AClaimWithoutOwnerIsNoClaim) {
  dir_.Claim("", "sb-a", 100);
  EXPECT_EQ(dir_.OwnerOf("sb-a"), nullptr);
  EXPECT_TRUE(dir_.gone_since().empty());
  EXPECT_FALSE(dir_.Connected(""));
}

}  // namespace
}  // namespace dsec
