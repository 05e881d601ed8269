// The session actor, through the node, on the fake kind (tests/support/
// actor_node.hpp): its open and its sandboxes, the trajectory log (steps in
// order, replays, gaps, annotations, pages), its close, its lease, its
// crashes and restarts, and annotation batches. No root, no processes.
#include <gmock/gmock.h>

#include <map>
#include <memory>

#include "state/table.hpp"
#include "tests/support/actor_node.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

class SessionActor : public ::testing::Test {
 protected:
  // An open of `name` on the fake, with an "eval" sandbox beside the agent's.
  static v1::OpenSessionRequest OpenReq(const std::string& name, bool eval = false) {
    v1::OpenSessionRequest req;
    req.set_name(name);
    *req.mutable_spec() = ActorNode::Fake();
    if (eval) {
      auto* more = req.add_more_sandboxes();
      more->set_role("eval");
      *more->mutable_spec() = ActorNode::Fake();
    }
    return req;
  }
  v1::SessionRecord Open(const std::string& name, bool eval = false) {
    auto r = node_.Call(OpenReq(name, eval));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->session() : v1::SessionRecord();
  }
  static std::string IdOf(const v1::SessionRecord& rec, const std::string& role) {
    for (const auto& sb : rec.sandboxes())
      if (sb.role() == role) return sb.id();
    return "";
  }
  // The script (argv[2]) of every exec the fake ran in sandbox `id`, in order.
  std::vector<std::string> Ran(const std::string& id) {
    std::vector<std::string> out;
    for (const auto& argv : node_.world()->ArgvLog(id)) out.push_back(argv.size() > 2 ? argv[2] : "");
    return out;
  }
  v1::AnnotateStepRequest AnnotateReq(const std::string& name, uint64_t index) {
    v1::AnnotateStepRequest req;
    req.set_session(name);
    req.set_index(index);
    return req;
  }
  Result<v1::StepsReply> Steps(const std::string& name, uint64_t from = 0, uint32_t limit = 0) {
    v1::ListStepsRequest req;
    req.set_session(name);
    req.set_from(from);
    req.set_limit(limit);
    return node_.Call(req);
  }
  Result<v1::SessionReply> Close(const std::string& name, const std::string& reason = "") {
    v1::CloseSessionRequest req;
    req.set_name(name);
    req.set_reason(reason);
    return node_.Call(req);
  }
  // AnnotateResults sent to `client` until `n` calls are answered (or 10 s).
  static std::map<uint64_t, v1::StepReply> Collect(caf::scoped_actor& client, size_t n) {
    std::map<uint64_t, v1::StepReply> got;
    bool timed_out = false;
    while (got.size() < n && !timed_out)
      client->receive(
          [&](v1::AnnotateResults& r) {
            for (auto& one : *r.mutable_results()) got[one.call_id()] = std::move(*one.mutable_reply());
          },
          caf::after(std::chrono::seconds(10)) >> [&] { timed_out = true; });
    return got;
  }
  static void AddCall(v1::AnnotateBatch* batch, uint64_t id, const std::string& session, uint64_t index,
                      const v1::StepMeta& meta) {
    auto* call = batch->add_calls();
    call->set_call_id(id);
    call->mutable_request()->set_session(session);
    call->mutable_request()->set_index(index);
    *call->mutable_request()->mutable_meta() = meta;
  }
  ActorNode node_;
};

TEST_F(SessionActor, OpenCreatesItsAgentAndEvalSandboxesOwnedByTheSession) {
  auto rec = Open("job/p1/s1", true);
  EXPECT_EQ(rec.phase(), v1::SESSION_PHASE_OPEN);
  EXPECT_TRUE(rec.ready());
  ASSERT_EQ(rec.sandboxes_size(), 2);
  EXPECT_EQ(rec.sandboxes(0).role(), "agent");
  EXPECT_EQ(rec.sandboxes(1).role(), "eval");
  for (const auto& s : rec.sandboxes()) {
    auto sb = node_.Get(s.id());
    ASSERT_TRUE(sb.ok()) << s.role() << ": " << sb.status().ToString();
    EXPECT_EQ(sb->phase(), v1::SANDBOX_PHASE_RUNNING);
    EXPECT_EQ(sb->session(), "job/p1/s1") << "the session's own";
    EXPECT_EQ(sb->ttl_deadline_ms(), 0) << "it ends with the session, not by a ttl";
    EXPECT_TRUE(sb->owner().empty());
  }
  EXPECT_THAT(node_.world()->Ids(), UnorderedElementsAre(IdOf(rec, "agent"), IdOf(rec, "eval")));
  auto stored = state::TypedTable<v1::SessionRecord>(node_.store(), state::Table::kSessions).Get("job/p1/s1");
  ASSERT_TRUE(stored.ok()) << "durable before the answer";
  EXPECT_TRUE(stored->ready());
}

