// The session actor's in-memory view of its log (the step cache) against the
// store it fronts: a session actor in this process on a MemStore behind a
// FaultStore, restored from a record with one logged step, driven with real
// CAF requests. Replays must answer what is on disk, also after a write
// failed.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <future>
#include <memory>

#include "actors/node/context.hpp"
#include "actors/node/session.hpp"
#include "wire/wire.hpp"
#include "dsec/status_proto.hpp"
#include "state/fault_store.hpp"
#include "state/group_commit.hpp"
#include "state/table.hpp"

namespace dsec {
namespace {

constexpr const char* kName = "unit/log/0";

v1::ExecRequest True() {
  v1::ExecRequest e;
  e.add_argv("/bin/true");
  return e;
}

class SessionLog : public ::testing::Test {
 protected:
  void SetUp() override {
    ConfigureCaf(cfg_, CafOptions{});
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    ctx_ = std::make_shared<NodeContext>();
    ctx_->store = &fault_;
    ctx_->committer = &committer_;
    ctx_->log = spdlog::default_logger();
    ctx_->kinds = &kinds_;  // none: the session's steps are all logged
    // A restored open session (fncall, nothing to re-create) with step 0
    // logged.
    v1::SessionRecord rec;
    rec.set_name(kName);
    rec.set_phase(v1::SESSION_PHASE_OPEN);
    rec.set_step_count(1);
    rec.set_ready(true);
    rec.set_lease_s(3600);
    auto* sb = rec.add_sandboxes();
    sb->set_role("agent");
    sb->mutable_spec()->set_kind(v1::KIND_FNCALL);
    v1::StepRecord step;
    step.set_session(kName);
    step.set_index(0);
    step.set_sandbox("agent");
    *step.mutable_request() = True();
    state::WriteBatch b;
    state::TypedTable<v1::SessionRecord>(&fault_, state::Table::kSessions).Put(&b, kName, rec);
    state::TypedTable<v1::StepRecord>(&fault_, state::Table::kSteps).Put(&b, state::StepKey(kName, 0), step);
    ASSERT_TRUE(committer_.WriteSync(std::move(b)).ok());
    rec_ = rec;
    self_ = std::make_unique<caf::scoped_actor>(*sys_);
    session_ = SpawnSession((*self_).ptr(), ctx_, entry_actor{}, rec, [] {});
  }
  void TearDown() override {
    (*self_)->send_exit(session_, caf::exit_reason::user_shutdown);
    (*self_)->wait_for(session_);
    self_.reset();
    sys_.reset();
    committer_.Stop();
  }

  v1::StepReply Ask(const v1::AnnotateStepRequest& req) { return Ask<v1::StepReply>(req); }
  v1::StepReply Ask(const v1::StepRequest& req) { return Ask<v1::StepReply>(req); }
  template <class Reply, class Req>
  Reply Ask(const Req& req) {
    Reply out;
    (*self_)->request(session_, std::chrono::seconds(10), req)
        .receive([&](Reply& r) { out = std::move(r); },
                 [&](caf::error& e) { ToProto(Status::Internal(caf::to_string(e)), out.mutable_status()); });
    return out;
  }
  v1::StepReply Annotate(double reward) {
    v1::AnnotateStepRequest req;
    req.set_session(kName);
    req.set_index(0);
    req.mutable_meta()->set_reward(reward);
    return Ask(req);
  }
  static v1::StepRequest ReplayRequest() {
    v1::StepRequest req;
    req.set_session(kName);
    req.set_index(0);
    *req.mutable_exec() = True();
    return req;
  }
  v1::StepReply Replay() { return Ask(ReplayRequest()); }
  double RewardOnDisk() {
    auto s = state::TypedTable<v1::StepRecord>(&mem_, state::Table::kSteps).Get(state::StepKey(kName, 0));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() && s->meta().has_reward() ? s->meta().reward() : -1;
  }

