// Rollout sessions on container sandboxes (DESIGN.md section 4): the session
// owns its sandboxes, steps share their state, a replay is answered from the
// log, metadata rides along, close keeps the log and removes the sandboxes,
// and the lease closes a session whose trainer is gone.
#include <gmock/gmock.h>

#include <chrono>
#include <thread>

#include "dsec/report.hpp"
#include "harness/rootfs.hpp"
#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

class ContainerSessions : public ContainerTest {
 protected:
  static v1::SandboxSpec Spec() { return ContainerSpec(kImage); }
  // A step that appends a line to /work/steps and prints the line count: it
  // prints k+1 at step k only if no step ran twice and none was lost.
  static v1::ExecRequest Count(uint64_t k) {
    return Sh("echo " + std::to_string(k) + " >> /work/steps; wc -l < /work/steps");
  }
  // Polls the session's record until `done` holds (or 30 s pass).
  static v1::SessionRecord WaitFor(const std::string& name, std::function<bool(const v1::SessionRecord&)> done) {
    v1::SessionRecord last;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto s = client_->AttachSession(name);
      if (s.ok()) {
        last = s->record();
        if (done(last)) return last;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return last;
  }
};

TEST_F(ContainerSessions, StepsShareTheSandboxAndAReplayRunsNothingTwice) {
  auto s = client_->OpenSession("cs/count/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->record().sandboxes_size(), 1);
  EXPECT_EQ(s->record().sandboxes(0).role(), "agent");
  std::string id = s->record().sandboxes(0).id();
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(client_->Attach(id).ok()) << "the session's sandbox is a real sandbox";
  for (uint64_t k = 0; k < 10; ++k) {
    auto r = s->Step(k, Count(k));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->fast_forwarded());
    EXPECT_EQ(r->step().result().stdout(), std::to_string(k + 1) + "\n");
    EXPECT_EQ(r->step().sandbox(), "agent");
  }
  // A new trainer process: opens again by name, replays from 0.
  auto again = client_->OpenSession("cs/count/0", Spec());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->record().sandboxes(0).id(), id) << "the same sandbox, not a new one";
  for (uint64_t k = 0; k < 10; ++k) {
    auto r = again->Step(k, Count(k));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->fast_forwarded());
    EXPECT_EQ(r->step().result().stdout(), std::to_string(k + 1) + "\n");
  }
  auto next = again->Step(10, Count(10));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "11\n") << "ten lines before step 10: nothing ran twice";
  auto file = again->sandbox().value().ReadFile("/work/steps");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(std::count(file->begin(), file->end(), '\n'), 11);
  EXPECT_TRUE(again->Close().ok());
}

