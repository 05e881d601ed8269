// Container macro benchmark against a running dsecd, through the SDK:
//
//   build/bin/container_bench --addr 127.0.0.1:7400 --data-dir ./dsec-data
//       --creates 300 --concurrency 1,16,64 --execs 2000 --idle 5000   (one line)
//
// Prints, each from this one run:
//   - at each concurrency: creations/s and create latency (p50, p99) of
//     creations alone; then, in a second pass, creations each followed by
//     its first exec (rate, create-to-first-exec p50 and p99); and how fast
//     all were removed again;
//   - with --churn N, rollout-style cycles (create, one exec, remove) per
//     second at each concurrency;
//   - exec round trip of `true` in one container (p50, p99);
//   - host memory per idle container (MemAvailable drop and dsecd's RSS
//     growth, divided by the count) with --idle N containers up at once, and
//     whether every one of them still answers an exec;
//   - `crun run` of the same root filesystem (`true`, create to exit, at
//     concurrency 1 and 16) as the reference, when crun is installed.
// The image (--image, default "bench") is built from the host's own sh and
// true (harness/rootfs.hpp) with dsec-image when dsecd does not have it.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers

long MemAvailableKiB() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long v;
  std::string unit;
  while (in >> key >> v >> unit)
    if (key == "MemAvailable:") return v;
  return -1;
}

long RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

long Threads(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::atol(line.c_str() + 8);
  return -1;
}

void DropCaches() {
  ::sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "3";
}

dsec::Status EnsureImage(dsec::Client& c, const std::string& data_dir, const std::string& image,
                         const std::string& rootfs) {
  if (c.GetImage(image).ok()) return dsec::Status::Ok();
  auto r = dsec::testing::RunProcess(
      {dsec::testing::BinDir() + "/dsec-image", "--data-dir", data_dir, "build", rootfs, image});
  if (r.exit_code != 0) return dsec::Status::Internal("dsec-image build " + image + ": " + r.err);
  return dsec::Status::Ok();
}

