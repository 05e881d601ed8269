// The sandbox actor, through the node, on the fake kind (tests/support/
// actor_node.hpp): its lifecycle, its calls and their refusals, its
// checkpoints, its ends, crashes and restarts. No root, no processes.
#include <gmock/gmock.h>

#include <future>
#include <thread>

#include "dsec/store/v1/records.pb.h"
#include "state/table.hpp"
#include "tests/support/actor_node.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class SandboxActor : public ::testing::Test {
 protected:
  // The sandbox's row in the store, as the actor last checkpointed it.
  Result<store::v1::SandboxRow> Row(const std::string& id) {
    return state::TypedTable<store::v1::SandboxRow>(node_.store(), state::Table::kSandboxes).Get(id);
  }
  std::string Make(v1::SandboxSpec spec = ActorNode::Fake(), const std::string& id = "") {
    auto sb = node_.Create(std::move(spec), id);
    EXPECT_TRUE(sb.ok()) << sb.status().ToString();
    return sb.ok() ? sb->id() : "";
  }
  // `sleep 30` in sandbox `id`, sent from an actor of its own, its reply
  // awaited on a thread of its own; started once it is running.
  struct SlowExec {
    caf::scoped_actor other;
    std::promise<v1::ExecReply> pending;
    std::future<v1::ExecReply> answered = pending.get_future();
    std::thread waiter;
    explicit SlowExec(caf::actor_system& sys) : other(sys) {}
    ~SlowExec() { if (waiter.joinable()) waiter.join(); }
  };
  std::unique_ptr<SlowExec> StartSlowExec(const std::string& id) {
    auto x = std::make_unique<SlowExec>(node_.sys());
    v1::ExecRequest slow;
    slow.set_sandbox_id(id);
    for (const char* a : {"sleep", "30"}) slow.add_argv(a);
    x->waiter = std::thread([this, x = x.get(), slow] {
      x->other->request(node_.node(), std::chrono::seconds(20), slow)
          .receive([&](v1::ExecReply& r) { x->pending.set_value(r); },
                   [&](caf::error& e) { ADD_FAILURE() << to_string(e); x->pending.set_value({}); });
    });
    EXPECT_TRUE(node_.WaitFor([&] { return !node_.world()->Running(id).empty(); }));
    return x;
  }
  ActorNode node_;
};

TEST_F(SandboxActor, CreateGivesARunningSandboxWithTheNodesDefaultsFilledIn) {
  auto sb = node_.Create(ActorNode::Fake());
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(sb->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_EQ(sb->node_id(), "node-test");
  EXPECT_EQ(sb->spec().kind(), v1::KIND_FAKE);
  EXPECT_GT(sb->spec().limits().memory_bytes(), 0u) << "the limits in force are in the record";
  EXPECT_GT(sb->spec().limits().pids(), 0u);
  EXPECT_GT(sb->ttl_deadline_ms(), sb->created_ms()) << "the node's default ttl";
  auto row = Row(sb->id());
  ASSERT_TRUE(row.ok()) << "checkpointed before the answer: " << row.status().ToString();
  EXPECT_EQ(row->record().phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_FALSE(row->driver_state().empty()) << "the driver's state is kept with the record";
}

TEST_F(SandboxActor, ATakenIdIsAlreadyExistsWithTheSandboxAsItIs) {
  std::string id = Make(ActorNode::Fake(), "mine");
  v1::CreateRequest again;
  *again.mutable_spec() = ActorNode::Fake();
  again.set_id(id);
  auto r = node_.Call(again);
  EXPECT_EQ(r.status().code(), Status::Code::kAlreadyExists);
}

TEST_F(SandboxActor, ABadIdIsRefusedNamingTheRule) {
  auto r = node_.Create(ActorNode::Fake(), "Bad_Id");
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("[a-z0-9-]"));
  EXPECT_FALSE(Row("Bad_Id").ok()) << "nothing written";
}

TEST_F(SandboxActor, AKindTheNodeLacksIsRefusedNamingIt) {
  v1::SandboxSpec spec;
  spec.set_kind(v1::KIND_MICROVM);
  auto r = node_.Create(spec);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("microvm"));
}