TEST_F(SessionActor, ReopeningWithTheSameSpecsIsIdempotent) {
  auto first = Open("job/p1/s2", true);
  ASSERT_TRUE(node_.Step("job/p1/s2", 0, "echo hi").ok());
  auto again = node_.Call(OpenReq("job/p1/s2", true));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(IdOf(again->session(), "agent"), IdOf(first, "agent"));
  EXPECT_EQ(IdOf(again->session(), "eval"), IdOf(first, "eval"));
  EXPECT_EQ(again->session().step_count(), 1u) << "the same session, its log kept";
  EXPECT_EQ(node_.world()->Ids().size(), 2u) << "no sandbox made twice";
}

TEST_F(SessionActor, ReopeningWithOtherSpecsIsRefusedNamingTheSession) {
  auto first = Open("job/p1/s3", true);
  auto fewer = node_.Call(OpenReq("job/p1/s3", false));
  EXPECT_EQ(fewer.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(fewer.status().message(), HasSubstr("session job/p1/s3 already exists with different specs"));
  auto other = OpenReq("job/p1/s3", true);
  (*other.mutable_spec()->mutable_labels())["k"] = "v";
  EXPECT_EQ(node_.Call(other).status().code(), Status::Code::kFailedPrecondition);
  auto rec = node_.GetSession("job/p1/s3");
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->sandboxes_size(), 2) << "unchanged";
  EXPECT_EQ(IdOf(*rec, "agent"), IdOf(first, "agent"));
}

TEST_F(SessionActor, StepsRunInOrderInTheSessionsSandbox) {
  auto rec = Open("job/p2/s1");
  const std::vector<std::string> scripts = {"echo a >> /work/log", "echo b >> /work/log", "true"};
  for (uint64_t i = 0; i < scripts.size(); ++i) {
    auto r = node_.Step("job/p2/s1", i, scripts[i]);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    EXPECT_EQ(r->step().index(), i);
    EXPECT_FALSE(r->fast_forwarded());
  }
  EXPECT_EQ(node_.Step("job/p2/s1", 3, "cat /work/log")->step().result().stdout(), "a\nb\n")
      << "each step sees the ones before";
  auto ran = Ran(IdOf(rec, "agent"));
  ASSERT_EQ(ran.size(), 4u);
  ran.pop_back();
  EXPECT_EQ(ran, scripts) << "in the order of their indices";
  EXPECT_EQ(node_.GetSession("job/p2/s1")->step_count(), 4u);
}

TEST_F(SessionActor, EachRoleRunsInItsOwnSandbox) {
  auto rec = Open("job/p2/s2", true);
  auto in_eval = node_.Step("job/p2/s2", 0, "echo e > /work/e", "eval");
  ASSERT_TRUE(in_eval.ok()) << in_eval.status().ToString();
  EXPECT_EQ(in_eval->step().sandbox(), "eval");
  auto in_agent = node_.Step("job/p2/s2", 1, "cat /work/e");
  ASSERT_TRUE(in_agent.ok());
  EXPECT_NE(in_agent->step().result().exit_code(), 0) << "the agent's sandbox has no /work/e";
  EXPECT_EQ(Ran(IdOf(rec, "eval")), std::vector<std::string>{"echo e > /work/e"});
  EXPECT_EQ(Ran(IdOf(rec, "agent")), std::vector<std::string>{"cat /work/e"});
}

TEST_F(SessionActor, AStepInARoleTheSessionLacksIsRefusedNamingItsRoles) {
  Open("job/p2/s3", true);
  auto r = node_.Step("job/p2/s3", 0, "true", "judge");
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("session job/p2/s3 step 0: the session has no sandbox 'judge'"));
  EXPECT_THAT(r.status().message(), HasSubstr("(it has: agent, eval)"));
  EXPECT_EQ(node_.GetSession("job/p2/s3")->step_count(), 0u);
}

