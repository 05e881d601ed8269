// The controller in front of a node in its process, as in dsecd's role all
// (tests/support/actor_node.hpp, ActorNodeOptions::controller), on the fake
// kind: calls reach the node through it with the node's own answers, its
// listings are the node's, restartable sessions keep a copy of their log in
// the controller, and both come back after a restart. No root, no sockets.
#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>

#include "state/table.hpp"
#include "tests/support/actor_node.hpp"

namespace dsec::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ActorNodeOptions WithController() {
  ActorNodeOptions o;
  o.controller = true;
  return o;
}

class ControllerActor : public ::testing::Test {
 protected:
  v1::SessionRecord OpenSession(const std::string& name, bool restartable) {
    v1::OpenSessionRequest req;
    req.set_name(name);
    *req.mutable_spec() = ActorNode::Fake();
    req.set_restartable(restartable);
    auto r = node_.Call(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->session() : v1::SessionRecord();
  }
  // The controller's copy of step `index` of session `name`.
  Result<v1::StepRecord> Copy(const std::string& name, uint64_t index) {
    return state::TypedTable<v1::StepRecord>(node_.controller_store(), state::Table::kSteps)
        .Get(state::StepKey(name, index));
  }
  std::vector<std::string> Ran(const std::string& id) {
    std::vector<std::string> out;
    for (const auto& argv : node_.world()->ArgvLog(id)) out.push_back(argv.size() > 2 ? argv[2] : "");
    return out;
  }
  // The same request through the controller and to the node itself: the
  // controller's answer and the node's.
  template <class Req>
  std::pair<Status, Status> Both(const Req& req) {
    return {node_.Call(req).status(), node_.CallNode(req).status()};
  }
  ActorNode node_{WithController()};
};

TEST_F(ControllerActor, CreateExecGetAndDestroyGoThroughItToTheNode) {
  auto sb = node_.Create(ActorNode::Fake());
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(sb->node_id(), "node-test");
  EXPECT_EQ(sb->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_THAT(node_.world()->Ids(), ElementsAre(sb->id())) << "made by the node's driver";
  auto w = node_.Exec(sb->id(), "echo hi > /work/f; cat /work/f");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->stdout(), "hi\n");
  v1::GetSandboxRequest get;
  get.set_sandbox_id(sb->id());
  auto via = node_.Call(get);
  auto direct = node_.CallNode(get);
  ASSERT_TRUE(via.ok() && direct.ok());
  EXPECT_EQ(via->sandbox().exec_count(), 1u);
  EXPECT_EQ(direct->sandbox().exec_count(), 1u) << "the node's own record";
  v1::DestroyRequest d;
  d.set_sandbox_id(sb->id());
  ASSERT_TRUE(node_.Call(d).ok());
  EXPECT_EQ(node_.CallNode(get).status().code(), Status::Code::kNotFound) << "gone from the node";
  EXPECT_TRUE(node_.world()->Ids().empty());
}

TEST_F(ControllerActor, ItsRepliesKeepTheNodesOwnErrorTexts) {
  v1::ExecRequest unknown;
  unknown.set_sandbox_id("sb-none");
  unknown.add_argv("true");
  auto [via, direct] = Both(unknown);
  EXPECT_EQ(via.code(), Status::Code::kNotFound);
  EXPECT_THAT(via.message(), HasSubstr("sandbox 'sb-none' not found on this node"));
  EXPECT_EQ(via.message(), direct.message());

  v1::CreateRequest bad;
  *bad.mutable_spec() = ActorNode::Fake();
  bad.set_id("Bad_Id");
  std::tie(via, direct) = Both(bad);
  EXPECT_EQ(via.code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(via.message(), HasSubstr("must be 1-64 characters of [a-z0-9-]"));
  EXPECT_EQ(via.message(), direct.message());

  ASSERT_TRUE(node_.Create(ActorNode::Fake(), "gone-1").ok());
  v1::DestroyRequest d;
  d.set_sandbox_id("gone-1");
  d.set_reason("the test ended it");
  ASSERT_TRUE(node_.Call(d).ok());
  unknown.set_sandbox_id("gone-1");
  std::tie(via, direct) = Both(unknown);
  EXPECT_THAT(via.message(), HasSubstr("it ended (the test ended it)"));
  EXPECT_EQ(via.message(), direct.message());

  std::tie(via, direct) = Both(ActorNode::StepOf("no/such", 0, "true"));
  EXPECT_EQ(via.code(), Status::Code::kNotFound);
  EXPECT_THAT(via.message(), HasSubstr("session 'no/such' not found"));
  EXPECT_EQ(via.message(), direct.message());
}

TEST_F(ControllerActor, ListSandboxesThroughItEqualsTheNodes) {
  for (int i = 0; i < 12; ++i) {
    v1::SandboxSpec spec = ActorNode::Fake();
    if (i % 3 == 0) (*spec.mutable_labels())["job"] = "j1";
    ASSERT_TRUE(node_.Create(spec, "l-" + std::to_string(10 + i)).ok());
  }
  v1::PauseRequest p;
  p.set_sandbox_id("l-11");
  ASSERT_TRUE(node_.Call(p).ok());
  OpenSession("job/ctl/list", false);
  std::vector<v1::ListSandboxesRequest> asks(4);
  asks[1].set_limit(5);
  (*asks[2].mutable_labels())["job"] = "j1";
  asks[3].add_phases(v1::SANDBOX_PHASE_PAUSED);
  for (size_t i = 0; i < asks.size(); ++i) {
    auto req = asks[i];
    for (int pages = 0; pages < 5; ++pages) {
      auto via = node_.Call(req);
      auto direct = node_.CallNode(req);
      ASSERT_TRUE(via.ok() && direct.ok()) << i << ": " << via.status().ToString();
      EXPECT_GT(via->sandboxes_size(), 0) << i;
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*via, *direct))
          << i << ":\n"
          << via->DebugString() << "\nvs the node's\n"
          << direct->DebugString();
      if (via->next_page_token().empty()) break;
      req.set_page_token(via->next_page_token());
    }
  }
  EXPECT_EQ(node_.Call(asks[0])->sandboxes_size(), 13) << "the session's sandbox too";
}