TEST_F(SandboxActor, ExecRunsInItAndStateOutlivesTheExec) {
  std::string id = Make();
  auto w = node_.Exec(id, "echo kept > /work/f; echo out; echo err >&2; exit 3");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->stdout(), "out\n");
  EXPECT_EQ(w->stderr(), "err\n");
  EXPECT_EQ(w->exit_code(), 3);
  EXPECT_EQ(w->verdict(), v1::VERDICT_RUNTIME_ERROR);
  EXPECT_EQ(w->sandbox_id(), id);
  EXPECT_EQ(node_.Exec(id, "cat /work/f")->stdout(), "kept\n");
  auto rec = node_.Get(id);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->exec_count(), 2u);
}

TEST_F(SandboxActor, CallsForAnUnknownSandboxAreNotFoundAndForAnEndedOneSayWhy) {
  auto unknown = node_.Exec("sb-none", "true");
  EXPECT_EQ(unknown.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("sb-none"));
  std::string id = Make();
  v1::DestroyRequest d;
  d.set_sandbox_id(id);
  d.set_reason("because the test says so");
  ASSERT_TRUE(node_.Call(d).ok());
  auto gone = node_.Exec(id, "true");
  EXPECT_EQ(gone.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("it ended (because the test says so)"));
  EXPECT_FALSE(Row(id).ok()) << "a stopped sandbox leaves no row";
  EXPECT_TRUE(node_.world()->Ids().empty()) << "the driver removed its box";
}

TEST_F(SandboxActor, AStreamedExecSendsItsOutputBeforeItsReply) {
  std::string id = Make();
  v1::ExecRequest req;
  req.set_sandbox_id(id);
  for (const char* a : {"sh", "-c", "for i in 1 2 3; do echo line$i; done"}) req.add_argv(a);
  req.set_stream(true);
  req.set_stream_id(7);
  std::string streamed;
  bool replied = false, order_ok = true;
  auto& self = node_.trainer();
  self->request(node_.node(), std::chrono::seconds(10), req)
      .receive([&](v1::ExecReply& r) { replied = r.status().code() == v1::Status::OK; },
               [&](caf::error& e) { ADD_FAILURE() << to_string(e); });
  // The pieces were sent before the reply (one sender, one receiver: in order).
  for (bool more = true; more;)
    self->receive([&](v1::ExecOutput& o) {
                    order_ok = order_ok && o.stream_id() == 7;
                    streamed += o.stdout();
                  },
                  caf::after(std::chrono::milliseconds(0)) >> [&] { more = false; });
  EXPECT_TRUE(replied);
  EXPECT_TRUE(order_ok);
  EXPECT_EQ(streamed, "line1\nline2\nline3\n");
}

TEST_F(SandboxActor, AKindThatCannotStreamOrHasNoStateRefusesStreamsAndKeysBeforeRunning) {
  ActorNodeOptions o;
  o.fake.traits.streaming = false;
  o.fake.traits.stateful = false;
  ActorNode plain(o);
  auto sb = plain.Create(ActorNode::Fake());
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  v1::ExecRequest req;
  req.set_sandbox_id(sb->id());
  for (const char* a : {"sh", "-c", "echo ran > /work/mark"}) req.add_argv(a);
  req.set_stream(true);
  auto streamed = plain.Call(req);
  EXPECT_EQ(streamed.status().code(), Status::Code::kUnimplemented);
  EXPECT_THAT(streamed.status().message(), HasSubstr("fake sandboxes cannot stream output"));
  req.set_stream(false);
  req.set_idempotency_key("k1");
  auto keyed = plain.Call(req);
  EXPECT_EQ(keyed.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(keyed.status().message(), HasSubstr("needs a sandbox with state"));
  EXPECT_TRUE(plain.world()->ArgvLog(sb->id()).empty()) << "refused before anything ran";
}

TEST_F(SandboxActor, AnExecLimitDifferentFromTheSandboxsWideOneIsRefused) {
  std::string id = Make();
  v1::Limits mem;
  mem.set_memory_bytes(1 << 20);
  auto r = node_.Exec(id, "true", mem);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("create"));
}