TEST_F(SessionActor, AReplayedStepIsAnsweredFromTheLogWithoutRunningAgain) {
  auto rec = Open("job/p3/s1");
  const std::string script = "echo ran >> /work/n; cat /work/n";
  auto first = node_.Step("job/p3/s1", 0, script);
  ASSERT_TRUE(first.ok());
  auto replay = node_.Step("job/p3/s1", 0, script);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(replay->fast_forwarded());
  EXPECT_EQ(replay->step().result().stdout(), "ran\n");
  EXPECT_EQ(replay->step().finished_ms(), first->step().finished_ms()) << "the logged step itself";
  EXPECT_EQ(Ran(IdOf(rec, "agent")).size(), 1u) << "not run again";
  auto next = node_.Step("job/p3/s1", 1, script);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->step().result().stdout(), "ran\nran\n");
}

TEST_F(SessionActor, AReplayThatDiffersIsRefusedNamingTheStep) {
  auto rec = Open("job/p3/s2", true);
  ASSERT_TRUE(node_.Step("job/p3/s2", 0, "echo a").ok());
  auto argv = node_.Step("job/p3/s2", 0, "echo b");
  EXPECT_EQ(argv.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(argv.status().message(), HasSubstr("session job/p3/s2 step 0: the request differs from the logged one"));
  EXPECT_THAT(argv.status().message(), HasSubstr("'echo b'"));
  auto role = node_.Step("job/p3/s2", 0, "echo a", "eval");
  EXPECT_EQ(role.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(role.status().message(), HasSubstr("sandbox 'eval' vs logged 'agent'"));
  EXPECT_EQ(Ran(IdOf(rec, "agent")).size(), 1u);
  EXPECT_TRUE(Ran(IdOf(rec, "eval")).empty());
}

TEST_F(SessionActor, AStepAheadOfTheLogIsRefusedAsAGap) {
  auto rec = Open("job/p3/s3");
  ASSERT_TRUE(node_.Step("job/p3/s3", 0, "true").ok());
  auto gap = node_.Step("job/p3/s3", 2, "true");
  EXPECT_EQ(gap.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(gap.status().message(), HasSubstr("session job/p3/s3: step 2 is ahead of the log"));
  EXPECT_THAT(gap.status().message(), HasSubstr("the next step is 1"));
  EXPECT_EQ(Ran(IdOf(rec, "agent")).size(), 1u);
  EXPECT_EQ(node_.GetSession("job/p3/s3")->step_count(), 1u);
}

TEST_F(SessionActor, AnnotateSetsRewardAndTokensAndMergesNotes) {
  Open("job/p4/s1");
  ASSERT_TRUE(node_.Step("job/p4/s1", 0, "true").ok());
  auto first = AnnotateReq("job/p4/s1", 0);
  first.mutable_meta()->set_reward(1.5);
  first.mutable_meta()->set_prompt_tokens(10);
  (*first.mutable_meta()->mutable_notes())["a"] = "1";
  ASSERT_TRUE(node_.Call(first).ok());
  auto second = AnnotateReq("job/p4/s1", 0);
  second.mutable_meta()->set_completion_tokens(5);
  (*second.mutable_meta()->mutable_notes())["b"] = "2";
  auto r = node_.Call(second);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& meta : {r->step().meta(), Steps("job/p4/s1")->steps(0).meta()}) {
    EXPECT_EQ(meta.reward(), 1.5) << "kept: the second annotation set none";
    EXPECT_EQ(meta.prompt_tokens(), 10u);
    EXPECT_EQ(meta.completion_tokens(), 5u);
    EXPECT_EQ(meta.notes().size(), 2u) << "notes merged";
    EXPECT_EQ(meta.notes().at("a"), "1");
    EXPECT_EQ(meta.notes().at("b"), "2");
  }
}

TEST_F(SessionActor, AnnotatingAStepNotInTheLogIsNotFoundNamingIt) {
  Open("job/p4/s2");
  ASSERT_TRUE(node_.Step("job/p4/s2", 0, "true").ok());
  auto r = node_.Call(AnnotateReq("job/p4/s2", 3));
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("session job/p4/s2 step 3 is not in the log (1 step(s) logged)"));
}

TEST_F(SessionActor, ListStepsPagesThroughTheLog) {
  Open("job/p4/s3");
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(node_.Step("job/p4/s3", i, "echo " + std::to_string(i)).ok());
  std::vector<uint64_t> seen;
  for (uint64_t from = 0; from < 5;) {
    auto page = Steps("job/p4/s3", from, 2);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    ASSERT_GT(page->steps_size(), 0);
    EXPECT_LE(page->steps_size(), 2);
    EXPECT_EQ(page->session().step_count(), 5u);
    for (const auto& s : page->steps()) {
      EXPECT_EQ(s.result().stdout(), std::to_string(s.index()) + "\n");
      seen.push_back(s.index());
    }
    from = seen.back() + 1;
  }
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Steps("job/p4/s3", 5, 2)->steps_size(), 0) << "past the end: an empty page";
}

