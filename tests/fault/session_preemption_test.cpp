// Rollouts survive their trainer and their daemon (issue 4, acceptance 1-2):
// no step is lost and none runs twice, whichever of the two is killed.
//
// Also: a session or sandbox actor that crashes mid-exec answers what it
// holds at once, and the re-sent step or keyed exec runs once.
//
// The trainer is the example dsec-rollout-trainer, a real process, on the
// "count" task: step k appends a line to /work/steps and prints the line
// count, so the file and the log show whether a step ran twice or was lost.
#include <gmock/gmock.h>

#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/container_fixture.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

// A step that says it started, then holds until the test creates /work/go.
constexpr const char* kHeldStep =
    "touch /work/started; while [ ! -e /work/go ]; do sleep 0.01; done; echo x >> /work/n; wc -l < /work/n";

// Polls for `path` in `sb` (30 s at most, through actor restarts).
bool WaitForFile(const Sandbox& sb, const std::string& path) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!sb.ReadFile(path).ok()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the sandbox, bounded
  }
  return true;
}

class SessionPreemption : public ContainerTest {
 protected:
  // A client with short timeouts: a request a crash left unanswered shows.
  static Result<std::unique_ptr<Client>> ImpatientClient() {
    ClientOptions o;
    o.address = daemon_->sdk_addr();
    o.data_dir = daemon_->data_dir();
    o.rpc_timeout = std::chrono::milliseconds(2000);
    return Client::Connect(o);
  }

  std::vector<std::string> TrainerArgs(const std::string& job, int rollouts, int steps, bool strict) {
    std::vector<std::string> argv{BinDir() + "/dsec-rollout-trainer", "--addr", daemon_->sdk_addr(),
                                  "--data-dir", daemon_->data_dir(),
                                  "--job", job, "--task", "count", "--image", kImage,
                                  "--rollouts", std::to_string(rollouts), "--steps", std::to_string(steps)};
    if (strict) argv.push_back("--strict-count");
    return argv;
  }

  // After the rollouts: every session has `steps` steps, step k printed k+1
  // (strict) or at least its log matches what the trainer was told, and the
  // file in the sandbox has one line per step (strict). Closes them.
  void CheckAndClose(const std::string& job, int rollouts, int steps, bool strict,
                     const std::map<std::pair<int, int>, std::string>& acked) {
    for (int r = 0; r < rollouts; ++r) {
      std::string name = job + "/task" + std::to_string(r) + "/s0";
      auto s = client_->AttachSession(name);
      ASSERT_TRUE(s.ok()) << name << ": " << s.status().ToString();
      auto log = s->Steps();
      ASSERT_TRUE(log.ok()) << log.status().ToString();
      ASSERT_EQ(log->steps_size(), steps) << name;
      for (int k = 0; k < steps; ++k) {
        std::string out = log->steps(k).result().stdout();
        if (strict) {
          EXPECT_EQ(out, std::to_string(k + 1) + "\n") << name << " step " << k;
        }
        auto it = acked.find({r, k});
        if (it != acked.end()) {
          EXPECT_EQ(out, it->second + "\n") << name << " step " << k << ": acknowledged, then lost";
        }
      }
      if (strict) {
        auto sb = s->sandbox();
        ASSERT_TRUE(sb.ok()) << sb.status().ToString();
        auto file = sb->ReadFile("/work/steps");
        ASSERT_TRUE(file.ok()) << file.status().ToString();
        EXPECT_EQ(std::count(file->begin(), file->end(), '\n'), steps) << name << ": a step ran twice or was lost";
      }
      EXPECT_TRUE(s->Close().ok()) << name;
    }
  }

  // Parses "step R K run|ff OUTPUT".
  static bool ParseStep(const std::string& line, int* r, int* k, std::string* out) {
    std::istringstream in(line);
    std::string word, how;
    if (!(in >> word >> *r >> *k >> how) || word != "step") return false;
    std::getline(in >> std::ws, *out);
    return true;
  }
};