  std::unique_ptr<state::Store> mem_owner_ = state::NewMemStore();
  state::Store& mem_ = *mem_owner_;
  state::FaultStore fault_{mem_owner_.get()};
  state::GroupCommitter committer_{&fault_};
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  drivers::Registry kinds_{{}};
  std::shared_ptr<NodeContext> ctx_;
  std::unique_ptr<caf::scoped_actor> self_;
  v1::SessionRecord rec_;  // as restored
  session_actor session_;
};

TEST_F(SessionLog, AnAnnotationAnswersWithItsMetadataAndTheNextReplaySeesIt) {
  v1::StepReply a = Annotate(0.5);
  ASSERT_EQ(a.status().code(), v1::Status::OK) << a.status().message();
  EXPECT_EQ(a.step().index(), 0u);
  EXPECT_DOUBLE_EQ(a.step().meta().reward(), 0.5);
  EXPECT_EQ(a.step().request().argv_size(), 0) << "the answer to an annotation carries no request or output";
  v1::StepReply r = Replay();
  ASSERT_EQ(r.status().code(), v1::Status::OK) << r.status().message();
  EXPECT_TRUE(r.fast_forwarded());
  EXPECT_DOUBLE_EQ(r.step().meta().reward(), 0.5);
  EXPECT_EQ(r.step().request().argv(0), "/bin/true");
  EXPECT_DOUBLE_EQ(RewardOnDisk(), 0.5);
}

TEST_F(SessionLog, AFailedAnnotationIsNotServedToALaterReplay) {
  ASSERT_EQ(Annotate(0.5).status().code(), v1::Status::OK);
  fault_.FailNextWrites(1);
  v1::StepReply failed = Annotate(1.0);
  EXPECT_NE(failed.status().code(), v1::Status::OK);
  EXPECT_NE(failed.status().message().find("step 0: annotate"), std::string::npos) << failed.status().message();
  v1::StepReply r = Replay();
  ASSERT_EQ(r.status().code(), v1::Status::OK) << r.status().message();
  EXPECT_DOUBLE_EQ(r.step().meta().reward(), 0.5) << "the replay served an annotation that was never written";
  EXPECT_DOUBLE_EQ(RewardOnDisk(), 0.5);
  // And the log goes on: the next annotation lands.
  ASSERT_EQ(Annotate(0.75).status().code(), v1::Status::OK);
  EXPECT_DOUBLE_EQ(Replay().step().meta().reward(), 0.75);
  EXPECT_DOUBLE_EQ(RewardOnDisk(), 0.75);
}

TEST_F(SessionLog, AReplayThatDiffersIsRefusedFromMemoryToo) {
  ASSERT_EQ(Replay().status().code(), v1::Status::OK);  // now cached
  v1::StepRequest other;
  other.set_session(kName);
  other.set_index(0);
  other.mutable_exec()->add_argv("/bin/false");
  v1::StepReply r = Ask(other);
  EXPECT_EQ(r.status().code(), v1::Status::FAILED_PRECONDITION);
  EXPECT_NE(r.status().message().find("differs from the logged one"), std::string::npos) << r.status().message();
}

TEST_F(SessionLog, ARestartedActorReadsTheLogOnlyAfterTheCrashedOnesWritesLand) {
  // The crashed actor's last annotation is still queued behind a write in
  // progress (held) when the supervisor starts the new actor.
  fault_.PauseWrites();
  auto step = state::TypedTable<v1::StepRecord>(&mem_, state::Table::kSteps).Get(state::StepKey(kName, 0));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  step->mutable_meta()->set_reward(0.9);
  state::WriteBatch b;
  state::TypedTable<v1::StepRecord>(&fault_, state::Table::kSteps).Put(&b, state::StepKey(kName, 0), *step);
  std::promise<Status> landed;
  committer_.Submit(std::move(b), [&landed](const Status& s) { landed.set_value(s); });
  fault_.WaitForPausedWrites(1);
  auto restarted = SpawnSession((*self_).ptr(), ctx_, entry_actor{}, rec_, [] {});
  // A replay, then a request the actor answers at once: once that answer is
  // here, the actor has taken the replay (answered or held it).
  auto replay = (*self_)->request(restarted, std::chrono::seconds(10), ReplayRequest());
  v1::GetSessionRequest get;
  get.set_name(kName);
  (*self_)->request(restarted, std::chrono::seconds(10), get).receive([](v1::SessionReply&) {}, [](caf::error& e) {
    ADD_FAILURE() << caf::to_string(e);
  });
  fault_.ResumeWrites();
  ASSERT_TRUE(landed.get_future().get().ok());
  v1::StepReply r;
  replay.receive([&](v1::StepReply& got) { r = std::move(got); },
                 [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  ASSERT_EQ(r.status().code(), v1::Status::OK) << r.status().message();
  EXPECT_TRUE(r.step().meta().has_reward()) << "the restarted actor served the log from before the crashed one's write";
  EXPECT_DOUBLE_EQ(r.step().meta().reward(), 0.9);
  (*self_)->send_exit(restarted, caf::exit_reason::user_shutdown);
  (*self_)->wait_for(restarted);
}

}  // namespace
}  // namespace dsec