TEST_F(SessionActor, CloseRemovesItsSandboxesAndKeepsTheLog) {
  auto rec = Open("job/p5/s1", true);
  ASSERT_TRUE(node_.Step("job/p5/s1", 0, "echo kept").ok());
  auto closed = Close("job/p5/s1", "the rollout is done");
  ASSERT_TRUE(closed.ok()) << closed.status().ToString();
  EXPECT_EQ(closed->session().phase(), v1::SESSION_PHASE_CLOSED);
  EXPECT_EQ(closed->session().close_reason(), "the rollout is done");
  for (const auto& role : {"agent", "eval"})
    EXPECT_EQ(node_.Get(IdOf(rec, role)).status().code(), Status::Code::kNotFound) << role;
  EXPECT_TRUE(node_.world()->Ids().empty()) << "the driver removed both boxes";
  auto log = Steps("job/p5/s1");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->steps_size(), 1);
  EXPECT_EQ(log->steps(0).result().stdout(), "kept\n");
}

TEST_F(SessionActor, AClosedSessionIsAnsweredFromTheStore) {
  Open("job/p5/s2");
  ASSERT_TRUE(node_.Step("job/p5/s2", 0, "true").ok());
  ASSERT_TRUE(node_.Step("job/p5/s2", 1, "true").ok());
  auto closed = Close("job/p5/s2", "first close");
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(node_.Admin("status").value("sessions", -1), 0) << "its actor has quit";
  auto got = node_.GetSession("job/p5/s2");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->phase(), v1::SESSION_PHASE_CLOSED);
  EXPECT_EQ(got->step_count(), 2u);
  EXPECT_EQ(Steps("job/p5/s2")->steps_size(), 2);
  auto again = Close("job/p5/s2", "second close");
  ASSERT_TRUE(again.ok()) << "closing a closed session is a no-op";
  EXPECT_EQ(again->session().close_reason(), "first close");
  EXPECT_EQ(again->session().closed_ms(), closed->session().closed_ms());
}

