// Placement (actors/controller/placement.hpp) as a pure function: which
// node takes a spec, given a snapshot of the nodes.
#include "actors/controller/placement.hpp"

#include <gmock/gmock.h>

#include <deque>

namespace dsec::placement {
namespace {

using ::testing::HasSubstr;

class PlacementTest : public ::testing::Test {
 protected:
  // A node that is up, runs `kinds`, holds `images` ("name@digest") and
  // has `sandboxes` of `slots` taken.
  NodeView& Node(const std::string& id, uint64_t slots, uint64_t sandboxes,
                 std::vector<std::string> kinds = {"fncall", "container"}, std::vector<std::string> images = {}) {
    auto& rec = recs_.emplace_back();
    rec.mutable_node()->set_id(id);
    for (const auto& k : kinds) rec.mutable_node()->add_kinds(k);
    rec.mutable_load()->set_slots(slots);
    rec.mutable_load()->set_sandboxes(sandboxes);
    for (const auto& i : images) rec.mutable_load()->add_images(i);
    nodes_.push_back(NodeView{id, &rec, true, false, 0});
    return nodes_.back();
  }
  Result<std::string> Place(const v1::SandboxSpec& spec) {
    std::vector<const drivers::Kind*> kinds;
    for (const auto& k : all_kinds_) kinds.push_back(k.get());
    return placement::Place(spec, nodes_, images_, kinds, "no node has joined");
  }
  static v1::SandboxSpec Container(const std::string& image) {
    v1::SandboxSpec s;
    s.set_kind(v1::KIND_CONTAINER);
    s.set_image(image);
    return s;
  }

  std::deque<cluster::v1::ClusterNode> recs_;  // stable addresses for the views
  std::vector<NodeView> nodes_;
  std::unordered_map<std::string, v1::ImageManifest> images_;
  std::vector<std::unique_ptr<drivers::Kind>> all_kinds_ = drivers::AllKinds();
};

TEST_F(PlacementTest, TheLargestShareOfFreeSlotsWinsSoNodesFillInProportion) {
  Node("a", 100, 50);  // half free
  Node("b", 1000, 400);  // 60% free
  Node("c", 10, 1);  // 90% free, but small
  EXPECT_EQ(*Place(Container("")), "c");
  nodes_[2].pending = 5;  // placed there since its heartbeat: 40% free now
  EXPECT_EQ(*Place(Container("")), "b");
}

TEST_F(PlacementTest, HoldingTheImageWeighsAsATenthOfTheSlots) {
  images_["py"].set_digest("sha256:1");
  Node("a", 100, 10, {"container"}, {"py@sha256:1"});  // 90% free + 0.1
  Node("b", 100, 5, {"container"});                     // 95% free, would fetch it
  EXPECT_EQ(*Place(Container("py")), "a");
  nodes_[0].pending = 10;  // 80% + 0.1 < 95%
  EXPECT_EQ(*Place(Container("py")), "b");
}

TEST_F(PlacementTest, AnotherDigestOfTheImageDoesNotCountAsHoldingIt) {
  images_["py"].set_digest("sha256:new");
  Node("a", 100, 0, {"container"}, {"py@sha256:old"});
  Node("b", 100, 1, {"container"}, {"py@sha256:new"});
  EXPECT_EQ(*Place(Container("py")), "b");
  EXPECT_TRUE(HoldsImage(*nodes_[0].rec, "py", ""));
  EXPECT_FALSE(HoldsImage(*nodes_[0].rec, "py", "sha256:new"));
  EXPECT_FALSE(HoldsImage(*nodes_[0].rec, "p", "")) << "a prefix of a name is not the name";
}

TEST_F(PlacementTest, NoneFitsAndTheAnswerNamesEachNodeAndWhy) {
  Node("down", 100, 0).up = false;
  Node("draining", 100, 0);
  recs_.back().set_draining(true);
  Node("fncall-only", 100, 0, {"fncall"});
  Node("full", 10, 9, {"container"}, {"py@sha256:1"}).pending = 1;
  Node("no-image", 100, 0, {"container"});
  auto r = Place(Container("py"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable);
  for (const char* why : {"down is down", "draining is draining", "fncall-only does not run container sandboxes",
                          "full is full (10 of 10 slots)", "no-image lacks image py"})
    EXPECT_THAT(r.status().message(), HasSubstr(why));
}

TEST_F(PlacementTest, NoNodeAtAllSaysWhatToDo) {
  auto r = Place(Container(""));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("no node has joined"));
}

TEST_F(PlacementTest, AutoIsResolvedPerNodeFromTheKindsItRuns) {
  Node("vms", 100, 60, {"microvm"});   // 40% free
  Node("fncall", 100, 50, {"fncall"});  // 50% free
  v1::SandboxSpec spec;                 // auto, process isolation: either node's kind gives it
  EXPECT_EQ(*Place(spec), "fncall");
  spec.set_isolation(v1::ISOLATION_KERNEL);  // only a microVM gives it
  EXPECT_EQ(*Place(spec), "vms");
  nodes_[0].up = false;
  auto none = Place(spec);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("fncall: no sandbox kind of this node gives kernel isolation"));
}

TEST_F(PlacementTest, ANodeInThisProcessTakesEverythingItsOwnChecksDecide) {
  Node("down", 100, 0).up = false;
  Node("self", 1, 1, {});  // full, runs nothing known: its own reasons will say so
  nodes_.back().in_process = true;
  EXPECT_EQ(*Place(Container("anything")), "self");
}

}  // namespace
}  // namespace dsec::placement