TEST_F(SessionPreemption, KilledTrainerRestartedThreeTimesLosesNoStepAndRunsNoneTwice) {
  constexpr int kRollouts = 100, kSteps = 20;
  std::mt19937 rng(std::random_device{}());
  std::map<std::pair<int, int>, std::string> acked;
  // Three kills at random points of the 2 000 steps; each restarted trainer
  // replays from step 0.
  int kills = 0;
  // Per trainer: the steps it was told were logged before it started (and
  // so must replay, "ff"), and the steps it replayed.
  std::vector<size_t> known_at_start;
  std::vector<size_t> replayed;
  for (int lo : {100, 600, 1100}) {
    int at = std::uniform_int_distribution<int>(lo, lo + 400)(rng);
    auto trainer = Child::Start(TrainerArgs("pre", kRollouts, kSteps, true));
    ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
    known_at_start.push_back(acked.size());
    replayed.push_back(0);
    std::string line;
    bool finished = false;
    while ((*trainer)->ReadLine(&line)) {
      int r, k;
      std::string out;
      if (ParseStep(line, &r, &k, &out)) {
        acked[{r, k}] = out;
        if (line.find(" ff ") != std::string::npos) ++replayed.back();
      }
      ASSERT_THAT(line, ::testing::Not(HasSubstr("MISMATCH")));
      if (line.rfind("finished", 0) == 0) finished = true;
      if (acked.size() >= static_cast<size_t>(at)) break;
    }
    ASSERT_FALSE(finished) << "the trainer finished before kill " << kills + 1 << " (at " << at << " steps)";
    (*trainer)->Kill9();
    EXPECT_EQ((*trainer)->Wait(), 128 + SIGKILL);
    ++kills;
  }
  auto last = Child::Start(TrainerArgs("pre", kRollouts, kSteps, true));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  known_at_start.push_back(acked.size());
  replayed.push_back(0);
  std::string line, finished;
  while ((*last)->ReadLine(&line, 300)) {
    int r, k;
    std::string out;
    if (ParseStep(line, &r, &k, &out)) {
      acked[{r, k}] = out;
      if (line.find(" ff ") != std::string::npos) ++replayed.back();
    }
    EXPECT_THAT(line, ::testing::Not(HasSubstr("MISMATCH")));
    EXPECT_THAT(line, ::testing::Not(HasSubstr("error")));
    if (line.rfind("finished", 0) == 0) finished = line;
  }
  EXPECT_EQ((*last)->Wait(), 0);
  EXPECT_EQ(finished, "finished " + std::to_string(kRollouts) + " rollouts");
  // Each kill cut a trainer mid-run: the next one found at least what its
  // predecessors had been told logged and replayed it (the first had
  // nothing to replay).
  ASSERT_EQ(known_at_start.size(), 4u);
  EXPECT_EQ(replayed[0], 0u);
  for (size_t i = 1; i < known_at_start.size(); ++i) {
    EXPECT_GT(known_at_start[i], known_at_start[i - 1]) << "trainer " << i << " was killed before it logged a step";
    EXPECT_GE(replayed[i], known_at_start[i]) << "trainer " << i + 1 << " did not replay all that was logged before it";
  }
  EXPECT_EQ(acked.size(), static_cast<size_t>(kRollouts * kSteps));
  CheckAndClose("pre", kRollouts, kSteps, true, acked);
}

TEST_F(SessionPreemption, Kill9OfDsecdLosesNoAcknowledgedStep) {
  constexpr int kRollouts = 200, kSteps = 10;
  auto trainer = Child::Start(TrainerArgs("crash", kRollouts, kSteps, true));
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  std::map<std::pair<int, int>, std::string> acked;
  std::string line, finished;
  bool killed = false;
  std::mt19937 rng(std::random_device{}());
  int at = std::uniform_int_distribution<int>(300, 900)(rng);
  while ((*trainer)->ReadLine(&line, 300)) {
    int r, k;
    std::string out;
    if (ParseStep(line, &r, &k, &out)) {
      auto it = acked.find({r, k});
      // What the trainer was told about a step never changes, crash or not.
      if (it != acked.end()) {
        EXPECT_EQ(it->second, out) << "rollout " << r << " step " << k;
      }
      acked[{r, k}] = out;
    }
    EXPECT_THAT(line, ::testing::Not(HasSubstr("error")));
    if (line.rfind("finished", 0) == 0) finished = line;
    if (!killed && acked.size() >= static_cast<size_t>(at)) {
      // The trainer keeps going: its client reconnects, its steps retry.
      daemon_->Kill9();
      ASSERT_TRUE(daemon_->Restart().ok());
      killed = true;
    }
  }
  EXPECT_TRUE(killed) << "the trainer finished before " << at << " steps";
  EXPECT_EQ((*trainer)->Wait(), 0);
  EXPECT_EQ(finished, "finished " + std::to_string(kRollouts) + " rollouts");
  EXPECT_EQ(acked.size(), static_cast<size_t>(kRollouts * kSteps));
  CheckAndClose("crash", kRollouts, kSteps, true, acked);
}