TEST_F(SessionActor, StepsAnnotationsAndOpensAfterCloseAreRefusedNamingIt) {
  Open("job/p5/s3");
  ASSERT_TRUE(node_.Step("job/p5/s3", 0, "true").ok());
  ASSERT_TRUE(Close("job/p5/s3", "enough").ok());
  auto step = node_.Step("job/p5/s3", 1, "true");
  EXPECT_EQ(step.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(step.status().message(), HasSubstr("session job/p5/s3 is closed (enough)"));
  auto note = AnnotateReq("job/p5/s3", 0);
  note.mutable_meta()->set_reward(1);
  EXPECT_THAT(node_.Call(note).status().message(), HasSubstr("session job/p5/s3 is closed"));
  auto reopen = node_.Call(OpenReq("job/p5/s3"));
  EXPECT_EQ(reopen.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(reopen.status().message(), HasSubstr("open a new session name"));
  EXPECT_TRUE(node_.world()->Ids().empty()) << "nothing made again";
  EXPECT_EQ(node_.GetSession("job/p5/s3")->step_count(), 1u);
}

TEST_F(SessionActor, AStepWhoseLogWriteFailsIsAnsweredWithTheErrorAndLeftOutOfTheLog) {
  auto rec = Open("job/p6/s1");
  node_.store_faults().FailWritesTouching(state::Table::kSteps, state::StepKey("job/p6/s1", 0),
                                          Status::Internal("the disk is full"));
  auto failed = node_.Step("job/p6/s1", 0, "echo once >> /work/runs; cat /work/runs");
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("session job/p6/s1 step 0 ran but could not be logged"));
  EXPECT_THAT(failed.status().message(), HasSubstr("the disk is full"));
  node_.store_faults().ClearFaults();
  EXPECT_EQ(node_.GetSession("job/p6/s1")->step_count(), 0u);
  EXPECT_EQ(Steps("job/p6/s1")->steps_size(), 0);
  auto resent = node_.Step("job/p6/s1", 0, "echo once >> /work/runs; cat /work/runs");
  ASSERT_TRUE(resent.ok()) << resent.status().ToString();
  EXPECT_FALSE(resent->fast_forwarded()) << "it was not in the log: it runs";
  EXPECT_EQ(Ran(IdOf(rec, "agent")).size(), 2u);
  EXPECT_EQ(node_.GetSession("job/p6/s1")->step_count(), 1u);
}

TEST_F(SessionActor, ASessionOutlivesItsTrainerByItsLeaseThenCloses) {
  auto trainer = std::make_unique<caf::scoped_actor>(node_.sys());
  auto req = OpenReq("job/p7/s1");
  req.set_lease_s(1);
  auto open = node_.CallAs(*trainer, req);
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  ASSERT_TRUE(node_.CallAs(*trainer, ActorNode::StepOf("job/p7/s1", 0, "true")).ok());
  auto gone = std::chrono::steady_clock::now();
  trainer.reset();  // the trainer's SDK actor goes: the lease starts
  EXPECT_EQ(node_.GetSession("job/p7/s1")->phase(), v1::SESSION_PHASE_OPEN) << "not at once";
  // (A get that meets the actor as it quits is refused: CAF drops what is queued to a quitting actor.)
  ASSERT_TRUE(node_.WaitFor(
      [&] {
        auto r = node_.GetSession("job/p7/s1");
        return r.ok() && r->phase() == v1::SESSION_PHASE_CLOSED;
      },
      std::chrono::seconds(5)));
  EXPECT_GE(std::chrono::steady_clock::now() - gone, std::chrono::milliseconds(950)) << "not before its lease";
  auto rec = node_.GetSession("job/p7/s1");
  EXPECT_THAT(rec->close_reason(), HasSubstr("lease expired: no trainer attached for 1 s"));
  EXPECT_EQ(rec->step_count(), 1u) << "its log stays";
  EXPECT_EQ(node_.Get(IdOf(open->session(), "agent")).status().code(), Status::Code::kNotFound);
}

TEST_F(SessionActor, ATrainerThatComesBackWithinTheLeaseGoesOn) {
  auto first = std::make_unique<caf::scoped_actor>(node_.sys());
  auto req = OpenReq("job/p7/s2");
  req.set_lease_s(1);
  ASSERT_TRUE(node_.CallAs(*first, req).ok());
  ASSERT_TRUE(node_.CallAs(*first, ActorNode::StepOf("job/p7/s2", 0, "echo a > /work/f")).ok());
  first.reset();
  caf::scoped_actor second{node_.sys()};
  auto back = node_.CallAs(second, ActorNode::StepOf("job/p7/s2", 1, "cat /work/f"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->step().result().stdout(), "a\n");
  // Past the first trainer's lease: the second one holds it open.
  EXPECT_FALSE(node_.WaitFor(
      [&] {
        auto r = node_.GetSession("job/p7/s2");
        return !r.ok() || r->phase() != v1::SESSION_PHASE_OPEN;
      },
      std::chrono::milliseconds(1300)));
  EXPECT_TRUE(node_.CallAs(second, ActorNode::StepOf("job/p7/s2", 2, "true")).ok());
}

TEST_F(SessionActor, ACrashedSessionActorIsRestartedFromItsLog) {
  auto rec = Open("job/p8/s1");
  ASSERT_TRUE(node_.Step("job/p8/s1", 0, "echo kept > /work/f").ok());
  ASSERT_TRUE(node_.Admin("crash job/p8/s1").value("ok", false));
  ASSERT_TRUE(node_.WaitFor([&] {
    auto r = node_.GetSession("job/p8/s1");
    return r.ok() && r->restarts() == 1;
  }));
  auto rec2 = node_.GetSession("job/p8/s1");
  EXPECT_EQ(rec2->phase(), v1::SESSION_PHASE_OPEN);
  EXPECT_EQ(rec2->step_count(), 1u);
  EXPECT_EQ(IdOf(*rec2, "agent"), IdOf(rec, "agent")) << "the same sandbox";
  EXPECT_TRUE(node_.Step("job/p8/s1", 0, "echo kept > /work/f")->fast_forwarded());
  auto next = node_.Step("job/p8/s1", 1, "cat /work/f");
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "kept\n");
  EXPECT_EQ(Ran(IdOf(rec, "agent")).size(), 2u);
}

TEST_F(SessionActor, ARestartedNodeBringsTheSessionBackWithItsLogAndItsFiles) {
  auto rec = Open("job/p8/s2", true);
  ASSERT_TRUE(node_.Step("job/p8/s2", 0, "echo kept > /work/f").ok());
  node_.Restart();
  auto back = node_.GetSession("job/p8/s2");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->phase(), v1::SESSION_PHASE_OPEN);
  EXPECT_EQ(back->step_count(), 1u);
  EXPECT_EQ(Steps("job/p8/s2")->steps_size(), 1);
  EXPECT_TRUE(node_.Step("job/p8/s2", 0, "echo kept > /work/f")->fast_forwarded());
  auto next = node_.Step("job/p8/s2", 1, "cat /work/f");
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "kept\n");
  EXPECT_EQ(node_.world()->Ids().size(), 2u) << "re-adopted, not made again";
}