TEST_F(SandboxActor, TimeAndOutputLimitsGiveVerdictsAndTheSandboxLivesOn) {
  std::string id = Make();
  v1::Limits t;
  t.set_timeout_ms(100);
  EXPECT_EQ(node_.Exec(id, "sleep 5", t)->verdict(), v1::VERDICT_TIME_LIMIT);
  v1::Limits o;
  o.set_output_bytes(1000);
  auto loud = node_.Exec(id, "yes", o);
  ASSERT_TRUE(loud.ok());
  EXPECT_EQ(loud->verdict(), v1::VERDICT_OUTPUT_LIMIT);
  EXPECT_TRUE(loud->stdout_truncated());
  EXPECT_EQ(node_.Exec(id, "echo alive")->stdout(), "alive\n");
}

TEST_F(SandboxActor, APausedSandboxRefusesExecsSayingResumeAndResumeContinues) {
  std::string id = Make();
  v1::PauseRequest p;
  p.set_sandbox_id(id);
  auto paused = node_.Call(p);
  ASSERT_TRUE(paused.ok()) << paused.status().ToString();
  EXPECT_EQ(paused->sandbox().phase(), v1::SANDBOX_PHASE_PAUSED);
  EXPECT_TRUE(node_.Call(p).ok()) << "pausing a paused sandbox is a no-op";
  auto refused = node_.Exec(id, "true");
  EXPECT_EQ(refused.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("resume it first"));
  EXPECT_EQ(Row(id)->record().phase(), v1::SANDBOX_PHASE_PAUSED) << "checkpointed";
  v1::ResumeRequest r;
  r.set_sandbox_id(id);
  ASSERT_TRUE(node_.Call(r).ok());
  EXPECT_EQ(node_.Exec(id, "echo back")->stdout(), "back\n");
}

// E2B pauses a sandbox with its commands running: so does dsec (they are
// frozen with it), and a destroy of it while paused answers them.
TEST_F(SandboxActor, AnExecRunningIsPausedWithItsSandboxAndADestroyAnswersIt) {
  std::string id = Make();
  auto slow = StartSlowExec(id);
  v1::PauseRequest p;
  p.set_sandbox_id(id);
  auto r = node_.Call(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Row(id)->record().phase(), v1::SANDBOX_PHASE_PAUSED);
  EXPECT_EQ(slow->answered.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout) << "it runs on, paused";
  v1::DestroyRequest d;
  d.set_sandbox_id(id);
  ASSERT_TRUE(node_.Call(d).ok());
  ASSERT_EQ(slow->answered.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the exec was never answered";
  auto got = slow->answered.get();
  EXPECT_EQ(got.result().verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_THAT(got.result().error(), HasSubstr("sandbox " + id + " was destroyed"));
}

TEST_F(SandboxActor, AKindWithoutPauseOrFilesSaysSoNamingTheKind) {
  ActorNodeOptions o;
  o.fake.traits.pause = false;
  o.fake.traits.files = false;
  ActorNode bare(o);
  auto sb = bare.Create(ActorNode::Fake());
  ASSERT_TRUE(sb.ok());
  v1::PauseRequest p;
  p.set_sandbox_id(sb->id());
  auto paused = bare.Call(p);
  EXPECT_EQ(paused.status().code(), Status::Code::kUnimplemented) << paused.status().ToString();
  EXPECT_THAT(paused.status().message(), HasSubstr("fake"));
  v1::ReadFileRequest rf;
  rf.set_sandbox_id(sb->id());
  rf.set_path("/work/x");
  auto read = bare.Call(rf);
  EXPECT_EQ(read.status().code(), Status::Code::kUnimplemented);
  EXPECT_THAT(read.status().message(), HasSubstr("fake"));
  v1::SandboxSpec ttl_pauses = ActorNode::Fake();
  ttl_pauses.set_on_ttl(v1::IDLE_ACTION_PAUSE);
  auto refused = bare.Create(ttl_pauses);
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument) << "a ttl that would pause it, never ending";
  EXPECT_THAT(refused.status().message(), HasSubstr("on_ttl destroy"));
}

TEST_F(SandboxActor, FilesRoundTripAndABadPathIsRefusedBeforeTheDriver) {
  std::string id = Make();
  v1::WriteFileRequest w;
  w.set_sandbox_id(id);
  w.set_path("/work/deep/note.txt");
  w.set_content("hello\n");
  w.set_make_parents(true);
  ASSERT_TRUE(node_.Call(w).ok());
  EXPECT_EQ(node_.Exec(id, "cat /work/deep/note.txt")->stdout(), "hello\n");
  v1::ReadFileRequest r;
  r.set_sandbox_id(id);
  r.set_path("/work/deep/note.txt");
  EXPECT_EQ(node_.Call(r)->content(), "hello\n");
  v1::ListFilesRequest l;
  l.set_sandbox_id(id);
  l.set_path("/work/deep");
  auto list = node_.Call(l);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->entries_size(), 1);
  EXPECT_EQ(list->entries(0).name(), "note.txt");
  r.set_path("/work/../etc/passwd");
  auto bad = node_.Call(r);
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(id));
}

