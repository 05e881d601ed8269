// An example RL trainer: K concurrent multi-step rollouts, each in its own
// rollout session, through the SDK. Kill it at any point and start it again
// with the same --job: every rollout re-issues its steps from 0, the steps
// already in a session's log come back at once without running again
// (fast-forward), and the rollout goes on where it was.
//
// Tasks (the scripted "agent" of each rollout):
//   coding  write a buggy solution and its tests, run the tests, fix the
//           code (one rollout in four fixes it wrongly), run them again; the
//           reward is 1 when the last run passes, logged with that step.
//   count   each step appends a line to /work/steps and prints the line
//           count: step k must print k+1, which holds only if no step ran
//           twice and none was lost (--strict-count checks it).
//
// Output, one line each, flushed: "step R K run|ff OUTPUT" per acknowledged
// step, "reward R X" per finished rollout, then "finished N rollouts".
// Sessions stay open for their lease once done (a run again with the same
// --job fast-forwards through them); --close closes each one when its
// rollout is done (its sandbox goes; its log stays for dsec-replay).
// Exit: 0 all finished (and, with --strict-count, all counts right); 1 a
// rollout failed; 2 bad usage.
//
//   dsec-rollout-trainer --image tools --rollouts 16 --job demo
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsec/client.hpp"

