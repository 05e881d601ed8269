// The minimal rollout session of the foundation: idempotent open, steps in
// order, fast-forward from the durable log, errors for gaps and mismatches.
#include <gmock/gmock.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using Sessions = DaemonTest;

// A step whose output differs on every execution, so a fast-forward (which
// returns the logged output) is told apart from a re-run.
v1::ExecRequest Stamp() { return Command({"sh", "-c", "cat /proc/sys/kernel/random/uuid"}); }

TEST_F(Sessions, StepsRunInOrderAndReplayFastForwards) {
  auto s = client_->OpenSession("job1/prompt1/s0", FncallSpec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<std::string> outputs;
  for (uint64_t i = 0; i < 5; ++i) {
    auto r = s->Step(i, Stamp());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->fast_forwarded());
    EXPECT_EQ(r->step().index(), i);
    outputs.push_back(r->step().result().stdout());
  }
  EXPECT_NE(outputs[0], outputs[1]);
  // A restarted trainer replays from 0: answered from the log, not re-run.
  auto again = client_->OpenSession("job1/prompt1/s0", FncallSpec());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (uint64_t i = 0; i < 5; ++i) {
    auto r = again->Step(i, Stamp());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->fast_forwarded());
    EXPECT_EQ(r->step().result().stdout(), outputs[i]);
  }
  auto next = again->Step(5, Stamp());
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->fast_forwarded());
  auto rec = again->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->step_count(), 6u);
}

// The callback forms: each session's next step and annotation issued from
// the callback of its previous one, several sessions at once, no thread each.
TEST_F(Sessions, CallbacksChainStepsAndAnnotationsOfSeveralSessions) {
  constexpr int kSessions = 4, kSteps = 5;
  std::vector<Session> open;
  for (int i = 0; i < kSessions; ++i) {
    auto s = client_->OpenSession("job1/callbacks/s" + std::to_string(i), FncallSpec());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    open.push_back(*s);
  }
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::string> errors;
  std::vector<std::vector<std::string>> outputs(kSessions);
  std::function<void(int, int)> step = [&](int i, int k) {
    if (k == kSteps) {
      std::lock_guard<std::mutex> lk(mu);
      ++finished;
      cv.notify_all();
      return;
    }
    open[i].StepAsync(k, Command({"echo", std::to_string(i) + "-" + std::to_string(k)}), {},
                      [&, i, k](Result<v1::StepReply> r) {
                        if (!r.ok()) {
                          std::lock_guard<std::mutex> lk(mu);
                          errors.push_back(r.status().ToString());
                          ++finished;
                          cv.notify_all();
                          return;
                        }
                        outputs[i].push_back(r->step().result().stdout());
                        v1::StepMeta meta;
                        meta.set_reward(10 * i + k);
                        open[i].AnnotateAsync(k, meta, [&, i, k](Result<v1::StepMeta> m) {
                          if (!m.ok() || m->reward() != 10 * i + k) {
                            std::lock_guard<std::mutex> lk(mu);
                            errors.push_back(m.ok() ? "wrong reward" : m.status().ToString());
                          }
                          step(i, k + 1);
                        });
                      });
  };
  for (int i = 0; i < kSessions; ++i) step(i, 0);
  std::unique_lock<std::mutex> lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return finished == kSessions; }));
  EXPECT_THAT(errors, ::testing::IsEmpty());
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_EQ(outputs[i].size(), static_cast<size_t>(kSteps));
    for (int k = 0; k < kSteps; ++k) EXPECT_EQ(outputs[i][k], std::to_string(i) + "-" + std::to_string(k) + "\n");
    auto logged = open[i].Steps();
    ASSERT_TRUE(logged.ok()) << logged.status().ToString();
    ASSERT_EQ(logged->steps_size(), kSteps);
    for (int k = 0; k < kSteps; ++k) EXPECT_DOUBLE_EQ(logged->steps(k).meta().reward(), 10 * i + k);
  }
}