TEST_F(SandboxActor, DestroyWithAnExecInFlightAnswersTheExecFirst) {
  std::string id = Make();
  auto slow = StartSlowExec(id);
  v1::DestroyRequest d;
  d.set_sandbox_id(id);
  ASSERT_TRUE(node_.Call(d).ok());
  ASSERT_EQ(slow->answered.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the exec was never answered";
  auto r = slow->answered.get();
  EXPECT_EQ(r.result().verdict(), v1::VERDICT_PLATFORM_ERROR);
  EXPECT_THAT(r.result().error(), HasSubstr("sandbox " + id + " was destroyed"));
}

TEST_F(SandboxActor, AFailedDestroyKeepsItFailedAndADestroyAgainRemovesIt) {
  std::string id = Make();
  node_.driver_faults().FailNext(drivers::FaultDriver::Op::kDestroy, 1, Status::Internal("disk on fire"));
  v1::DestroyRequest d;
  d.set_sandbox_id(id);
  auto first = node_.Call(d);
  EXPECT_FALSE(first.ok());
  EXPECT_THAT(first.status().message(), HasSubstr("disk on fire"));
  auto rec = node_.Get(id);
  ASSERT_TRUE(rec.ok()) << "kept, to be destroyed again";
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_FAILED);
  EXPECT_THAT(rec->error(), HasSubstr("destroy it again"));
  EXPECT_TRUE(node_.Call(d).ok());
  EXPECT_EQ(node_.Get(id).status().code(), Status::Code::kNotFound);
}

TEST_F(SandboxActor, ACreationTheDriverFailsLeavesNothing) {
  node_.driver_faults().FailNext(drivers::FaultDriver::Op::kCreate, 1, Status::Unavailable("no room"));
  auto r = node_.Create(ActorNode::Fake(), "doomed");
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("no room"));
  EXPECT_EQ(node_.Get("doomed").status().code(), Status::Code::kNotFound);
  EXPECT_FALSE(Row("doomed").ok());
  EXPECT_TRUE(node_.Create(ActorNode::Fake(), "doomed").ok()) << "the id is free again";
}

TEST_F(SandboxActor, ACheckpointTheStoreRefusesFailsTheCreate) {
  node_.store_faults().FailNextWrites(1, Status::Internal("store full"));
  auto r = node_.Create(ActorNode::Fake(), "unstored");
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("store full"));
  EXPECT_EQ(node_.Get("unstored").status().code(), Status::Code::kNotFound) << "not acknowledged, not kept";
}

