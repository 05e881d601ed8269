// storm_bench: connection storms as an RL job makes them. N separate
// `dsecctl run` processes (each its own SDK connection: process start,
// door handshake, BASP handshake, one run, exit), C at a time, against a
// running dsecd: after an idle period, then again at once. Prints runs/s,
// per-process latency and failures of each burst. Then the same-run
// reference: --sequential runs one at a time (what one process costs, with
// nothing queued behind it: its wall time, and dsecd's CPU per run read
// from /proc for the pid in <data-dir>/dsecd.json).
//
//   storm_bench --data-dir D [--addr A] [--runs 2000] [--concurrency 64] [--idle 60] [--bursts 2]
//               [--sequential 100]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/daemon.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"

extern char** environ;

namespace {

using dsec::bench::Clock;

struct Burst {
  int ok = 0, failed = 0;
  double seconds = 0;
  std::vector<double> ms;
  std::map<int, int> exit_codes;  // of the failures
  std::string first_error;
};

Burst RunBurst(const std::vector<std::string>& argv, int runs, int concurrency, const std::string& err_path) {
  Burst b;
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::map<pid_t, Clock::time_point> live;
  int started = 0;
  auto t0 = Clock::now();
  while (started < runs || !live.empty()) {
    while (started < runs && static_cast<int>(live.size()) < concurrency) {
      pid_t pid = -1;
      if (posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ) != 0) {
        ++b.failed;
        ++started;
        continue;
      }
      live[pid] = Clock::now();
      ++started;
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    auto it = live.find(pid);
    if (it == live.end()) continue;
    b.ms.push_back(dsec::bench::Ms(it->second, Clock::now()));
    live.erase(it);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0) {
      ++b.ok;
    } else {
      ++b.failed;
      ++b.exit_codes[code];
    }
  }
  b.seconds = dsec::bench::Ms(t0, Clock::now()) / 1000;
  posix_spawn_file_actions_destroy(&fa);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"storm_bench: many separate dsecctl processes, each its own connection, against a running dsecd"};
  std::string addr, data_dir = "./dsec-data", command = "true";
  int runs = 2000, concurrency = 64, bursts = 2, sequential = 100;
  double idle_s = 60;
  app.add_option("--addr", addr, "dsecd SDK entry (default: <data-dir>/dsecd.json)");
  app.add_option("--data-dir", data_dir, "dsecd's data dir (address, SDK token)")->capture_default_str();
  app.add_option("--runs", runs, "dsecctl processes per burst")->capture_default_str();
  app.add_option("--concurrency", concurrency, "processes at once")->capture_default_str();
  app.add_option("--idle", idle_s, "seconds dsecd is left idle before the first burst")->capture_default_str();
  app.add_option("--bursts", bursts, "bursts, back to back after the idle period")->capture_default_str();
  app.add_option("--sequential", sequential, "then this many runs one at a time: the reference (0: none)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> ctl = {dsec::testing::BinDir() + "/dsecctl", "--data-dir", data_dir};
  if (!addr.empty()) ctl.insert(ctl.end(), {"--addr", addr});
  ctl.insert(ctl.end(), {"run", "--no-stdin", "--", command});
  std::string err_path = "/tmp/storm_bench." + std::to_string(::getpid()) + ".err";
  std::printf("# storm_bench: %d dsecctl run processes per burst, %d at a time; idle %.0f s first\n", runs,
              concurrency, idle_s);
  if (idle_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));  // the idle period itself
  std::printf("%-6s %8s %8s %8s %10s %10s %10s\n", "burst", "ok", "failed", "runs/s", "p50 ms", "p99 ms", "max ms");
  int failed = 0;
  for (int i = 1; i <= bursts; ++i) {
    auto b = RunBurst(ctl, runs, concurrency, err_path);
    auto p = dsec::bench::Percentiles(b.ms);
    double max = b.ms.empty() ? 0 : *std::max_element(b.ms.begin(), b.ms.end());
    std::printf("%-6d %8d %8d %8.1f %10.1f %10.1f %10.1f\n", i, b.ok, b.failed, b.ok / b.seconds, p.p50, p.p99, max);
    for (const auto& [code, n] : b.exit_codes) std::printf("#   %d process(es) exited %d\n", n, code);
    failed += b.failed;
  }
  if (sequential > 0) {
    int dsecd = 0;
    if (auto ep = dsec::ReadFileToString(data_dir + "/dsecd.json"); ep.ok())
      dsecd = nlohmann::json::parse(*ep, nullptr, false).value("pid", 0);
    double cpu0 = dsecd ? dsec::bench::CpuSeconds(dsecd) : 0;
    auto b = RunBurst(ctl, sequential, 1, err_path);
    double cpu_ms = dsecd ? (dsec::bench::CpuSeconds(dsecd) - cpu0) * 1000 / std::max(b.ok, 1) : 0;
    auto p = dsec::bench::Percentiles(b.ms);
    double max = b.ms.empty() ? 0 : *std::max_element(b.ms.begin(), b.ms.end());
    std::printf("%-6s %8d %8d %8.1f %10.1f %10.1f %10.1f   <- the reference: one at a time\n", "seq", b.ok, b.failed,
                b.ok / b.seconds, p.p50, p.p99, max);
    if (dsecd) std::printf("# dsecd CPU per sequential run: %.2f ms (pid %d)\n", cpu_ms, dsecd);
    failed += b.failed;
  }
  if (failed) {
    std::printf("# what the failures said (%s):\n", err_path.c_str());
    std::fflush(stdout);
    std::system(("sort " + err_path + " | uniq -c | sort -rn | head -5").c_str());
  } else {
    ::unlink(err_path.c_str());
  }
  return failed ? 1 : 0;
}