TEST_F(SessionActor, SessionNamesFollowTheRulesWithClearErrors) {
  const std::pair<std::string, std::string> bad[] = {
      {"", "session name is empty"},
      {std::string(513, 'a'), "is 513 bytes; the limit is 512"},
      {"has space", "must be characters of [A-Za-z0-9._/:@+=-]"},
      {"semi;colon", "must be characters of"},
      {"-dash", "not starting with '-' or '/'"},
      {"/root", "not starting with '-' or '/'"},
  };
  for (const auto& [name, why] : bad) {
    auto r = node_.Call(OpenReq(name));
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << name;
    EXPECT_THAT(r.status().message(), HasSubstr(why)) << name;
  }
  EXPECT_TRUE(node_.world()->Ids().empty()) << "nothing made for a refused name";
  EXPECT_EQ(node_.Admin("sessions").value("listed", -1), 0);
  EXPECT_EQ(Open("job-1/prompt.2/sample:3@a+b=c").phase(), v1::SESSION_PHASE_OPEN);
  EXPECT_EQ(Open(std::string(512, 'a')).phase(), v1::SESSION_PHASE_OPEN) << "512 bytes is the limit, not over it";
}

TEST_F(SessionActor, SandboxRolesAndLifetimesAreCheckedNamingTheRole) {
  auto upper = OpenReq("job/p9/s1", true);
  upper.mutable_more_sandboxes(0)->set_role("Eval");
  EXPECT_THAT(node_.Call(upper).status().message(), HasSubstr("sandbox role 'Eval' must be 1-32 characters"));
  auto twice = OpenReq("job/p9/s1", true);
  twice.mutable_more_sandboxes(0)->set_role("agent");
  EXPECT_THAT(node_.Call(twice).status().message(), HasSubstr("sandbox role 'agent' is given twice"));
  auto ttl = OpenReq("job/p9/s1", true);
  ttl.mutable_more_sandboxes(0)->mutable_spec()->set_ttl_s(60);
  auto r = node_.Call(ttl);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("sandbox 'eval' asks for a ttl or an idle timeout"));
  auto many = OpenReq("job/p9/s1");
  for (int i = 0; i < 8; ++i) {
    auto* more = many.add_more_sandboxes();
    more->set_role("r" + std::to_string(i));
    *more->mutable_spec() = ActorNode::Fake();
  }
  EXPECT_THAT(node_.Call(many).status().message(), HasSubstr("9 sandboxes; the limit is 8"));
  EXPECT_TRUE(node_.world()->Ids().empty());
}