TEST_F(SandboxActor, SetTimeoutMovesTheEndBothWaysAndIsCheckpointed) {
  v1::SandboxSpec spec = ActorNode::Fake();
  spec.set_ttl_s(3600);
  std::string id = Make(spec);
  v1::SetTimeoutRequest t;
  t.set_sandbox_id(id);
  t.set_timeout_s(7200);
  auto later = node_.Call(t);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_NEAR(later->sandbox().expires_ms() - WallClockMs(), 7200e3, 5e3);
  t.set_timeout_s(60);
  auto sooner = node_.Call(t);
  ASSERT_TRUE(sooner.ok());
  EXPECT_NEAR(sooner->sandbox().expires_ms() - WallClockMs(), 60e3, 5e3);
  EXPECT_EQ(Row(id)->record().ttl_deadline_ms(), sooner->sandbox().ttl_deadline_ms());
  EXPECT_GE(sooner->sandbox().spec().ttl_s(), 60u) << "the record's ttl counts from creation to the new end";
}

TEST_F(SandboxActor, SetTimeoutOfZeroOrPastTheMaximumChangesNothing) {
  std::string id = Make();
  int64_t was = node_.Get(id)->ttl_deadline_ms();
  v1::SetTimeoutRequest t;
  t.set_sandbox_id(id);
  t.set_timeout_s(0);
  EXPECT_EQ(node_.Call(t).status().code(), Status::Code::kInvalidArgument);
  t.set_timeout_s(node_.ctx().options.sandbox_max_ttl_s + 1);
  auto over = node_.Call(t);
  EXPECT_EQ(over.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(over.status().message(), HasSubstr("--sandbox-max-ttl"));
  EXPECT_EQ(node_.Get(id)->ttl_deadline_ms(), was);
}

TEST_F(SandboxActor, ATtlThatRunsOutEndsItAndACallSaysWhy) {
  v1::SandboxSpec spec = ActorNode::Fake();
  spec.set_ttl_s(1);
  std::string id = Make(spec);
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get(id).status().code() == Status::Code::kNotFound; },
                            std::chrono::seconds(5)));
  EXPECT_THAT(node_.Get(id).status().message(), HasSubstr("its ttl of 1 s ran out"));
  EXPECT_TRUE(node_.world()->Ids().empty());
}

// on_ttl pause (E2B's autoPause): the ttl's end pauses it, its files kept;
// paused, it has no end; a resume starts its ttl again.
TEST_F(SandboxActor, ATtlThatPausesPausesItAndAResumeStartsItAgain) {
  v1::SandboxSpec spec = ActorNode::Fake();
  spec.set_ttl_s(1);
  spec.set_on_ttl(v1::IDLE_ACTION_PAUSE);
  std::string id = Make(spec);
  ASSERT_EQ(node_.Exec(id, "echo kept > /work/f")->verdict(), v1::VERDICT_OK);
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get(id)->phase() == v1::SANDBOX_PHASE_PAUSED; },
                            std::chrono::seconds(5)));
  auto paused = node_.Get(id);
  EXPECT_THAT(paused->pause_reason(), HasSubstr("its ttl of 1 s ran out"));
  EXPECT_EQ(paused->ttl_deadline_ms(), 0) << "paused by its ttl, it has none";
  EXPECT_EQ(paused->expires_ms(), 0) << "nothing ends it while paused";
  // An automatic pause is checkpointed after the actor's record says it
  // (no caller waits for the write, as a Pause call's does).
  EXPECT_TRUE(node_.WaitFor([&] { return Row(id)->record().phase() == v1::SANDBOX_PHASE_PAUSED; }))
      << "checkpointed";
  v1::ResumeRequest r;
  r.set_sandbox_id(id);
  int64_t before = WallClockMs();
  ASSERT_TRUE(node_.Call(r).ok());
  auto resumed = node_.Get(id);
  EXPECT_GE(resumed->ttl_deadline_ms(), before + 1000) << "a resume starts its ttl again";
  EXPECT_EQ(node_.Exec(id, "cat /work/f")->stdout(), "kept\n");
  v1::SetTimeoutRequest t;  // E2B's setTimeout: the period a resume starts again, not the whole lifetime
  t.set_sandbox_id(id);
  t.set_timeout_s(1);
  auto timed = node_.Call(t);
  ASSERT_TRUE(timed.ok()) << timed.status().ToString();
  EXPECT_EQ(timed->sandbox().spec().ttl_s(), 1u) << "over a second old: a lifetime would be 2 s or more";
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get(id)->phase() == v1::SANDBOX_PHASE_PAUSED; },
                            std::chrono::seconds(5)))
      << "and its end pauses it again";
}