// Annotations travel in batches, but calls still reach dsecd in the order
// they were issued: an annotation issued before a close lands before it.
TEST_F(Sessions, AnAnnotationIssuedBeforeACloseLandsFirst) {
  auto s = client_->OpenSession("job1/ordered/s0", FncallSpec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Step(0, Command({"true"})).ok());
  v1::StepMeta meta;
  meta.set_reward(7);
  auto noted = s->AnnotateAsync(0, meta);
  auto closed = s->Close();
  ASSERT_TRUE(closed.ok()) << closed.ToString();
  auto r = noted.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->reward(), 7);
}

TEST_F(Sessions, ReplayWithADifferentRequestNamesSessionAndStep) {
  auto s = client_->OpenSession("job1/prompt2/s0", FncallSpec());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Step(0, Command({"echo", "a"})).ok());
  auto r = s->Step(0, Command({"echo", "b"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("job1/prompt2/s0"));
  EXPECT_THAT(r.status().message(), HasSubstr("step 0"));
}

TEST_F(Sessions, AGapIsAnError) {
  auto s = client_->OpenSession("job1/prompt3/s0", FncallSpec());
  ASSERT_TRUE(s.ok());
  auto r = s->Step(3, Command({"true"}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("ahead of the log"));
  EXPECT_THAT(r.status().message(), HasSubstr("job1/prompt3/s0"));
}

TEST_F(Sessions, ReopenWithAnotherSpecIsRefused) {
  ASSERT_TRUE(client_->OpenSession("job1/prompt4/s0", FncallSpec()).ok());
  v1::SandboxSpec other = FncallSpec();
  other.mutable_limits()->set_memory_bytes(64 << 20);
  auto r = client_->OpenSession("job1/prompt4/s0", other);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("different spec"));
}

TEST_F(Sessions, ClosedSessionRefusesSteps) {
  auto s = client_->OpenSession("job1/prompt5/s0", FncallSpec());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Step(0, Command({"true"})).ok());
  ASSERT_TRUE(s->Close().ok());
  auto r = s->Step(1, Command({"true"}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("closed"));
}

TEST_F(Sessions, ASessionKilledFromTheConsoleIsRecordedAsAnOperatorsKill) {
  auto s = client_->OpenSession("job1/killed/s0", FncallSpec());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto killed = daemon_->Admin("kill job1/killed/s0");
  ASSERT_TRUE(killed.value("ok", false)) << killed.dump();
  auto rec = s->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SESSION_PHASE_CLOSED);
  EXPECT_EQ(rec->close_reason(), "killed by an operator (admin console)");
  auto inspected = daemon_->Admin("inspect job1/killed/s0");
  EXPECT_NE(inspected.dump().find("killed by an operator"), std::string::npos) << inspected.dump();
}

TEST_F(Sessions, AttachToUnknownSessionIsNotFound) {
  auto s = client_->AttachSession("never/opened/0");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kNotFound);
}

TEST_F(Sessions, StepsComeBackInPages) {
  auto s = client_->OpenSession("job1/pages/s0", FncallSpec());
  ASSERT_TRUE(s.ok());
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(s->Step(i, Command({"echo", std::to_string(i)})).ok());
  auto page = s->Steps(2, 2);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->steps_size(), 2);
  EXPECT_EQ(page->steps(0).index(), 2u);
  EXPECT_EQ(page->steps(1).result().stdout(), "3\n");
  EXPECT_EQ(page->session().step_count(), 5u);
  auto past = s->Steps(9);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(past->steps_size(), 0);
}