// crun run of `true` on `rootfs`: per-run latency (create to exit).
bool CrunBench(const std::string& crun, const std::string& rootfs, int runs, int conc, double* per_s, Pct* lat,
               int* failed) {
  char tmpl[] = "/tmp/dsec-bench-crun-XXXXXX";
  if (!::mkdtemp(tmpl)) return false;
  std::string bundle = tmpl;
  auto spec = dsec::testing::RunProcess({"/bin/sh", "-c", "cd \"$0\" && exec \"$1\" spec", bundle, crun});
  if (spec.exit_code != 0) {
    std::fprintf(stderr, "container_bench: crun spec: %s\n", spec.err.c_str());
    return false;
  }
  auto text = dsec::ReadFileToString(bundle + "/config.json");
  auto j = nlohmann::json::parse(text.ok() ? *text : "", nullptr, false);
  if (j.is_discarded()) return false;
  j["process"]["terminal"] = false;
  j["process"]["args"] = {"/bin/true"};
  j["root"]["path"] = rootfs;
  j["root"]["readonly"] = true;
  (void)dsec::WriteFileAtomic(bundle + "/config.json", j.dump(2), 0644);
  std::mutex mu;
  std::vector<double> v;
  std::atomic<int> bad{0};
  double s = Parallel(runs, conc, [&](int i) {
    auto t0 = Clock::now();
    auto r = dsec::testing::RunProcess({crun, "run", "--bundle", bundle, "dsec-bench-" + std::to_string(::getpid()) +
                                                                             "-" + std::to_string(i)});
    double ms = Ms(t0, Clock::now());
    if (r.exit_code != 0) {
      if (bad++ == 0) std::fprintf(stderr, "container_bench: crun run: %s\n", r.err.c_str());
      return;
    }
    std::lock_guard<std::mutex> lk(mu);
    v.push_back(ms);
  });
  dsec::testing::RunProcess({"/bin/rm", "-rf", bundle});
  *per_s = v.size() / s;
  *lat = Percentiles(v);
  *failed = bad;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"container macro benchmark against a running dsecd"};
  std::string addr, data_dir = "./dsec-data", image = "bench", conc = "1,16,64";
  int creates = 300, execs = 2000, idle = 1000, crun_runs = 200, churn = 0;
  app.add_option("--addr", addr, "dsecd SDK entry (default: <data-dir>/dsecd.json)");
  app.add_option("--data-dir", data_dir, "dsecd's data dir (to build the image and find dsecd's pid)")
      ->capture_default_str();
  app.add_option("--image", image, "image to run (built from host sh/true when missing)")->capture_default_str();
  app.add_option("--creates", creates, "containers created per concurrency")->capture_default_str();
  app.add_option("--concurrency", conc, "comma-separated concurrencies")->capture_default_str();
  app.add_option("--churn", churn,
                 "rollout-style cycles per concurrency: create, one `true` exec, remove (0: skip)")
      ->capture_default_str();
  app.add_option("--execs", execs, "sequential `true` execs for the round trip")->capture_default_str();
  app.add_option("--idle", idle, "idle containers held at once for the memory figure (0: skip)")
      ->capture_default_str();
  app.add_option("--crun-runs", crun_runs, "crun run repetitions per concurrency (0: skip)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  dsec::ClientOptions o;
  o.address = addr;
  o.data_dir = data_dir;
  o.threads = 4;
  auto client = dsec::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "container_bench: %s\n", client.status().ToString().c_str());
    return 1;
  }
  dsec::Client& c = **client;
  auto ep = dsec::ReadFileToString(data_dir + "/dsecd.json");
  pid_t dsecd = 0;
  if (ep.ok()) dsecd = nlohmann::json::parse(*ep, nullptr, false).value("pid", 0);

  char tmpl[] = "/tmp/dsec-bench-rootfs-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  std::string rootfs = tmpl;
  dsec::testing::RootfsOptions ro;
  ro.programs = {"sh", "true", "cat", "sleep"};
  ro.python = false;
  if (auto st = dsec::testing::MakeRootfs(rootfs, ro); !st.ok()) {
    std::fprintf(stderr, "container_bench: rootfs: %s\n", st.ToString().c_str());
    return 1;
  }
  if (auto st = EnsureImage(c, data_dir, image, rootfs); !st.ok()) {
    std::fprintf(stderr, "container_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  auto spec = dsec::ContainerSpec(image);
  auto truth = dsec::Command({"/bin/true"});

  // Warm-up: the image mount, the spawner, the SDK connection.
  for (int i = 0; i < 5; ++i) {
    auto sb = c.Create(spec);
    if (sb.ok()) {
      (void)sb->Exec(truth);
      (void)sb->Destroy();
    }
  }

  std::printf("# container_bench: image %s, %d creations per concurrency, dsecd pid %d\n", image.c_str(), creates,
              dsecd);
  std::printf("%5s | %11s %9s %9s %7s | %11s %13s %9s %7s | %10s %6s\n", "conc", "creations/s", "create50",
              "create99", "cpu ms", "+1st exec/s", "to-1st-exec50", "99 ms", "cpu ms", "removals/s", "failed");
  for (int cc : SplitInts(conc)) {
    // Two passes of `creates`: creations alone, then each creation followed
    // by its first exec; everything made is removed after each pass.
    std::mutex mu;
    std::atomic<int> failed{0};
    double removal_s = 0;
    size_t removed = 0;
    // One pass: `creates` creations (each followed by its first exec when
    // `first_exec`), then all removed. The latencies (to the create reply,
    // or to the first exec's), and the pass's seconds and machine CPU per
    // operation (everything on it, this client included).
    struct Pass {
      std::vector<double> ms;
      double seconds = 0, cpu_ms = 0;
    };
    auto pass = [&](bool first_exec) {
      Pass p;
      std::vector<dsec::Sandbox> made;
      double busy0 = HostBusySeconds();
      p.seconds = Parallel(creates, cc, [&](int) {
        auto t0 = Clock::now();
        auto sb = c.Create(spec);
        if (!sb.ok()) {
          if (failed++ == 0) std::fprintf(stderr, "create: %s\n", sb.status().ToString().c_str());
          return;
        }
        dsec::Result<dsec::v1::ExecResult> r = dsec::v1::ExecResult();
        if (first_exec) r = sb->Exec(truth);
        auto t1 = Clock::now();
        std::lock_guard<std::mutex> lk(mu);
        made.push_back(*sb);
        if (first_exec && (!r.ok() || r->verdict() != dsec::v1::VERDICT_OK)) {
          if (failed++ == 0)
            std::fprintf(stderr, "first exec: %s\n", r.ok() ? r->error().c_str() : r.status().ToString().c_str());
          return;
        }
        p.ms.push_back(Ms(t0, t1));
      });
      p.cpu_ms = (HostBusySeconds() - busy0) * 1000 / std::max<size_t>(p.ms.size(), 1);
      removal_s += Parallel(static_cast<int>(made.size()), cc, [&](int i) {
        if (!made[i].Destroy().ok()) ++failed;
      });
      removed += made.size();
      return p;
    };
    Pass created = pass(false), first = pass(true);
    Pct cp = Percentiles(created.ms), fp = Percentiles(first.ms);
    std::printf("%5d | %11.0f %9.2f %9.2f %7.2f | %11.0f %13.2f %9.2f %7.2f | %10.0f %6d\n", cc,
                created.ms.size() / created.seconds, cp.p50, cp.p99, created.cpu_ms, first.ms.size() / first.seconds,
                fp.p50, fp.p99, first.cpu_ms, removed / removal_s, failed.load());
    std::fflush(stdout);
  }

  // Churn, as RL rollouts use containers: each made, used once and removed
  // while others are being made; the node recycles what a removal frees.
  if (churn > 0) {
    std::printf("%5s | %9s %11s %11s %7s %6s\n", "conc", "cycles/s", "cycle50 ms", "cycle99 ms", "cpu ms", "failed");
    for (int cc : SplitInts(conc)) {
      std::mutex mu;
      std::vector<double> cycle_ms;
      std::atomic<int> failed{0};
      double busy0 = HostBusySeconds();
      double s = Parallel(churn, cc, [&](int) {
        auto t0 = Clock::now();
        auto sb = c.Create(spec);
        if (!sb.ok()) {
          if (failed++ == 0) std::fprintf(stderr, "churn create: %s\n", sb.status().ToString().c_str());
          return;
        }
        auto r = sb->Exec(truth);
        bool ok = r.ok() && r->verdict() == dsec::v1::VERDICT_OK && sb->Destroy().ok();
        if (!ok) {
          ++failed;
          return;
        }
        std::lock_guard<std::mutex> lk(mu);
        cycle_ms.push_back(Ms(t0, Clock::now()));
      });
      Pct p = Percentiles(cycle_ms);
      double cpu_ms = (HostBusySeconds() - busy0) * 1000 / std::max<size_t>(cycle_ms.size(), 1);
      std::printf("%5d | %9.0f %11.2f %11.2f %7.2f %6d\n", cc, cycle_ms.size() / s, p.p50, p.p99, cpu_ms, failed.load());
      std::fflush(stdout);
    }
  }

  {
    auto sb = c.Create(spec);
    if (sb.ok()) {
      std::vector<double> v;
      for (int i = 0; i < 100; ++i) (void)sb->Exec(truth);
      double cpu0 = CpuSeconds(::getpid());
      for (int i = 0; i < execs; ++i) {
        auto t0 = Clock::now();
        auto r = sb->Exec(truth);
        if (r.ok() && r->verdict() == dsec::v1::VERDICT_OK) v.push_back(Ms(t0, Clock::now()));
      }
      Pct p = Percentiles(v);
      double cpu_ms = (CpuSeconds(::getpid()) - cpu0) * 1000 / std::max(execs, 1);
      std::printf("exec round trip of `true`, %d sequential execs in one container: p50 %.2f ms, p99 %.2f ms (%zu ok); "
                  "client CPU %.3f ms per exec\n",
                  execs, p.p50, p.p99, v.size(), cpu_ms);
      std::fflush(stdout);
      (void)sb->Destroy();
    }
  }

  if (idle > 0) {
    DropCaches();
    long avail0 = MemAvailableKiB(), rss0 = dsecd ? RssKiB(dsecd) : 0;
    std::mutex mu;
    std::vector<dsec::Sandbox> held;
    std::atomic<int> failed{0};
    auto t0 = Clock::now();
    Parallel(idle, 16, [&](int) {
      auto sb = c.Create(spec);
      if (!sb.ok()) {
        if (failed++ == 0) std::fprintf(stderr, "idle create: %s\n", sb.status().ToString().c_str());
        return;
      }
      std::lock_guard<std::mutex> lk(mu);
      held.push_back(*sb);
    });
    double up_s = std::chrono::duration<double>(Clock::now() - t0).count();
    DropCaches();
    long avail1 = MemAvailableKiB(), rss1 = dsecd ? RssKiB(dsecd) : 0;
    long threads = dsecd ? Threads(dsecd) : 0;
    std::atomic<int> answered{0};
    Parallel(static_cast<int>(held.size()), 16, [&](int i) {
      auto r = held[i].Exec(truth);
      if (r.ok() && r->verdict() == dsec::v1::VERDICT_OK) ++answered;
    });
    size_t n = held.size();
    std::printf("idle containers: %zu up (%d failed) in %.1f s; all answered an exec: %d/%zu\n", n, failed.load(),
                up_s, answered.load(), n);
    if (n)
      std::printf("host memory per idle container: %.2f MiB (MemAvailable drop %.0f MiB), dsecd RSS +%.1f KiB each "
                  "(%ld threads)\n",
                  (avail0 - avail1) / 1024.0 / n, (avail0 - avail1) / 1024.0, double(rss1 - rss0) / n, threads);
    auto r0 = Clock::now();
    Parallel(static_cast<int>(n), 16, [&](int i) { (void)held[i].Destroy(); });
    std::printf("removed %zu idle containers at %.0f/s\n", n, n / std::chrono::duration<double>(Clock::now() - r0).count());
    std::fflush(stdout);
  }

  if (crun_runs > 0) {
    std::string crun;
    for (const char* p : {"/usr/bin/crun", "/usr/local/bin/crun"})
      if (::access(p, X_OK) == 0) crun = p;
    if (crun.empty()) std::printf("crun reference: crun is not installed (apt-get install crun)\n");
    // crun refuses a host with cgroup v2 mounted next to v1 ("hybrid"):
    // in a mount namespace of our own, without the v2 mount, it sees v1
    // only and uses it as dsec does. Done once, after dsec's figures.
    bool hybrid = false;
    {
      std::ifstream mi("/proc/self/mountinfo");
      for (std::string line; std::getline(mi, line);)
        if (line.find(" - cgroup2 ") != std::string::npos) hybrid = true;
    }
    if (!crun.empty() && hybrid) {
      std::ifstream mi("/proc/self/mountinfo");
      std::vector<std::string> v2;
      for (std::string line; std::getline(mi, line);)
        if (line.find(" - cgroup2 ") != std::string::npos) {
          std::istringstream ls(line);
          std::string a, b, c, d, mnt;
          ls >> a >> b >> c >> d >> mnt;
          v2.push_back(mnt);
        }
      bool ok = ::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
      for (const auto& m : v2) ok = ok && ::umount2(m.c_str(), MNT_DETACH) == 0;
      if (!ok) {
        std::printf("crun reference: this host mounts cgroup v2 next to v1, which crun refuses, and hiding it "
                    "failed: %s\n", std::strerror(errno));
        crun.clear();
      }
    }
    if (!crun.empty()) {
      for (int cc : {1, 16}) {
        double per_s = 0;
        Pct p;
        int bad = 0;
        if (CrunBench(crun, rootfs, crun_runs, cc, &per_s, &p, &bad))
          std::printf("crun run of `true` on the same rootfs, conc %d: %.0f runs/s, p50 %.2f ms, p99 %.2f ms (%d failed)\n",
                      cc, per_s, p.p50, p.p99, bad);
      }
    }
  }
  dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
  return 0;
}