TEST_F(SandboxActor, AnIdleSandboxIsPausedAndTheRecordSaysWhy) {
  v1::SandboxSpec spec = ActorNode::Fake();
  spec.set_idle_timeout_s(1);
  spec.set_on_idle(v1::IDLE_ACTION_PAUSE);
  std::string id = Make(spec);
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get(id)->phase() == v1::SANDBOX_PHASE_PAUSED; },
                            std::chrono::seconds(5)));
  EXPECT_THAT(node_.Get(id)->pause_reason(), HasSubstr("idle for 1 s"));
}

TEST_F(SandboxActor, LabelsAreKeptAndBoundedNamingTheKey) {
  v1::SandboxSpec spec = ActorNode::Fake();
  (*spec.mutable_labels())["job"] = "j7";
  std::string id = Make(spec);
  EXPECT_EQ(node_.Get(id)->spec().labels().at("job"), "j7");
  (*spec.mutable_labels())["bad key"] = "v";
  auto r = node_.Create(spec);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("label key 'bad key'"));
}

TEST_F(SandboxActor, TheConsolesInspectShowsTheDriversStateDecoded) {
  std::string id = Make();
  auto j = node_.Admin("inspect " + id);
  ASSERT_TRUE(j.value("ok", false)) << j.dump();
  EXPECT_EQ(j["sandbox"]["id"], id);
  EXPECT_EQ(j["sandbox"]["driver_state"].value("box", ""), id) << j.dump();
}

TEST_F(SandboxActor, ACrashedActorIsRestartedFromItsCheckpointWithItsFiles) {
  std::string id = Make();
  ASSERT_EQ(node_.Exec(id, "echo kept > /work/f")->verdict(), v1::VERDICT_OK);
  ASSERT_TRUE(node_.Admin("crash " + id).value("ok", false));
  ASSERT_TRUE(node_.WaitFor([&] {
    auto r = node_.Get(id);
    return r.ok() && r->restarts() == 1;
  }));
  EXPECT_EQ(node_.Exec(id, "cat /work/f")->stdout(), "kept\n");
}

TEST_F(SandboxActor, CrashingTooOftenLeavesItFailedSayingSo) {
  std::string id = Make();
  for (int i = 0; i <= node_.ctx().options.max_restarts; ++i) {
    ASSERT_TRUE(node_.Admin("crash " + id).value("ok", false)) << i;
    ASSERT_TRUE(node_.WaitFor([&] {
      auto r = node_.Get(id);
      return r.ok() && (r->restarts() == static_cast<uint32_t>(i + 1) || r->phase() == v1::SANDBOX_PHASE_FAILED);
    }));
  }
  auto rec = node_.Get(id);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_FAILED);
  EXPECT_THAT(rec->error(), HasSubstr("crashed"));
}

TEST_F(SandboxActor, ARestartedNodeReadoptsItsSandboxesWithTheirFiles) {
  std::string id = Make();
  ASSERT_EQ(node_.Exec(id, "echo kept > /work/f")->verdict(), v1::VERDICT_OK);
  node_.Restart();
  auto rec = node_.Get(id);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_EQ(node_.Exec(id, "cat /work/f")->stdout(), "kept\n");
}