TEST_F(ControllerActor, ARestartableSessionKeepsACopyOfItsLogInTheController) {
  auto rec = OpenSession("job/ctl/r1", true);
  EXPECT_TRUE(rec.restartable());
  EXPECT_EQ(rec.node_id(), "node-test");
  auto s0 = node_.Step("job/ctl/r1", 0, "echo zero");
  auto s1 = node_.Step("job/ctl/r1", 1, "echo one");
  ASSERT_TRUE(s0.ok() && s1.ok()) << s0.status().ToString() << s1.status().ToString();
  for (uint64_t i = 0; i < 2; ++i) {
    auto copy = Copy("job/ctl/r1", i);
    ASSERT_TRUE(copy.ok()) << i << ": " << copy.status().ToString();
    EXPECT_EQ(copy->index(), i);
    EXPECT_EQ(copy->result().stdout(), i == 0 ? "zero\n" : "one\n");
  }
  v1::ListStepsRequest steps;
  steps.set_session("job/ctl/r1");
  auto on_node = node_.CallNode(steps);
  ASSERT_TRUE(on_node.ok());
  EXPECT_EQ(on_node->steps_size(), 2) << "the node logs it too";
  OpenSession("job/ctl/plain", false);
  ASSERT_TRUE(node_.Step("job/ctl/plain", 0, "true").ok());
  EXPECT_EQ(Copy("job/ctl/plain", 0).status().code(), Status::Code::kNotFound) << "a plain session has no copy";
}

TEST_F(ControllerActor, AReplayedStepOfARestartableSessionIsAnsweredFromTheCopy) {
  auto rec = OpenSession("job/ctl/r2", true);
  const std::string script = "echo ran >> /work/n; cat /work/n";
  ASSERT_TRUE(node_.Step("job/ctl/r2", 0, script).ok());
  // Marks the controller's copy (and only it), to tell which log answers.
  auto copy = Copy("job/ctl/r2", 0);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  (*copy->mutable_meta()->mutable_notes())["answered_by"] = "the controller's copy";
  state::WriteBatch b;
  state::TypedTable<v1::StepRecord>(node_.controller_store(), state::Table::kSteps)
      .Put(&b, state::StepKey("job/ctl/r2", 0), *copy);
  ASSERT_TRUE(node_.controller_store()->Write(b, true).ok());
  auto replay = node_.Step("job/ctl/r2", 0, script);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(replay->fast_forwarded());
  EXPECT_EQ(replay->step().meta().notes().at("answered_by"), "the controller's copy");
  EXPECT_EQ(replay->step().result().stdout(), "ran\n");
  EXPECT_EQ(Ran(rec.sandboxes(0).id()).size(), 1u) << "not run again";
  auto differs = node_.Step("job/ctl/r2", 0, "echo other");
  EXPECT_EQ(differs.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(differs.status().message(), HasSubstr("session job/ctl/r2 step 0 is logged with another request"));
}

TEST_F(ControllerActor, AfterARestartCallsReachTheNodeAgain) {
  ASSERT_TRUE(node_.Create(ActorNode::Fake(), "keep-1").ok());
  ASSERT_TRUE(node_.Exec("keep-1", "echo kept > /work/f").ok());
  auto rec = OpenSession("job/ctl/r3", true);
  ASSERT_TRUE(node_.Step("job/ctl/r3", 0, "echo s > /work/s").ok());
  node_.Restart();
  auto got = node_.Get("keep-1");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_EQ(node_.Exec("keep-1", "cat /work/f")->stdout(), "kept\n");
  EXPECT_TRUE(node_.Step("job/ctl/r3", 0, "echo s > /work/s")->fast_forwarded()) << "from the copy kept";
  auto next = node_.Step("job/ctl/r3", 1, "cat /work/s");
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "s\n") << "in the session's sandbox on the node";
  EXPECT_TRUE(Copy("job/ctl/r3", 1).ok()) << "copied as before";
  auto list = node_.Call(v1::ListSandboxesRequest());
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->sandboxes_size(), 2);
  EXPECT_EQ(node_.Admin("status").value("nodes_up", -1), 1) << "the node joined the new controller";
}

}  // namespace
}  // namespace dsec::testing
