// Rollout session macro benchmark. Starts its own dsecd (it kills and
// restarts it for the recovery figure) on a fresh data dir and drives it
// through the SDK:
//
//   build/bin/session_bench --sessions 256 --steps 20 --recovery 10000
//
// Prints, each from this one run:
//   - step round trip of a `true` exec through a container session (p50,
//     p99), next to the same exec sent to the sandbox directly;
//   - durable steps/s with --sessions concurrent container sessions, each
//     stepping `true` (every step executed, logged durably, then answered);
//   - durable session writes/s with no exec (annotations: the session actor,
//     group commit and RocksDB alone), the ceiling of the log path: once
//     with a client thread per session, once with each session's next write
//     issued from the SDK callback of its previous one (as a trainer driving
//     all its rollouts from one thread does);
//   - fast-forward steps/s: every session replayed from step 0;
//   - recovery: --recovery open sessions (fncall, one step each), dsecd
//     killed with SIGKILL and restarted: time until it is ready again, the
//     restore itself (from dsecd's log), and until the last session answers.
#include <CLI/CLI.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers

// A client of the bench's own dsecd: its address and, from its data dir, the SDK token.
std::unique_ptr<dsec::Client> Connect(const dsec::testing::TestDaemon& d) {
  dsec::ClientOptions o;
  o.address = d.sdk_addr();
  o.data_dir = d.data_dir();
  auto c = dsec::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "session_bench: %s\n", c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*c);
}