TEST_F(SessionPreemption, ASessionActorThatCrashesMidStepIsRestartedAndTheStepRunsOnce) {
  auto trainer = ImpatientClient();
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto s = (*trainer)->OpenSession("crash/actor/0", ContainerSpec(kImage));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  v1::Limits limits;
  limits.set_timeout_ms(30000);
  // The step holds until the test creates /work/go: it cannot end by itself
  // while its session actor dies.
  auto slow = Sh(kHeldStep, limits);
  auto pending = s->StepAsync(0, slow);
  auto sb = s->sandbox();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_TRUE(WaitForFile(*sb, "/work/started")) << "the step never started";
  ASSERT_TRUE(daemon_->Admin("crash crash/actor/0").value("ok", false));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "answered only at its timeout";
  // The run the crash left is still in the container, held.
  EXPECT_EQ(sb->ReadFile("/work/n").status().code(), Status::Code::kNotFound) << "the held step ended";
  ASSERT_TRUE(sb->WriteFile("/work/go", "").ok());
  // The trainer re-sends the step; the restarted actor collects the run the
  // crash left in the container instead of starting another.
  Result<v1::StepReply> again = s->Step(0, slow);
  for (int i = 0; i < 50 && !again.ok() && again.status().code() == Status::Code::kUnavailable; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    again = s->Step(0, slow);
  }
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->step().result().stdout(), "1\n") << "the step ran twice";
  auto next = s->Step(1, Sh("echo x >> /work/n; wc -l < /work/n"));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step().result().stdout(), "2\n");
  auto inspect = daemon_->Admin("inspect crash/actor/0");
  EXPECT_EQ(inspect["session"].value("restarts", 0), 1) << inspect.dump();
  // The request the crashed actor held was answered at once, not left to
  // time out, and said to resend.
  auto first = pending.get();
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(first.status().message(), HasSubstr("resend the step"));
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(SessionPreemption, ASandboxActorThatCrashesAnswersItsExecsAtOnce) {
  auto c = ImpatientClient();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto sb = (*c)->Create(ContainerSpec(kImage));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  v1::Limits limits;
  limits.set_timeout_ms(30000);
  auto req = Sh(kHeldStep, limits);  // held until /work/go exists
  req.set_idempotency_key("once");
  auto pending = sb->ExecAsync(req);
  ASSERT_TRUE(WaitForFile(*sb, "/work/started")) << "the exec never started";
  ASSERT_TRUE(daemon_->Admin("crash " + sb->id()).value("ok", false));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "answered only at its timeout";
  auto first = pending.get();
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(first.status().message(), HasSubstr("idempotency_key"));
  // Sent again with the same key, it gets the run the crash left going
  // (released now): once.
  ASSERT_TRUE(WaitForFile(*sb, "/work/started"));  // the restarted actor serves files again
  EXPECT_EQ(sb->ReadFile("/work/n").status().code(), Status::Code::kNotFound) << "the held exec ended";
  ASSERT_TRUE(sb->WriteFile("/work/go", "").ok());
  Result<v1::ExecResult> again = sb->Exec(req);
  for (int i = 0; i < 50 && !again.ok() && again.status().code() == Status::Code::kUnavailable; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    again = sb->Exec(req);
  }
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->stdout(), "1\n");
  auto same_key_other_cmd = sb->Exec([&] {
    auto other = Sh("echo other");
    other.set_idempotency_key("once");
    return other;
  }());
  ASSERT_FALSE(same_key_other_cmd.ok());
  EXPECT_EQ(same_key_other_cmd.status().code(), Status::Code::kAlreadyExists);
  EXPECT_THAT(same_key_other_cmd.status().message(), HasSubstr("key 'once' was used for another command"));
  EXPECT_TRUE(sb->Destroy().ok());
}

}  // namespace
}  // namespace dsec::testing