TEST_F(SessionActor, AnOpenWhoseSandboxCannotBeMadeLeavesNothingAndMayBeRetried) {
  node_.driver_faults().FailNext(drivers::FaultDriver::Op::kCreate, 1, Status::Unavailable("no room"));
  auto r = node_.Call(OpenReq("job/p9/s2", true));
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("session job/p9/s2"));
  EXPECT_THAT(r.status().message(), HasSubstr("no room"));
  EXPECT_TRUE(node_.world()->Ids().empty()) << "the sandbox that was made went again";
  EXPECT_FALSE(state::TypedTable<v1::SessionRecord>(node_.store(), state::Table::kSessions).Get("job/p9/s2").ok());
  EXPECT_EQ(Open("job/p9/s2", true).sandboxes_size(), 2);
}

TEST_F(SessionActor, AnnotateBatchAnswersEachCallToItsSender) {
  Open("job/pa/s1");
  ASSERT_TRUE(node_.Step("job/pa/s1", 0, "true").ok());
  ASSERT_TRUE(node_.Step("job/pa/s1", 1, "true").ok());
  v1::StepMeta reward, note;
  reward.set_reward(0.25);
  (*note.mutable_notes())["judge"] = "ok";
  v1::AnnotateBatch batch;
  AddCall(&batch, 7, "job/pa/s1", 0, reward);
  AddCall(&batch, 8, "job/pa/s1", 1, note);
  AddCall(&batch, 9, "job/pa/s1", 5, reward);
  AddCall(&batch, 10, "no/such", 0, reward);
  caf::scoped_actor client{node_.sys()};
  client->send(node_.entry(), batch);
  auto got = Collect(client, 4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[7].status().code(), v1::Status::OK);
  EXPECT_EQ(got[7].step().meta().reward(), 0.25);
  EXPECT_EQ(got[8].step().meta().notes().at("judge"), "ok");
  EXPECT_EQ(got[9].status().code(), v1::Status::NOT_FOUND);
  EXPECT_THAT(got[9].status().message(), HasSubstr("session job/pa/s1 step 5 is not in the log"));
  EXPECT_EQ(got[10].status().code(), v1::Status::NOT_FOUND);
  EXPECT_THAT(got[10].status().message(), HasSubstr("session 'no/such' not found"));
  auto log = Steps("job/pa/s1");
  EXPECT_EQ(log->steps(0).meta().reward(), 0.25) << "logged";
  EXPECT_EQ(log->steps(1).meta().notes().at("judge"), "ok");
  bool stray = false;
  node_.trainer()->receive([&](v1::AnnotateResults&) { stray = true; },
                           caf::after(std::chrono::milliseconds(0)) >> [] {});
  EXPECT_FALSE(stray) << "the answers go to the batch's sender only";
}

TEST_F(SessionActor, ABatchOverTheLimitOf4096CallsIsRefusedCallByCall) {
  Open("job/pa/s2");
  ASSERT_TRUE(node_.Step("job/pa/s2", 0, "true").ok());
  v1::StepMeta meta;
  meta.set_prompt_tokens(1);
  v1::AnnotateBatch over, at;
  for (uint64_t i = 0; i < 4097; ++i) AddCall(&over, i, "job/pa/s2", 0, meta);
  for (uint64_t i = 0; i < 4096; ++i) AddCall(&at, i, "job/pa/s2", 0, meta);
  caf::scoped_actor client{node_.sys()};
  client->send(node_.entry(), over);
  auto refused = Collect(client, 4097);
  ASSERT_EQ(refused.size(), 4097u) << "every call answered";
  for (const auto& [id, r] : refused) {
    ASSERT_EQ(r.status().code(), v1::Status::INVALID_ARGUMENT) << id;
    ASSERT_THAT(r.status().message(), HasSubstr("an AnnotateBatch of 4097 calls is over the limit of 4096")) << id;
  }
  EXPECT_EQ(Steps("job/pa/s2")->steps(0).meta().prompt_tokens(), 0u) << "none carried out";
  client->send(node_.entry(), at);
  auto done = Collect(client, 4096);
  ASSERT_EQ(done.size(), 4096u);
  for (const auto& [id, r] : done) ASSERT_EQ(r.status().code(), v1::Status::OK) << id << r.status().message();
  EXPECT_EQ(Steps("job/pa/s2")->steps(0).meta().prompt_tokens(), 1u);
}

}  // namespace
}  // namespace dsec::testing