namespace {

struct Flags {
  std::string addr, data_dir;
  std::string job = "demo";
  std::string image;
  std::string kind = "container";
  std::string task = "coding";
  int rollouts = 16;
  int steps = 20;
  bool strict_count = false;
  bool close = false;
  double retry_s = 120;
  uint32_t lease_s = 0;
};

std::mutex out_mu;
void Say(const std::string& line) {
  std::lock_guard<std::mutex> lk(out_mu);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// An error worth retrying: the daemon is restarting or busy.
bool Transient(const dsec::Status& s) {
  return s.code() == dsec::Status::Code::kUnavailable || s.code() == dsec::Status::Code::kDeadlineExceeded;
}

template <class F>
auto Retry(const Flags& f, F call) -> decltype(call()) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(f.retry_s);
  for (auto backoff = std::chrono::milliseconds(50);; backoff = std::min(backoff * 2, std::chrono::milliseconds(1000))) {
    auto r = call();
    if (r.ok() || !Transient(r.status()) || std::chrono::steady_clock::now() > deadline) return r;
    std::this_thread::sleep_for(backoff);
  }
}

dsec::v1::ExecRequest Sh(const std::string& script, const std::string& stdin_data = {}) {
  auto req = dsec::Command({"sh", "-c", script});
  req.set_stdin(stdin_data);
  return req;
}

// The scripted agent's actions for rollout r: step k of the plan.
std::vector<dsec::v1::ExecRequest> Plan(const Flags& f, int r) {
  std::vector<dsec::v1::ExecRequest> plan;
  if (f.task == "count") {
    for (int k = 0; k < f.steps; ++k) plan.push_back(Sh("echo " + std::to_string(k) + " >> /work/steps; wc -l < /work/steps"));
    return plan;
  }
  const char* tests =
      "from solution import add\n"
      "assert add(2, 3) == 5, 'add(2, 3) != 5'\n"
      "assert add(-1, 1) == 0, 'add(-1, 1) != 0'\n"
      "print('tests pass')\n";
  // python3 -B: a fix written within the same second and of the same size
  // as the buggy file would otherwise be shadowed by its cached bytecode.
  plan.push_back(Sh("cat > solution.py", "def add(a, b):\n    return a - b\n"));
  plan.push_back(Sh("cat > test_solution.py", tests));
  plan.push_back(Sh("python3 -B test_solution.py"));
  plan.push_back(Sh("cat > solution.py", r % 4 == 3 ? "def add(a, b):\n    return a * b\n"
                                                    : "def add(a, b):\n    return a + b\n"));
  plan.push_back(Sh("python3 -B test_solution.py"));
  return plan;
}

// One rollout, from step 0: true when it finished (and counted right).
bool Rollout(dsec::Client& client, const Flags& f, const dsec::v1::SandboxSpec& spec, int r) {
  std::string name = f.job + "/task" + std::to_string(r) + "/s0";
  dsec::SessionOptions options;
  options.lease_s = f.lease_s;
  auto session = Retry(f, [&] { return client.OpenSession(name, spec, options); });
  if (!session.ok()) {
    Say("error " + std::to_string(r) + " open: " + session.status().ToString());
    return false;
  }
  auto plan = Plan(f, r);
  bool ok = true;
  dsec::v1::ExecResult last;
  for (size_t k = 0; k < plan.size(); ++k) {
    auto step = Retry(f, [&] { return session->Step(k, plan[k]); });
    if (!step.ok()) {
      Say("error " + std::to_string(r) + " step " + std::to_string(k) + ": " + step.status().ToString());
      return false;
    }
    std::string out = step->step().result().stdout();
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    Say("step " + std::to_string(r) + " " + std::to_string(k) + (step->fast_forwarded() ? " ff " : " run ") + out);
    if (f.task == "count" && f.strict_count && out != std::to_string(k + 1)) {
      Say("MISMATCH " + std::to_string(r) + " step " + std::to_string(k) + ": " + std::to_string(k + 1) +
          " line(s) expected, the file has " + out);
      ok = false;
    }
    last = step->step().result();
  }
  double reward = f.task == "count" ? (ok ? 1 : 0) : (last.exit_code() == 0 && last.signal() == 0 ? 1 : 0);
  dsec::v1::StepMeta meta;
  meta.set_reward(reward);
  auto annotated = Retry(f, [&] { return session->Annotate(plan.size() - 1, meta); });
  if (!annotated.ok()) Say("error " + std::to_string(r) + " annotate: " + annotated.status().ToString());
  Say("reward " + std::to_string(r) + " " + std::to_string(reward));
  if (f.close) {
    auto closed = Retry(f, [&]() -> dsec::Result<bool> {
      auto st = session->Close();
      if (!st.ok()) return st;
      return true;
    });
    if (!closed.ok()) Say("error " + std::to_string(r) + " close: " + closed.status().ToString());
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsec example trainer: concurrent multi-step rollouts in sessions that survive the trainer"};
  Flags f;
  app.add_option("--addr", f.addr, "dsecd SDK entry host:port (default: $DSEC_ADDR, else <data-dir>/dsecd.json)");
  app.add_option("--data-dir", f.data_dir, "dsecd's data dir, for its address and sdk.token ($DSEC_DATA_DIR, else ./dsec-data)");
  app.add_option("--job", f.job, "job name: sessions are JOB/taskR/s0")->capture_default_str();
  app.add_option("--kind", f.kind, "sandbox kind")->capture_default_str();
  app.add_option("--image", f.image, "image (default: the built-in host image)");
  app.add_option("--task", f.task, "coding | count")->check(CLI::IsMember({"coding", "count"}))->capture_default_str();
  app.add_option("--rollouts", f.rollouts, "concurrent rollouts")->check(CLI::Range(1, 10000))->capture_default_str();
  app.add_option("--steps", f.steps, "steps per rollout (count task)")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_flag("--strict-count", f.strict_count, "count task: fail unless step k saw exactly k+1 lines");
  app.add_flag("--close", f.close,
               "close each session when its rollout is done (default: left open for the lease, so a run "
               "again with the same --job fast-forwards through them)");
  app.add_option("--retry", f.retry_s, "seconds to keep retrying a step while dsecd is unreachable")->capture_default_str();
  app.add_option("--lease", f.lease_s, "session lease, seconds (default: the node's)");
  CLI11_PARSE(app, argc, argv);

  dsec::v1::SandboxSpec spec;
  if (f.kind == "container" && f.image.empty()) {
    std::fprintf(stderr,
                 "dsec-rollout-trainer: --image is required for containers (build one: dsec-image build DIR NAME)\n");
    return 2;
  }
  if (f.kind == "container") spec = dsec::ContainerSpec(f.image);
  else spec = dsec::FncallSpec();
  dsec::ClientOptions o;
  o.address = f.addr;
  o.data_dir = f.data_dir;
  o.threads = 4;
  auto client = dsec::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "dsec-rollout-trainer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  threads.reserve(f.rollouts);
  for (int r = 0; r < f.rollouts; ++r)
    threads.emplace_back([&, r] {
      if (!Rollout(**client, f, spec, r)) ++failed;
    });
  for (auto& t : threads) t.join();
  Say("finished " + std::to_string(f.rollouts - failed.load()) + " rollouts");
  if (!f.close)
    std::fprintf(stderr,
                 "dsec-rollout-trainer: the sessions stay open for their lease (their sandboxes too); close them "
                 "with: dsecctl session close --prefix %s/ (or run with --close)\n",
                 f.job.c_str());
  return failed ? 1 : 0;
}