TEST_F(ContainerSessions, AReplayThatDiffersOrSkipsAheadIsRefusedByName) {
  auto s = client_->OpenSession("cs/mismatch/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Sh("echo a")).ok());
  auto differs = s->Step(0, Sh("echo b"));
  ASSERT_FALSE(differs.ok());
  EXPECT_EQ(differs.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(differs.status().message(), HasSubstr("session cs/mismatch/0 step 0"));
  EXPECT_THAT(differs.status().message(), HasSubstr("differs from the logged one"));
  auto other_sandbox = s->Step(0, Sh("echo a"), StepOptions{"eval", {}});
  ASSERT_FALSE(other_sandbox.ok());
  EXPECT_THAT(other_sandbox.status().message(), HasSubstr("sandbox 'eval' vs logged 'agent'"));
  auto gap = s->Step(3, Sh("echo c"));
  ASSERT_FALSE(gap.ok());
  EXPECT_THAT(gap.status().message(), HasSubstr("cs/mismatch/0"));
  EXPECT_THAT(gap.status().message(), HasSubstr("the next step is 1"));
  auto rec = s->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->step_count(), 1u) << "refused steps change nothing";
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(ContainerSessions, AnEvalSandboxIsSeparateFromTheAgentSandbox) {
  SessionOptions o;
  o.more_sandboxes = {{"eval", Spec()}};
  auto s = client_->OpenSession("cs/eval/0", Spec(), o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->record().sandboxes_size(), 2);
  EXPECT_NE(s->record().sandboxes(0).id(), s->record().sandboxes(1).id());
  ASSERT_TRUE(s->Step(0, Sh("echo secret > /work/answer")).ok());
  auto eval = s->Step(1, Sh("cat /work/answer 2>&1; echo eval-ran"), StepOptions{"eval", {}});
  ASSERT_TRUE(eval.ok()) << eval.status().ToString();
  EXPECT_EQ(eval->step().sandbox(), "eval");
  EXPECT_THAT(eval->step().result().stdout(), HasSubstr("eval-ran"));
  EXPECT_THAT(eval->step().result().stdout(), ::testing::Not(HasSubstr("secret")));
  auto unknown = s->Step(2, Sh("true"), StepOptions{"grader", {}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no sandbox 'grader' (it has: agent, eval)"));
  // Re-opening with other roles is another session: refused.
  auto other = client_->OpenSession("cs/eval/0", Spec());
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(), HasSubstr("different specs"));
  std::vector<std::string> ids{s->record().sandboxes(0).id(), s->record().sandboxes(1).id()};
  EXPECT_TRUE(s->Close().ok());
  for (const auto& id : ids) {
    EXPECT_EQ(client_->Attach(id).status().code(), Status::Code::kNotFound) << id;
    EXPECT_EQ(Remains(id), "") << id;
  }
}

TEST_F(ContainerSessions, MetadataIsLoggedWithTheStepAndCanBeAddedLater) {
  auto s = client_->OpenSession("cs/meta/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  StepOptions with;
  with.meta.set_prompt_tokens(120);
  with.meta.set_completion_tokens(30);
  (*with.meta.mutable_notes())["thought"] = "list the files first";
  ASSERT_TRUE(s->Step(0, Sh("ls /")).ok());
  ASSERT_TRUE(s->Step(1, Sh("true"), with).ok());
  v1::StepMeta later;
  later.set_reward(0.75);
  (*later.mutable_notes())["grader"] = "partial";
  auto annotated = s->Annotate(1, later);
  ASSERT_TRUE(annotated.ok()) << annotated.status().ToString();
  // What comes back is the merged metadata, as logged.
  EXPECT_DOUBLE_EQ(annotated->reward(), 0.75);
  EXPECT_EQ(annotated->prompt_tokens(), 120u);
  EXPECT_EQ(annotated->notes().at("thought"), "list the files first");
  EXPECT_EQ(annotated->notes().at("grader"), "partial");
  auto steps = s->Steps();
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  ASSERT_EQ(steps->steps_size(), 2);
  const auto& m = steps->steps(1).meta();
  EXPECT_TRUE(m.has_reward());
  EXPECT_DOUBLE_EQ(m.reward(), 0.75);
  EXPECT_EQ(m.prompt_tokens(), 120u);
  EXPECT_EQ(m.completion_tokens(), 30u);
  EXPECT_EQ(m.notes().at("thought"), "list the files first");
  EXPECT_EQ(m.notes().at("grader"), "partial");
  EXPECT_FALSE(steps->steps(0).meta().has_reward());
  // Metadata is not part of what a replay must match.
  auto replay = s->Step(1, Sh("true"));
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(replay->fast_forwarded());
  EXPECT_DOUBLE_EQ(replay->step().meta().reward(), 0.75);
  auto missing = s->Annotate(5, later);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("step 5 is not in the log (2 step(s) logged)"));
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(ContainerSessions, CloseRemovesTheSandboxAndKeepsTheLog) {
  auto s = client_->OpenSession("cs/close/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::string id = s->record().sandboxes(0).id();
  ASSERT_TRUE(s->Step(0, Sh("echo kept")).ok());
  ASSERT_TRUE(s->Close().ok());
  EXPECT_TRUE(s->Close().ok()) << "closing twice is fine";
  EXPECT_EQ(client_->Attach(id).status().code(), Status::Code::kNotFound);
  EXPECT_EQ(Remains(id), "");
  auto rec = s->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SESSION_PHASE_CLOSED);
  EXPECT_EQ(rec->close_reason(), "closed by the trainer");
  auto steps = s->Steps();
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  ASSERT_EQ(steps->steps_size(), 1);
  EXPECT_EQ(steps->steps(0).result().stdout(), "kept\n");
  auto step = s->Step(1, Sh("true"));
  ASSERT_FALSE(step.ok());
  EXPECT_THAT(step.status().message(), HasSubstr("cs/close/0 is closed"));
  auto reopen = client_->OpenSession("cs/close/0", Spec());
  ASSERT_FALSE(reopen.ok());
  EXPECT_THAT(reopen.status().message(), HasSubstr("open a new session name"));
}

// A session's sandboxes end with the session: a timeout of their own is
// refused, saying so, and changes nothing.
TEST_F(ContainerSessions, ItsSandboxTakesNoTimeoutOfItsOwn) {
  auto s = client_->OpenSession("cs/timeout/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto sb = s->sandbox();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = sb->SetTimeout(60);
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("belongs to session cs/timeout/0 and ends with it"));
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->ttl_deadline_ms(), 0);
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(ContainerSessions, ASessionOutlivesItsTrainerByTheLeaseThenCloses) {
  const std::string name = "cs/lease/0";
  std::string id;
  {
    // The trainer: its own connection, gone at the end of this block.
    ClientOptions o;
    o.address = daemon_->sdk_addr();
    o.data_dir = daemon_->data_dir();
    auto trainer = Client::Connect(o);
    ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
    SessionOptions so;
    so.lease_s = 2;
    auto s = (*trainer)->OpenSession(name, Spec(), so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    id = s->record().sandboxes(0).id();
    ASSERT_TRUE(s->Step(0, Count(0)).ok());
    // Longer than the lease, with the trainer still connected: still open.
    ASSERT_TRUE(client_->Run(FncallSpec(), Command({"sleep", "3"})).ok());
    auto r = s->Step(1, Count(1));
    ASSERT_TRUE(r.ok()) << r.status().ToString() << ": the session closed while its trainer was connected";
    EXPECT_EQ(r->step().result().stdout(), "2\n");
  }
  auto t0 = std::chrono::steady_clock::now();
  auto rec = WaitFor(name, [](const v1::SessionRecord& r) { return r.phase() == v1::SESSION_PHASE_CLOSED; });
  auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(rec.phase(), v1::SESSION_PHASE_CLOSED) << "the lease never ran out";
  EXPECT_GE(waited, 1.0) << "closed before the lease ran out";
  EXPECT_THAT(rec.close_reason(), HasSubstr("lease expired"));
  EXPECT_EQ(rec.step_count(), 2u);
  EXPECT_EQ(client_->Attach(id).status().code(), Status::Code::kNotFound);
  EXPECT_EQ(Remains(id), "");
}

TEST_F(ContainerSessions, ATrainerThatComesBackWithinTheLeaseContinues) {
  const std::string name = "cs/lease/1";
  SessionOptions so;
  so.lease_s = 2;
  {
    ClientOptions o;
    o.address = daemon_->sdk_addr();
    o.data_dir = daemon_->data_dir();
    auto trainer = Client::Connect(o);
    ASSERT_TRUE(trainer.ok());
    auto s = (*trainer)->OpenSession(name, Spec(), so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(s->Step(0, Count(0)).ok());
  }
  // The new trainer process re-attaches at once and keeps the session past
  // the first lease.
  auto s = client_->OpenSession(name, Spec(), so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(client_->Run(FncallSpec(), Command({"sleep", "3"})).ok());
  auto r = s->Step(1, Count(1));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step().result().stdout(), "2\n");
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(ContainerSessions, ASessionAndItsSandboxComeBackAfterKill9) {
  auto s = client_->OpenSession("cs/kill9/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (uint64_t k = 0; k < 3; ++k) ASSERT_TRUE(s->Step(k, Count(k)).ok());
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());
  // The client reconnects by itself; the trainer replays and continues.
  for (uint64_t k = 0; k < 3; ++k) {
    Result<v1::StepReply> r = Status::Unavailable("not yet");
    for (int attempt = 0; attempt < 100 && !r.ok(); ++attempt) {
      r = s->Step(k, Count(k));
      if (!r.ok() && r.status().code() != Status::Code::kUnavailable) break;
      if (!r.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->fast_forwarded());
  }
  auto r = s->Step(3, Count(3));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step().result().stdout(), "4\n") << "the sandbox kept its files across the restart";
  EXPECT_TRUE(s->Close().ok());
}

// A container's seccomp listener outlives dsecd: its agent keeps a copy,
// which the spawner of the next dsecd takes back. After a kill -9 the
// container's denied calls are still EPERM (not ENOSYS) and counted, and
// its writes to protected paths still flagged.
TEST_F(ContainerSessions, DeniedCallsAndRefusedWritesAreStillCountedAfterKill9) {
  char tmpl[] = "/tmp/dsec-listener-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string rootfs = tmpl;
  ASSERT_TRUE(MakeRootfs(rootfs).ok());
  ASSERT_EQ(RunProcess({"/bin/sh", "-c", "mkdir -p " + rootfs + "/work/repo/tests && echo x > " + rootfs +
                                             "/work/repo/tests/t.py && chmod -R a+rwX " + rootfs + "/work"})
                .exit_code,
            0);
  auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", rootfs, "relisten"});
  RunProcess({"/bin/rm", "-rf", rootfs});
  ASSERT_EQ(built.exit_code, 0) << built.err;
  v1::SandboxSpec spec = ContainerSpec("relisten");
  spec.mutable_task()->set_root("/work/repo");
  spec.mutable_task()->add_protected_paths("tests/**");
  auto s = client_->OpenSession("cs/relisten/0", spec);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Sh("true")).ok());
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());
  auto cheat = Sh("cd /work/repo && python3 -c 'import time; time.clock_settime(time.CLOCK_REALTIME, 2e9)' 2>&1 | "
                  "tail -1; echo y > tests/t.py; echo rc=$?");
  Result<v1::StepReply> r = Status::Unavailable("not yet");
  for (int attempt = 0; attempt < 100 && !r.ok(); ++attempt) {
    r = s->Step(1, cheat);
    if (!r.ok() && r.status().code() != Status::Code::kUnavailable) break;
    if (!r.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(r->step().result().stdout(), HasSubstr("PermissionError")) << "EPERM, not ENOSYS: the listener is back";
  EXPECT_THAT(r->step().result().stdout(), HasSubstr("rc=2"));
  std::vector<std::string> flags;
  for (const auto& f : r->step().flags()) flags.push_back(f.what() + ": " + f.evidence());
  EXPECT_THAT(flags, ::testing::UnorderedElementsAre(
                         "denied_syscall: clock_settime x1",
                         "write_refused: 1 write(s) refused by a read-only path (protected): openat tests/t.py x1"));
  EXPECT_TRUE(s->Close().ok());
}

// dsec-replay against this daemon: its data dir (read while it runs) or its
// SDK address.
ProcResult Replay(std::vector<std::string> args) {
  std::vector<std::string> argv{BinDir() + "/dsec-replay"};
  for (auto& a : args) argv.push_back(std::move(a));
  return RunProcess(argv);
}

TEST_F(ContainerSessions, ReplayShowsTheTimelineAndExportsJson) {
  auto s = client_->OpenSession("cs/replay/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Sh("echo hello")).ok());
  StepOptions rewarded;
  rewarded.meta.set_reward(1);
  ASSERT_TRUE(s->Step(1, Sh("echo oops >&2; exit 3"), rewarded).ok());
  auto text = Replay({"cs/replay/0", "--data-dir", daemon_->data_dir()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("session cs/replay/0  open  2 step(s)"));
  EXPECT_THAT(text.out, HasSubstr("#0"));
  EXPECT_THAT(text.out, HasSubstr("[agent]  $ /bin/sh -c echo hello"));
  EXPECT_THAT(text.out, HasSubstr("      hello"));
  EXPECT_THAT(text.out, HasSubstr("-> runtime_error, exit 3"));
  EXPECT_THAT(text.out, HasSubstr("reward 1"));
  EXPECT_THAT(text.out, HasSubstr("      oops"));
  for (auto source : {std::vector<std::string>{"--data-dir", daemon_->data_dir()},
                      std::vector<std::string>{"--addr", daemon_->sdk_addr(), "--sdk-token-file",
                                               daemon_->data_dir() + "/sdk.token"}}) {
    std::vector<std::string> args{"cs/replay/0", "--json"};
    args.insert(args.end(), source.begin(), source.end());
    auto out = Replay(args);
    ASSERT_EQ(out.exit_code, 0) << out.err;
    auto j = nlohmann::json::parse(out.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out.out;
    EXPECT_EQ(j["schema"], "dsec-replay/1");
    EXPECT_EQ(j["session"]["name"], "cs/replay/0");
    EXPECT_EQ(j["session"]["sandboxes"][0]["role"], "agent");
    ASSERT_EQ(j["steps"].size(), 2u);
    EXPECT_EQ(j["steps"][0]["stdout"], "hello\n");
    EXPECT_EQ(j["steps"][0]["argv"][2], "echo hello");
    EXPECT_EQ(j["steps"][1]["exit_code"], 3);
    EXPECT_EQ(j["steps"][1]["verdict"], "runtime_error");
    EXPECT_EQ(j["steps"][1]["stderr"], "oops\n");
    EXPECT_EQ(j["steps"][1]["meta"]["reward"], 1.0);
  }
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(ContainerSessions, RerunFindsTheFirstStepThatDiffers) {
  auto s = client_->OpenSession("cs/rerun/0", Spec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Sh("echo 1 > /work/n; cat /work/n")).ok());
  ASSERT_TRUE(s->Step(1, Sh("cat /work/n; cat /proc/sys/kernel/random/uuid")).ok());
  ASSERT_TRUE(s->Step(2, Sh("echo after")).ok());
  auto r = Replay({"cs/rerun/0", "--rerun", "--addr", daemon_->sdk_addr(), "--data-dir", daemon_->data_dir()});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 0 same"));
  EXPECT_THAT(r.out, HasSubstr("step 1 differs: stdout"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step 2")));
  // A deterministic rollout reruns clean: state carries from step to step
  // in the fresh sandbox as it did in the original.
  auto d = client_->OpenSession("cs/rerun/1", Spec());
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->Step(0, Sh("echo 1 > /work/n")).ok());
  ASSERT_TRUE(d->Step(1, Sh("cat /work/n")).ok());
  auto same = Replay({"cs/rerun/1", "--rerun", "--addr", daemon_->sdk_addr(), "--sdk-token-file",
                      daemon_->data_dir() + "/sdk.token"});
  EXPECT_EQ(same.exit_code, 0) << same.out << same.err;
  EXPECT_THAT(same.out, HasSubstr("all 2 step(s) gave the logged results"));
  // The rerun's sandboxes are gone: only the sessions' own remain.
  EXPECT_TRUE(s->Close().ok());
  EXPECT_TRUE(d->Close().ok());
  auto ls = daemon_->Admin("ls");
  EXPECT_EQ(ls.value("sandboxes", nlohmann::json::array()).size(), 0u) << "left behind: " << ls.dump();
}

TEST_F(ContainerSessions, TheExampleTrainerRewardsTheRolloutsThatFixTheBug) {
  // Scripted coding agent: buggy code, tests, run, fix (rollout 3 of every 4
  // fixes it wrongly), run again; reward 1 when the last run passes.
  auto r = RunProcess({BinDir() + "/dsec-rollout-trainer", "--addr", daemon_->sdk_addr(), "--data-dir",
                       daemon_->data_dir(), "--image", kImage,
                       "--job", "example", "--rollouts", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("finished 8 rollouts"));
  for (int i = 0; i < 8; ++i)
    EXPECT_THAT(r.out, HasSubstr("reward " + std::to_string(i) + (i % 4 == 3 ? " 0.000000" : " 1.000000"))) << r.out;
  // The reward is in the log, on the last step; the first test run failed.
  auto s = client_->AttachSession("example/task0/s0");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto steps = s->Steps();
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->steps_size(), 5);
  EXPECT_NE(steps->steps(2).result().exit_code(), 0);
  EXPECT_THAT(steps->steps(2).result().stderr(), HasSubstr("add(2, 3) != 5"));
  EXPECT_EQ(steps->steps(4).result().stdout(), "tests pass\n");
  EXPECT_DOUBLE_EQ(steps->steps(4).meta().reward(), 1.0);
  // Run again: every rollout is answered from its log; nothing runs twice.
  auto again = RunProcess({BinDir() + "/dsec-rollout-trainer", "--addr", daemon_->sdk_addr(), "--data-dir",
                           daemon_->data_dir(), "--image", kImage,
                           "--job", "example", "--rollouts", "8"});
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_THAT(again.out, ::testing::Not(HasSubstr(" run ")));
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(client_->AttachSession("example/task" + std::to_string(i) + "/s0")->Close().ok());
}

TEST_F(ContainerSessions, DsecctlSessionCommandsOpenStepShowClose) {
  const std::string name = "cli/p/0";
  auto open = daemon_->Ctl({"session", "open", name, "--kind", "container", "--image", kImage, "--lease", "120"});
  ASSERT_EQ(open.exit_code, 0) << open.err;
  EXPECT_THAT(open.out, HasSubstr("\"lease_s\": 120"));
  auto count = std::vector<std::string>{"--", "sh", "-c", "echo x >> f; wc -l < f"};
  auto step = [&](const std::string& index, std::vector<std::string> cmd) {
    std::vector<std::string> args{"session", "step", name, index};
    args.insert(args.end(), cmd.begin(), cmd.end());
    return daemon_->Ctl(args);
  };
  auto first = step("0", count);
  EXPECT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.out, "1\n");
  auto replay = step("0", count);
  EXPECT_EQ(replay.exit_code, 0) << replay.err;
  EXPECT_EQ(replay.out, "1\n");
  EXPECT_THAT(replay.err, HasSubstr("answered from the log"));
  auto failing = step("1", {"--", "sh", "-c", "exit 3"});
  EXPECT_EQ(failing.exit_code, 3) << "exits like dsecctl run";
  auto gap = step("5", count);
  EXPECT_EQ(gap.exit_code, 125);
  EXPECT_THAT(gap.err, HasSubstr("the next step is 2"));
  auto show = daemon_->Ctl({"session", "show", name});
  EXPECT_EQ(show.exit_code, 0) << show.err;
  EXPECT_THAT(show.out, HasSubstr("session cli/p/0: open, 2 step(s), lease 120 s"));
  EXPECT_THAT(show.out, HasSubstr("#1"));
  auto json = daemon_->Ctl({"session", "show", name, "--json"});
  auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  EXPECT_EQ(j["steps"].size(), 2u);
  EXPECT_EQ(daemon_->Ctl({"session", "close", name}).exit_code, 0);
  auto shown = daemon_->Ctl({"session", "show", name}).out;
  EXPECT_THAT(shown, HasSubstr("closed, 2 step(s)"));
  EXPECT_THAT(shown, HasSubstr("(closed by the trainer)"));
  // Operators see it on the console, closed sessions included.
  auto sessions = daemon_->Admin("sessions");
  ASSERT_TRUE(sessions.value("ok", false)) << sessions.dump();
  bool listed = false;
  for (const auto& se : sessions["sessions"])
    if (se.value("name", "") == name) {
      listed = true;
      EXPECT_EQ(se.value("phase", ""), "closed");
      EXPECT_EQ(se.value("steps", 0), 2);
    }
  EXPECT_TRUE(listed) << sessions.dump();
  auto inspect = daemon_->Admin("inspect " + name);
  ASSERT_TRUE(inspect.value("ok", false)) << inspect.dump();
  EXPECT_EQ(inspect["session"].value("phase", ""), "closed");
  auto unknown = daemon_->Ctl({"session", "show", "no/such/0"});
  EXPECT_EQ(unknown.exit_code, 125);
  EXPECT_THAT(unknown.err, HasSubstr("not found"));
}

TEST_F(ContainerSessions, ReplayOfAnUnknownSessionSaysSo) {
  auto r = Replay({"no/such/session", "--data-dir", daemon_->data_dir()});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("no session 'no/such/session'"));
  auto a = Replay({"no/such/session", "--addr", daemon_->sdk_addr(), "--sdk-token-file",
                   daemon_->data_dir() + "/sdk.token"});
  EXPECT_EQ(a.exit_code, 3);
  EXPECT_THAT(a.err, HasSubstr("not found"));
  auto bad = Replay({"x", "--data-dir", "/nonexistent"});
  EXPECT_EQ(bad.exit_code, 3);
  EXPECT_THAT(bad.err, HasSubstr("/nonexistent"));
}

// A task guard (spec.task, drivers/guard) on a session's agent sandbox:
// the hidden grader is not there at all, the protected tests are readable
// and read-only even for root, and a protected path the agent makes
// anyway (a conftest.py) is flagged once, in the step that made it; an
// honest fix raises nothing.
TEST_F(ContainerSessions, ATaskGuardHidesProtectsAndFlagsWhatTheAgentDoes) {
  char tmpl[] = "/tmp/dsec-guard-task-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string rootfs = tmpl;
  ASSERT_TRUE(MakeRootfs(rootfs).ok());
  ASSERT_TRUE(RunProcess({"/bin/sh", "-c",
                          "cd " + rootfs + " && mkdir -p work/repo/tests work/repo/src work/repo/grader && "
                          "echo 'from src.calc import add' > work/repo/tests/test_calc.py && "
                          "echo 'def add(a, b): return a - b' > work/repo/src/calc.py && "
                          "echo 'the hidden grader' > work/repo/grader/grade.py && chmod -R a+rwX work && "
                          "ln -s /nonexistent/dsec-guard work/repo/link"})
                  .exit_code == 0);
  auto built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", rootfs, "guarded"});
  RunProcess({"/bin/rm", "-rf", rootfs});
  ASSERT_EQ(built.exit_code, 0) << built.err;
  v1::SandboxSpec spec = ContainerSpec("guarded");
  auto* task = spec.mutable_task();
  task->set_root("/work/repo");
  task->add_protected_paths("tests/**");
  task->add_protected_paths("**/conftest.py");
  task->add_protected_paths("link");  // a symlink: never followed by the guard's mounts (it dangles here)
  task->add_hidden_paths("grader/**");
  auto s = client_->OpenSession("cs/guard/0", spec);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto step = [&](uint64_t k, const std::string& sh) {
    auto r = s->Step(k, Sh("cd /work/repo && " + sh));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->step() : v1::StepRecord();
  };
  auto flags = [](const v1::StepRecord& st) {
    std::vector<std::string> out;
    for (const auto& f : st.flags()) out.push_back(f.what() + ": " + f.evidence());
    return out;
  };
  auto look = step(0, "ls; cat tests/test_calc.py; cat grader/grade.py 2>&1; ls grader 2>&1; true");
  EXPECT_THAT(look.result().stdout(), HasSubstr("src\ntests\nfrom src.calc import add\n"));
  EXPECT_THAT(look.result().stdout(), ::testing::Not(HasSubstr("grader\n"))) << "hidden: not listed";
  EXPECT_THAT(look.result().stdout(), ::testing::Not(HasSubstr("the hidden grader"))) << "hidden: not read";
  EXPECT_THAT(flags(look), ::testing::IsEmpty());
  auto cheat = step(1, "echo 'def test_x(): assert True' > tests/test_calc.py; echo rc=$?; rm tests/test_calc.py; "
                       "echo rc=$?; mv tests t2; echo rc=$?");
  EXPECT_EQ(cheat.result().stdout(), "rc=2\nrc=1\nrc=1\n") << "protected, for root too (sh: 2 for a redirection): " << cheat.result().stderr();
  EXPECT_THAT(cheat.result().stderr(), HasSubstr("Read-only file system"));
  ASSERT_EQ(cheat.flags_size(), 1) << "the tries are flagged: " << ::testing::PrintToString(flags(cheat));
  EXPECT_EQ(cheat.flags(0).what(), "write_refused");
  EXPECT_THAT(cheat.flags(0).evidence(), HasSubstr("openat tests/test_calc.py x1, "));
  EXPECT_THAT(cheat.flags(0).evidence(), HasSubstr("unlinkat tests/test_calc.py x1"));
  auto conftest = step(2, "echo 'import pytest' > conftest.py && echo made");
  EXPECT_EQ(conftest.result().stdout(), "made\n") << "a new file cannot be stopped by a mount";
  EXPECT_THAT(flags(conftest), ::testing::ElementsAre("protected_write: created conftest.py")) << "but it is flagged";
  // The trainer's own file call through the agent is refused the same way
  // and is not the agent's misbehaviour: no flag at the next step.
  auto sandbox = s->sandbox();
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  EXPECT_FALSE(sandbox->WriteFile("/work/repo/tests/test_calc.py", "x", 0644).ok());
  auto fix = step(3, "echo 'def add(a, b): return a + b' > src/calc.py && echo fixed");
  EXPECT_EQ(fix.result().stdout(), "fixed\n");
  EXPECT_THAT(flags(fix), ::testing::IsEmpty())
      << "an honest fix, the conftest.py is not flagged again, the trainer's WriteFile is not the agent's";
  // The flags are in the durable log (what Report and dsec-replay read).
  auto logged = s->Steps(0, 10);
  ASSERT_TRUE(logged.ok()) << logged.status().ToString();
  ASSERT_EQ(logged->steps_size(), 4);
  EXPECT_EQ(logged->steps(2).flags_size(), 1);
  auto report = Report(*s);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->size(), 2u) << "the session's whole misbehaviour report";
  EXPECT_EQ((*report)[0].step, 1u);
  EXPECT_EQ((*report)[0].flag.what(), "write_refused");
  EXPECT_EQ((*report)[1].step, 2u);
  EXPECT_EQ((*report)[1].flag.evidence(), "created conftest.py");
  auto ctl = daemon_->Ctl({"session", "report", "cs/guard/0"});
  EXPECT_THAT(ctl.out, HasSubstr("step 2  protected_write  created conftest.py\n")) << ctl.err;
  auto shown = RunProcess({BinDir() + "/dsec-replay", "cs/guard/0", "--data-dir", daemon_->data_dir()});
  EXPECT_THAT(shown.out, HasSubstr("    FLAG protected_write: created conftest.py\n")) << shown.err;
  auto json_out = RunProcess({BinDir() + "/dsec-replay", "cs/guard/0", "--json", "--data-dir", daemon_->data_dir()});
  EXPECT_THAT(json_out.out, HasSubstr("\"evidence\": \"created conftest.py\"")) << json_out.err;
  EXPECT_TRUE(s->Close().ok());

  // A bad glob is refused at the open, naming it; a kind that cannot guard says so.
  v1::SandboxSpec bad = spec;
  bad.mutable_task()->add_hidden_paths("a**");
  auto refused = client_->OpenSession("cs/guard/1", bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("'a**'"));
}

}  // namespace
}  // namespace dsec::testing