TEST_F(SandboxActor, ASandboxGoneWhileTheNodeWasDownIsFailedSayingWhy) {
  std::string id = Make();
  // Gone while no node runs: between the stop and the restore.
  node_.Restart([&](drivers::FaultDriver&) { ASSERT_TRUE(node_.world()->Vanish(id, "the host rebooted")); });
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get(id)->phase() == v1::SANDBOX_PHASE_FAILED; }));
  EXPECT_THAT(node_.Get(id)->error(), HasSubstr("not re-adopted after restart"));
}

TEST_F(SandboxActor, ASandboxThatEndsByItselfIsFailedSayingWhy) {
  std::string id = Make();
  ASSERT_TRUE(node_.world()->Vanish(id, "its process was killed"));
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get(id)->phase() == v1::SANDBOX_PHASE_FAILED; }));
  EXPECT_THAT(node_.Get(id)->error(), HasSubstr("its process was killed"));
}

// A sandbox that ends by itself while its pause is with the driver is
// failed at once, saying why; what is left of it is removed only once the
// pause has answered (a resume beside the removal would make again what it
// takes away), and the pause answers that it failed.
TEST_F(SandboxActor, ASandboxLostWhileItsPauseIsWithTheDriverIsRemovedAfterThePause) {
  using Op = drivers::FaultDriver::Op;
  std::string id = Make();
  auto& faults = node_.driver_faults();
  faults.Hold(Op::kPause);
  caf::scoped_actor other{node_.sys()};
  v1::PauseRequest p;
  p.set_sandbox_id(id);
  std::promise<Status> answered;
  std::thread caller([&] {
    auto r = node_.CallAs(other, p, std::chrono::seconds(20));
    answered.set_value(r.status());
  });
  ASSERT_TRUE(node_.WaitFor([&] { return faults.held(Op::kPause) == 1; }));
  const uint64_t destroys = faults.calls(Op::kDestroy);
  ASSERT_TRUE(node_.world()->Vanish(id, "its process was killed"));
  ASSERT_TRUE(node_.WaitFor([&] { return node_.Get(id)->phase() == v1::SANDBOX_PHASE_FAILED; }));
  EXPECT_EQ(faults.calls(Op::kDestroy), destroys) << "removed beside the pause";
  faults.Release(Op::kPause);
  auto f = answered.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  Status paused = f.get();
  EXPECT_EQ(paused.code(), Status::Code::kUnavailable) << paused.ToString();
  EXPECT_THAT(paused.message(), HasSubstr("failed meanwhile"));
  caller.join();
  ASSERT_TRUE(node_.WaitFor([&] { return faults.calls(Op::kDestroy) == destroys + 1; }));
  auto rec = node_.Get(id);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_FAILED);
  EXPECT_THAT(rec->error(), HasSubstr("its process was killed"));
}

TEST_F(SandboxActor, CallsWaitWhileTheDriverReadoptsItAfterARestart) {
  std::string id = Make();
  // Held at the next start's re-adoption (armed before the restore).
  node_.Restart([](drivers::FaultDriver& f) { f.Hold(drivers::FaultDriver::Op::kReadopt); });
  ASSERT_TRUE(node_.WaitFor([&] { return node_.driver_faults().held(drivers::FaultDriver::Op::kReadopt) == 1; }));
  caf::scoped_actor other{node_.sys()};
  v1::ExecRequest req;
  req.set_sandbox_id(id);
  for (const char* a : {"echo", "after"}) req.add_argv(a);
  auto answered = std::make_shared<std::promise<std::string>>();
  std::thread caller([&] {
    other->request(node_.node(), std::chrono::seconds(20), req)
        .receive([&](v1::ExecReply& r) { answered->set_value(r.result().stdout()); },
                 [&](caf::error& e) { answered->set_value("error " + to_string(e)); });
  });
  auto f = answered->get_future();
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the exec must wait for the re-adoption";
  EXPECT_EQ(node_.driver_faults().calls(drivers::FaultDriver::Op::kExec), 0u) << "nothing reached the driver";
  node_.driver_faults().Release(drivers::FaultDriver::Op::kReadopt);
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(f.get(), "after\n");
  caller.join();
}

}  // namespace
}  // namespace dsec::testing
