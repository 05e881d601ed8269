// The E2B door against dsec's own C++ SDK, the same work through each, in
// one run (starts its own dsecd; docs/performance.md):
//
//   build/bin/e2b_bench --count 30 --concurrency 64 --seconds 10
//   build/bin/e2b_bench --count 0 --concurrency 0 --streams 1000
//
// Prints, for the door (the unmodified `e2b` npm package, run by node:
// perf/e2b_bench.cjs) and for the C++ SDK:
//   - create-to-first-output: a new container, then `echo hi` as the
//     SDK's default user through a login bash (what commands.run does),
//     until its first output arrives; p50 and p99 of --count in a row;
//   - commands per second: --concurrency loops of `true` (through bash -l
//     -c, as user `user`) on one sandbox for --seconds.
// And the door's figures over the SDK's (the ratio is what to quote: the
// machine is shared). With --streams N: N sandboxes made through the door,
// each with a streamed background command left open; dsecd's memory with
// them open (per sandbox with its stream: a bound on what an open stream
// holds), and again once they have ended (the sandboxes still there); and
// whether every stream's output came whole and in order. Needs node and the package (e2b_test installs it to
// /var/cache/dsec/npm; --module names another).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "perf/bench_daemon.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers

int Fail(const std::string& what, const dsec::Status& s) {
  std::fprintf(stderr, "e2b_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// What commands.run sends: bash -l -c CMD as the SDK's default user.
dsec::v1::ExecRequest AsTheSdkRuns(const std::string& cmd) {
  auto req = dsec::Command({"/bin/bash", "-l", "-c", cmd});
  req.set_user("user");
  return req;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the E2B door (the unmodified e2b SDK) against dsec's C++ SDK: create-to-first-output, commands/s"};
  int count = 30, concurrency = 64, streams = 0, lines = 1000;
  double seconds = 10;
  std::string module = "/var/cache/dsec/npm/e2b-2.45.0/node_modules/e2b/dist/index.js";
  app.add_option("--count", count, "creations timed, one after another")->capture_default_str();
  app.add_option("--concurrency", concurrency, "commands in flight at once")->capture_default_str();
  app.add_option("--seconds", seconds, "how long commands run")->capture_default_str();
  app.add_option("--streams", streams, "sandboxes made through the door, each with a stream left open (0: none)")
      ->capture_default_str();
  app.add_option("--lines", lines, "lines each stream then prints")->capture_default_str();
  app.add_option("--module", module, "the e2b package's dist/index.js")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (::access(module.c_str(), R_OK) != 0 || ::access("/usr/bin/node", X_OK) != 0)
    return Fail("setup", dsec::Status::FailedPrecondition("no node, or no e2b package at " + module +
                                                          " (run e2b_test once: it installs tests/integration/e2b/sdk's lockfile with npm ci)"));

  auto daemon = StartBenchDaemon();
  if (!daemon.ok()) return Fail("dsecd", daemon.status());
  auto& d = **daemon;
  auto scratch = ScratchRootfs("dsec-e2b-bench", {"sh", "bash", "true", "echo", "cat", "id", "seq"});
  if (!scratch.ok()) return Fail("rootfs", scratch.status());
  auto built = BuildBenchImage(d, *scratch, "e2b-bench");
  dsec::testing::RunProcess({"/bin/rm", "-rf", *scratch});
  if (!built.ok()) return Fail("image", built);
  auto client = BenchClient(d);
  if (!client.ok()) return Fail("connect", client.status());
  auto key = dsec::ReadFileToString(d.data_dir() + "/e2b.key");
  if (!key.ok()) return Fail("key", key.status());
  auto node = [&](std::vector<std::string> env) -> nlohmann::json {
    std::vector<std::string> argv = {"/usr/bin/env", "E2B_MODULE=" + module,
                                     "E2B_API_URL=http://" + d.e2b_addr(), "E2B_SANDBOX_URL=http://" + d.e2b_addr(),
                                     "E2B_API_KEY=" + key->substr(0, key->find('\n')), "TEMPLATE=e2b-bench"};
    for (auto& e : env) argv.push_back(std::move(e));
    argv.push_back("/usr/bin/node");
    argv.push_back(std::string(DSEC_SOURCE_DIR) + "/perf/e2b_bench.cjs");
    auto r = dsec::testing::RunProcess(argv, {}, 1800);
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    if (r.exit_code != 0 || !j.is_object()) std::fprintf(stderr, "e2b_bench: node: %s%s\n", r.out.c_str(), r.err.c_str());
    return j.is_object() ? j : nlohmann::json::object();
  };
  auto spec = dsec::ContainerSpec("e2b-bench");

  if (streams > 0) {
    char tmpl[] = "/tmp/dsec-e2b-streams.XXXXXX";
    std::string dir = ::mkdtemp(tmpl) ? tmpl : "";
    if (dir.empty()) return Fail("streams", dsec::Status::FromErrno(errno, "mkdtemp"));
    auto rss_mib = [&] { return PssRss(d.pid()).second / 1024.0; };
    double base = rss_mib(), open = 0, ended = 0;
    std::thread watcher([&] {  // reads dsecd's memory at each stage the node side reaches
      auto wait_for = [&](const std::string& f) {
        while (::access((dir + "/" + f).c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      };
      wait_for("open");
      open = rss_mib();
      (void)dsec::WriteFileAtomic(dir + "/go", "");
      wait_for("ended");
      ended = rss_mib();
      (void)dsec::WriteFileAtomic(dir + "/done", "");
    });
    auto r = node({"MODE=streams", "COUNT=" + std::to_string(streams), "LINES=" + std::to_string(lines), "DIR=" + dir,
                   "E2B_ENVD_RPC_CONNECTIONS=" + std::to_string(streams + 64)});
    if (r.empty()) {  // the node side failed: the watcher ends too
      (void)dsec::WriteFileAtomic(dir + "/open", "");
      (void)dsec::WriteFileAtomic(dir + "/ended", "");
    }
    watcher.join();
    dsec::testing::RunProcess({"/bin/rm", "-rf", dir});
    // What the node side could not kill goes here: containers outlive dsecd.
    for (int page = 0; page < 100; ++page) {  // a page at a time, until none is left
      auto left = (*client)->ListSandboxes();
      if (!left.ok() || left->sandboxes_size() == 0) break;
      for (const auto& rec : left->sandboxes())
        if (auto sb = (*client)->Attach(rec.id()); sb.ok()) (void)sb->Destroy();
    }
    int made = r.value("made", 0);
    std::printf("%d streams through the door (%d asked; %d failed; all open after %.1f s): %d whole and in order "
                "(%d lines each); dsecd RSS %.1f MiB before, %.1f with them open (%.1f KiB per sandbox with its open "
                "stream), %.1f once they ended (the sandboxes still there)\n",
                made, streams, r.value("failed", -1), r.value("openMs", 0.0) / 1000, r.value("inOrder", 0), lines, base,
                open, made ? (open - base) * 1024 / made : 0, ended);
  }
  if (count <= 0 || concurrency <= 0) return 0;

  // Create-to-first-output.
  std::vector<double> sdk_ms;
  for (int i = 0; i < count; ++i) {
    auto t0 = Clock::now();
    auto sb = (*client)->Create(spec);
    if (!sb.ok()) return Fail("create", sb.status());
    double first = 0;
    auto r = sb->ExecStream(AsTheSdkRuns("echo hi"), [&](const dsec::v1::ExecOutput& o) {
      if (!first && !o.stdout().empty()) first = Ms(t0, Clock::now());
    });
    if (!r.ok() || !first) return Fail("exec", r.ok() ? dsec::Status::Internal("no output") : r.status());
    sdk_ms.push_back(first);
    (void)sb->Destroy();
  }
  auto door = node({"MODE=latency", "COUNT=" + std::to_string(count)});
  std::vector<double> door_ms;
  for (const auto& v : door.value("ms", nlohmann::json::array())) door_ms.push_back(v.get<double>());
  Pct s = Percentiles(sdk_ms), e = Percentiles(door_ms);
  std::printf("create-to-first-output, %d in a row (ms): C++ SDK p50 %.1f p99 %.1f | E2B door p50 %.1f p99 %.1f "
              "(door/SDK: p50 %.2fx, p99 %.2fx)\n",
              count, s.p50, s.p99, e.p50, e.p99, s.p50 ? e.p50 / s.p50 : 0, s.p99 ? e.p99 / s.p99 : 0);

  // Commands per second at a concurrency, on one sandbox.
  auto sb = (*client)->Create(spec);
  if (!sb.ok()) return Fail("create", sb.status());
  std::atomic<long> done{0}, failed{0};
  auto end = Clock::now() + std::chrono::milliseconds(static_cast<long>(seconds * 1000));
  auto t0 = Clock::now();
  std::vector<std::thread> loops;
  for (int i = 0; i < concurrency; ++i)
    loops.emplace_back([&] {
      while (Clock::now() < end) {
        auto r = sb->Exec(AsTheSdkRuns("true"));
        (r.ok() && r->exit_code() == 0 ? done : failed)++;
      }
    });
  for (auto& t : loops) t.join();
  double sdk_s = Ms(t0, Clock::now()) / 1000;
  (void)sb->Destroy();
  auto rate = node({"MODE=rate", "CONC=" + std::to_string(concurrency), "SECONDS=" + std::to_string(seconds)});
  double sdk_rate = done / sdk_s;
  double door_rate = rate.value("done", 0.0) / std::max(1e-9, rate.value("seconds", 1.0));
  std::printf("commands/s at concurrency %d: C++ SDK %.0f (%ld failed) | E2B door %.0f (%d failed) (door/SDK %.2fx)\n",
              concurrency, sdk_rate, failed.load(), door_rate, rate.value("failed", -1),
              sdk_rate ? door_rate / sdk_rate : 0);
  return 0;
}
