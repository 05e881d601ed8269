// fncall macro benchmark: N runs of a command through the SDK against a
// running dsecd, at several concurrencies, next to plain fork/exec of the same
// command on the host measured in the same process and the same run.
//
//   build/bin/fncall_bench --addr 127.0.0.1:7400 --runs 3000 --concurrency 1,16,256
//
// Prints one table: runs/s and p50/p99 latency for dsec and for the host, and
// the p50 overhead of dsec over host fork/exec.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "dsec/status_proto.hpp"
#include "perf/bench_util.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Figures {
  double per_s = 0, p50_ms = 0, p99_ms = 0;
  double cpu_ms = 0;  // this process's CPU (every thread: the SDK's too) per run
  int failed = 0;
};

Figures Summarize(std::vector<double> lat_ms, double seconds, int failed) {
  Figures f;
  f.failed = failed;
  if (lat_ms.empty()) return f;
  std::sort(lat_ms.begin(), lat_ms.end());
  f.per_s = lat_ms.size() / seconds;
  f.p50_ms = lat_ms[lat_ms.size() / 2];
  f.p99_ms = lat_ms[std::min(lat_ms.size() - 1, lat_ms.size() * 99 / 100)];
  return f;
}

Figures RunDsec(dsec::Client& client, const std::vector<std::string>& argv, int runs, int concurrency) {
  std::mutex mu;
  std::condition_variable cv;
  int inflight = 0, done = 0, failed = 0;
  std::vector<double> lat;
  lat.reserve(runs);
  double cpu0 = dsec::bench::CpuSeconds(::getpid());
  auto t0 = Clock::now();
  for (int i = 0; i < runs; ++i) {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return inflight < concurrency; });
      ++inflight;
    }
    auto start = Clock::now();
    client.RunAsync(dsec::FncallSpec(), dsec::Command(argv), [&, start](dsec::Result<dsec::v1::ExecResult> r) {
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      std::lock_guard<std::mutex> lk(mu);
      --inflight;
      ++done;
      if (r.ok() && r->verdict() == dsec::v1::VERDICT_OK) lat.push_back(ms);
      else ++failed;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done == runs; });
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  Figures f = Summarize(std::move(lat), s, failed);
  f.cpu_ms = (dsec::bench::CpuSeconds(::getpid()) - cpu0) * 1000 / runs;
  return f;
}

Figures RunHost(const std::vector<std::string>& argv, int runs, int concurrency) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  std::atomic<int> next{0}, failed{0};
  std::mutex mu;
  std::vector<double> lat;
  lat.reserve(runs);
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t)
    threads.emplace_back([&] {
      std::vector<double> mine;
      while (next.fetch_add(1) < runs) {
        auto start = Clock::now();
        pid_t pid;
        int status = 0;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        bool ok = posix_spawnp(&pid, av[0], &fa, nullptr, av.data(), environ) == 0 &&
                  waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
        posix_spawn_file_actions_destroy(&fa);
        if (ok) mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        else ++failed;
      }
      std::lock_guard<std::mutex> lk(mu);
      lat.insert(lat.end(), mine.begin(), mine.end());
    });
  for (auto& t : threads) t.join();
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return Summarize(std::move(lat), s, failed);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fncall macro benchmark against a running dsecd"};
  std::string addr, data_dir, conc = "1,16,256";
  int runs = 3000, python_runs = 600, warmup = 300;
  bool python = true;
  app.add_option("--addr", addr, "dsecd SDK entry (default: $DSEC_ADDR, else <data-dir>/dsecd.json)");
  app.add_option("--data-dir", data_dir, "dsecd's data dir: its address and SDK token ($DSEC_DATA_DIR, else ./dsec-data)");
  app.add_option("--runs", runs, "runs of /bin/true per concurrency")->capture_default_str();
  app.add_option("--python-runs", python_runs, "runs of python3 -c pass per concurrency")->capture_default_str();
  app.add_option("--concurrency", conc, "comma-separated concurrencies")->capture_default_str();
  app.add_option("--warmup", warmup, "unmeasured runs first")->capture_default_str();
  app.add_flag("!--no-python", python, "skip the python3 rows");
  CLI11_PARSE(app, argc, argv);

  dsec::ClientOptions o;
  o.address = addr;
  o.data_dir = data_dir;
  auto client = dsec::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "fncall_bench: %s\n", client.status().ToString().c_str());
    return 1;
  }
  struct Cmd {
    std::string label;
    std::vector<std::string> argv;
    int runs;
  };
  std::vector<Cmd> cmds = {{"/bin/true", {"/bin/true"}, runs}};
  if (python) cmds.push_back({"python3 -c pass", {"/usr/bin/python3", "-c", "pass"}, python_runs});
  RunDsec(**client, {"/bin/true"}, warmup, 16);
  RunHost({"/bin/true"}, warmup / 4, 4);

  std::printf("%-16s %5s | %10s %8s %8s | %10s %8s %8s | %9s %6s | %14s\n", "command", "conc", "dsec run/s",
              "p50 ms", "p99 ms", "host run/s", "p50 ms", "p99 ms", "p50 +ms", "failed", "client cpu ms");
  for (const auto& c : cmds)
    for (const auto& cs : Split(conc, ',')) {
      int cc = std::stoi(cs);
      Figures d = RunDsec(**client, c.argv, c.runs, cc);
      Figures h = RunHost(c.argv, c.runs, cc);
      std::printf("%-16s %5d | %10.0f %8.2f %8.2f | %10.0f %8.2f %8.2f | %9.2f %6d | %14.3f\n", c.label.c_str(), cc,
                  d.per_s, d.p50_ms, d.p99_ms, h.per_s, h.p50_ms, h.p99_ms, d.p50_ms - h.p50_ms, d.failed + h.failed,
                  d.cpu_ms);
      std::fflush(stdout);
    }
  return 0;
}