// Every session writes `annotations` annotations one after another, each
// issued from the callback of the one before; returns the seconds taken.
double PipelinedAnnotations(const std::vector<dsec::Session>& open, int annotations, int steps,
                            std::atomic<long>* notes) {
  struct Run {
    std::mutex mu;
    std::condition_variable cv;
    size_t left;
  } run;
  run.left = open.size();
  std::function<void(size_t, int)> next = [&](size_t i, int k) {
    if (k == annotations) {
      std::lock_guard<std::mutex> lock(run.mu);
      if (--run.left == 0) run.cv.notify_all();
      return;
    }
    dsec::v1::StepMeta meta;
    meta.set_reward(k);
    open[i].AnnotateAsync(k % steps, meta, [&, i, k](dsec::Result<dsec::v1::StepMeta> r) {
      if (r.ok()) ++*notes;
      next(i, k + 1);
    });
  };
  auto t0 = Clock::now();
  for (size_t i = 0; i < open.size(); ++i) next(i, 0);
  std::unique_lock<std::mutex> lock(run.mu);
  run.cv.wait(lock, [&] { return run.left == 0; });
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The "restored ... in N ms" of dsecd's log from boot `boot` (the file is
// flushed every second: look for up to 5 s).
double RestoreMs(const std::string& log_path, int boot) {
  std::regex re("restored .* in ([0-9.]+) ms");
  for (auto deadline = Clock::now() + std::chrono::seconds(5); Clock::now() < deadline;) {
    std::ifstream in(log_path);
    std::string line;
    std::smatch m;
    int seen = 0;
    double ms = -1;
    while (std::getline(in, line))
      if (std::regex_search(line, m, re) && ++seen == boot) ms = std::stod(m[1]);
    if (ms >= 0) return ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rollout session macro benchmark (starts its own dsecd)"};
  int sessions = 256, steps = 20, rtt_steps = 2000, recovery = 10000;
  app.add_option("--sessions", sessions, "concurrent container sessions")->capture_default_str();
  app.add_option("--steps", steps, "steps per session")->capture_default_str();
  app.add_option("--rtt-steps", rtt_steps, "sequential steps for the round trip")->capture_default_str();
  app.add_option("--recovery", recovery, "sessions open across the restart (0: skip)")->capture_default_str();
  int annotations = 0;
  app.add_option("--annotations", annotations, "annotations per session (default: --steps)");
  CLI11_PARSE(app, argc, argv);

  dsec::testing::TestDaemonOptions dopt;
  dopt.cgroup_parent = "dsec-bench";
  dopt.test_hooks = false;
  auto daemon = dsec::testing::TestDaemon::Start(dopt);
  if (!daemon.ok()) {
    std::fprintf(stderr, "session_bench: dsecd: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  auto& d = **daemon;
  char tmpl[] = "/tmp/dsec-bench-rootfs-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  std::string rootfs = tmpl;
  dsec::testing::RootfsOptions ro;
  ro.programs = {"sh", "true", "cat"};
  ro.python = false;
  auto made = dsec::testing::MakeRootfs(rootfs, ro);
  auto built = dsec::testing::RunProcess(
      {dsec::testing::BinDir() + "/dsec-image", "--data-dir", d.data_dir(), "build", rootfs, "bench"});
  dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
  if (!made.ok() || built.exit_code != 0) {
    std::fprintf(stderr, "session_bench: image: %s %s\n", made.ToString().c_str(), built.err.c_str());
    return 1;
  }
  auto client = Connect(d);
  if (!client) return 1;
  auto& c = *client;
  auto spec = dsec::ContainerSpec("bench");
  auto truth = dsec::Command({"/bin/true"});
  std::printf("# session_bench: dsecd pid %d, data %s\n", d.pid(), d.data_dir().c_str());

  // Round trip: one session, sequential steps; the same exec sent straight
  // to the sandbox for comparison.
  {
    auto s = c.OpenSession("bench/rtt/0", spec);
    if (!s.ok()) {
      std::fprintf(stderr, "session_bench: open: %s\n", s.status().ToString().c_str());
      return 1;
    }
    auto sb = s->sandbox();
    std::vector<double> step_ms, exec_ms;
    for (int i = 0; i < rtt_steps; ++i) {
      auto t0 = Clock::now();
      auto r = s->Step(i, truth);
      auto t1 = Clock::now();
      if (!r.ok()) {
        std::fprintf(stderr, "session_bench: step %d: %s\n", i, r.status().ToString().c_str());
        return 1;
      }
      step_ms.push_back(Ms(t0, t1));
      auto e = sb->Exec(truth);
      exec_ms.push_back(Ms(t1, Clock::now()));
    }
    Pct sp = Percentiles(step_ms), ep = Percentiles(exec_ms);
    std::printf("step round trip (`true`, container session): p50 %.2f ms, p99 %.2f ms  "
                "(exec in the sandbox directly: p50 %.2f ms, p99 %.2f ms)\n",
                sp.p50, sp.p99, ep.p50, ep.p99);
    (void)s->Close();
  }

  // Many sessions at once: open, step, replay, annotate.
  std::vector<dsec::Session> open;
  std::mutex mu;
  std::atomic<int> failed{0};
  double open_s = Parallel(sessions, std::min(sessions, 64), [&](int i) {
    auto s = c.OpenSession("bench/many/" + std::to_string(i), spec);
    std::lock_guard<std::mutex> lk(mu);
    if (s.ok()) open.push_back(*s);
    else if (failed++ == 0) std::fprintf(stderr, "open: %s\n", s.status().ToString().c_str());
  });
  std::printf("opened %zu container sessions in %.2f s (%.0f/s)\n", open.size(), open_s, open.size() / open_s);
  std::vector<double> lat;
  double run_s = Parallel(static_cast<int>(open.size()), static_cast<int>(open.size()), [&](int i) {
    std::vector<double> mine;
    for (int k = 0; k < steps; ++k) {
      auto t0 = Clock::now();
      auto r = open[i].Step(k, truth);
      if (!r.ok()) {
        if (failed++ == 0) std::fprintf(stderr, "step: %s\n", r.status().ToString().c_str());
        return;
      }
      mine.push_back(Ms(t0, Clock::now()));
    }
    std::lock_guard<std::mutex> lk(mu);
    lat.insert(lat.end(), mine.begin(), mine.end());
  });
  Pct lp = Percentiles(lat);
  std::printf("durable steps/s, %zu sessions x %d steps of `true`: %.0f/s (step p50 %.1f ms, p99 %.1f ms)\n",
              open.size(), steps, lat.size() / run_s, lp.p50, lp.p99);
  std::atomic<long> ff{0};
  double ff_s = Parallel(static_cast<int>(open.size()), static_cast<int>(open.size()), [&](int i) {
    for (int k = 0; k < steps; ++k) {
      auto r = open[i].Step(k, truth);
      if (r.ok() && r->fast_forwarded()) ++ff;
      else if (failed++ == 0) std::fprintf(stderr, "replay: %s\n", r.ok() ? "not fast-forwarded" : r.status().ToString().c_str());
    }
  });
  std::printf("fast-forward steps/s, %zu sessions replayed from step 0: %.0f/s\n", open.size(), ff / ff_s);
  std::atomic<long> notes{0};
  if (annotations <= 0) annotations = steps;
  // dsecd's own CPU per durable write: what a node spends when the trainer
  // is on another machine (here the benchmark's client threads share the
  // two cores with it).
  double cpu0 = CpuSeconds(d.pid());
  double client0 = CpuSeconds(::getpid());
  double an_s = Parallel(static_cast<int>(open.size()), static_cast<int>(open.size()), [&](int i) {
    dsec::v1::StepMeta meta;
    for (int k = 0; k < annotations; ++k) {
      meta.set_reward(k);
      if (open[i].Annotate(k % steps, meta).ok()) ++notes;
    }
  });
  std::printf("durable session writes/s without exec (annotate), %zu sessions, a thread each: %.0f/s\n",
              open.size(), notes / an_s);
  // The same with every session's next write issued from the SDK's callback
  // of its previous one: no client thread per session, no rounds.
  long first_writes = notes;
  notes = 0;
  double async_s = PipelinedAnnotations(open, annotations, steps, &notes);
  std::printf("durable session writes/s without exec (annotate), %zu sessions, each with its next write in "
              "flight (callbacks): %.0f/s\n",
              open.size(), notes / async_s);
  double cpu1 = CpuSeconds(d.pid());
  double client1 = CpuSeconds(::getpid());
  long writes = first_writes + notes;
  if (cpu0 >= 0 && cpu1 >= 0 && writes > 0)
    std::printf("dsecd CPU per durable write (both annotate runs): %.1f us, so %.0f writes/s per core of the node "
                "(this client: %.1f us per write)\n",
                (cpu1 - cpu0) * 1e6 / writes, writes / (cpu1 - cpu0), (client1 - client0) * 1e6 / writes);
  Parallel(static_cast<int>(open.size()), 64, [&](int i) { (void)open[i].Close(); });
  open.clear();

  // Recovery: many open sessions, kill -9, restart.
  if (recovery > 0) {
    auto fn = dsec::FncallSpec();
    std::atomic<int> ready{0};
    double fill_s = Parallel(recovery, 64, [&](int i) {
      auto s = c.OpenSession("bench/recovery/" + std::to_string(i), fn);
      if (s.ok() && s->Step(0, truth).ok()) ++ready;
    });
    std::printf("opened %d fncall sessions with one step each in %.1f s\n", ready.load(), fill_s);
    client.reset();
    d.Kill9();
    auto t0 = Clock::now();
    auto st = d.Restart();
    auto t1 = Clock::now();
    if (!st.ok()) {
      std::fprintf(stderr, "session_bench: restart: %s\n", st.ToString().c_str());
      return 1;
    }
    auto again = Connect(d);
    if (!again) return 1;
    auto last = again->AttachSession("bench/recovery/" + std::to_string(recovery - 1));
    auto r = last.ok() ? last->Step(0, truth) : dsec::Result<dsec::v1::StepReply>(last.status());
    auto t2 = Clock::now();
    std::printf("recovery of %d sessions after kill -9: restore %.0f ms (dsecd log), ready %.0f ms after exec, "
                "last session answered (fast-forward) %.0f ms after exec%s\n",
                ready.load(), RestoreMs(d.log_path(), 2), Ms(t0, t1), Ms(t0, t2),
                r.ok() && r->fast_forwarded() ? "" : " [FAILED]");
  }
  if (failed) std::printf("failed operations: %d\n", failed.load());
  return failed ? 1 : 0;
}