TEST_F(Sessions, OpenRefusesBadRolesLeasesAndSizesAndLeavesNothing) {
  SessionOptions twice;
  twice.more_sandboxes = {{"eval", FncallSpec()}, {"eval", FncallSpec()}};
  auto r = client_->OpenSession("bad/p/0", FncallSpec(), twice);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("role 'eval' is given twice"));
  SessionOptions agent;
  agent.more_sandboxes = {{"agent", FncallSpec()}};
  EXPECT_THAT(client_->OpenSession("bad/p/0", FncallSpec(), agent).status().message(),
              HasSubstr("'agent' is the spec the session is opened with"));
  SessionOptions upper;
  upper.more_sandboxes = {{"Eval!", FncallSpec()}};
  EXPECT_THAT(client_->OpenSession("bad/p/0", FncallSpec(), upper).status().message(), HasSubstr("[a-z0-9_-]"));
  SessionOptions many;
  for (int i = 0; i < 8; ++i) many.more_sandboxes.push_back({"r" + std::to_string(i), FncallSpec()});
  EXPECT_THAT(client_->OpenSession("bad/p/0", FncallSpec(), many).status().message(), HasSubstr("the limit is 8"));
  SessionOptions lease;
  lease.lease_s = 30 * 24 * 3600;
  EXPECT_THAT(client_->OpenSession("bad/p/0", FncallSpec(), lease).status().message(), HasSubstr("7 days"));
  EXPECT_THAT(client_->OpenSession(std::string(600, 'x'), FncallSpec()).status().message(), HasSubstr("512"));
  EXPECT_EQ(client_->AttachSession("bad/p/0").status().code(), Status::Code::kNotFound) << "refused opens leave nothing";
}

TEST_F(Sessions, CreateWithAnInvalidOrTakenIdIsRefused) {
  auto bad = client_->Create(FncallSpec(), "Bad_Id");
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("sandbox id 'Bad_Id' must be"));
  auto named = client_->Create(FncallSpec(), "my-box-1");
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ(named->id(), "my-box-1");
  auto taken = client_->Create(FncallSpec(), "my-box-1");
  EXPECT_EQ(taken.status().code(), Status::Code::kAlreadyExists);
  EXPECT_THAT(taken.status().message(), HasSubstr("sandbox id 'my-box-1' is taken"));
  EXPECT_TRUE(named->Destroy().ok());
  auto again = client_->Create(FncallSpec(), "my-box-1");
  EXPECT_TRUE(again.ok()) << "free again once destroyed: " << again.status().ToString();
  if (again.ok()) {
    EXPECT_TRUE(again->Destroy().ok());
  }
}

TEST(SessionRetention, ClosedSessionsArePurgedAfterTheRetentionLimit) {
  // Retention of 1.8 s: the node sweeps every second.
  TestDaemonOptions o;
  o.extra_args = {"--session-retention", "0.0005"};
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> client;
  if (auto why = StartOwnDaemon(o, &d, &client); !why.empty()) GTEST_SKIP() << why;
  auto open = client->OpenSession("retention/p/0", FncallSpec());
  auto closed = client->OpenSession("retention/p/1", FncallSpec());
  ASSERT_TRUE(open.ok() && closed.ok());
  ASSERT_TRUE(open->Step(0, Command({"true"})).ok());
  ASSERT_TRUE(closed->Step(0, Command({"true"})).ok());
  ASSERT_TRUE(closed->Close().ok());
  EXPECT_TRUE(closed->Steps().ok()) << "kept right after the close";
  Status gone = Status::Ok();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (gone.ok() && std::chrono::steady_clock::now() < deadline) {
    gone = closed->Steps().status();
    if (gone.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(gone.code(), Status::Code::kNotFound) << gone.ToString();
  EXPECT_THAT(gone.message(), HasSubstr("retention"));
  // An open session is never purged, however old.
  auto steps = open->Steps();
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_EQ(steps->steps_size(), 1);
}

TEST(SessionReplay, ReadsTheDataDirOfAStoppedDaemon) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> client;
  if (auto why = StartOwnDaemon({}, &d, &client); !why.empty()) GTEST_SKIP() << why;
  auto s = client->OpenSession("stopped/p/0", FncallSpec());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Step(0, Command({"echo", "first"})).ok());
  ASSERT_TRUE(s->Step(1, Command({"echo", "second"})).ok());
  client.reset();
  ASSERT_EQ(d->Stop(), 0);
  auto r = RunProcess({BinDir() + "/dsec-replay", "stopped/p/0", "--data-dir", d->data_dir()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("session stopped/p/0  open  2 step(s)"));
  EXPECT_THAT(r.out, HasSubstr("$ echo first"));
  EXPECT_THAT(r.out, HasSubstr("      second"));
  EXPECT_THAT(r.out, HasSubstr("(fresh per step)")) << "a fncall session has no sandbox to keep";
}

}  // namespace
}  // namespace dsec::testing
