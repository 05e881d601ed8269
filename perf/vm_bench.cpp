// VM-kind macro benchmark (microvm; vm when it lands) against a running
// dsecd, through the SDK:
//
//   build/bin/vm_bench --data-dir ./dsec-data --kind microvm --creates 16 --concurrency 1,8 --idle 8
//
// Prints, each from this one run, with the accelerator the VMs got:
//   - at each concurrency: creations/s, create latency and create-to-first-
//     exec latency (p50, p99; a cold boot each: no pool yet);
//   - exec round trip of `true` in one VM (p50, p99);
//   - with --idle N VMs up at once and settled: host memory per VM as the
//     sum of their QEMU processes' PSS and RSS, divided by N.
// The image (--image, default "bench") is built from the host's own sh,
// true, cat and sleep with dsec-image when dsecd does not have it.
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers

// Pss and Rss (KiB) of `pid`, from smaps_rollup.
std::pair<long, long> PssRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  long pss = 0, rss = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Pss:", 0) == 0) pss = std::atol(line.c_str() + 4);
    if (line.rfind("Rss:", 0) == 0) rss = std::atol(line.c_str() + 4);
  }
  return {pss, rss};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"VM-kind macro benchmark against a running dsecd"};
  std::string addr, data_dir = "./dsec-data", image = "bench", conc = "1,8", kind = "microvm";
  int creates = 16, execs = 200, idle = 8, settle_s = 20;
  app.add_option("--addr", addr, "dsecd SDK entry (default: <data-dir>/dsecd.json)");
  app.add_option("--data-dir", data_dir, "dsecd's data dir")->capture_default_str();
  app.add_option("--kind", kind, "microvm or vm")->capture_default_str();
  app.add_option("--image", image, "image to boot (built from host sh/true when missing)")->capture_default_str();
  app.add_option("--creates", creates, "VMs created per concurrency")->capture_default_str();
  app.add_option("--concurrency", conc, "comma-separated concurrencies")->capture_default_str();
  app.add_option("--execs", execs, "sequential `true` execs for the round trip")->capture_default_str();
  app.add_option("--idle", idle, "idle VMs held at once for the memory figure (0: skip)")->capture_default_str();
  app.add_option("--settle", settle_s, "seconds the idle VMs settle before memory is read")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  data_dir = dsec::AbsolutePath(data_dir);
  dsec::ClientOptions o;
  o.data_dir = data_dir;
  if (!addr.empty()) o.address = addr;
  auto c = dsec::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "vm_bench: %s\n", c.status().ToString().c_str());
    return 1;
  }
  auto& client = **c;
  if (!client.GetImage(image).ok()) {
    std::string rootfs = "/tmp/dsec-bench-vm-rootfs";
    dsec::testing::RootfsOptions ro;
    ro.programs = {"sh", "true", "cat", "sleep"};
    ro.python = false;
    if (auto st = dsec::testing::MakeRootfs(rootfs, ro); !st.ok()) {
      std::fprintf(stderr, "vm_bench: rootfs: %s\n", st.ToString().c_str());
      return 1;
    }
    auto r = dsec::testing::RunProcess(
        {dsec::testing::BinDir() + "/dsec-image", "--data-dir", data_dir, "build", rootfs, image});
    dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
    if (r.exit_code != 0) {
      std::fprintf(stderr, "vm_bench: dsec-image build: %s\n", r.err.c_str());
      return 1;
    }
  }
  dsec::v1::SandboxSpec spec = dsec::ContainerSpec(image);
  dsec::v1::Kind k;
  if (!dsec::v1::Kind_Parse("KIND_" + std::string(kind == "vm" ? "VM" : "MICROVM"), &k)) return 2;
  spec.set_kind(k);
  spec.mutable_limits()->set_memory_bytes(256ull << 20);
  std::string accel = "?";
  auto exec_true = dsec::Command({"true"});
  for (int n : SplitInts(conc)) {
    std::mutex mu;
    std::vector<double> create_ms, first_ms;
    std::vector<dsec::Sandbox> made;
    std::atomic<int> failed{0};
    double s = Parallel(creates, n, [&](int) {
      auto t0 = Clock::now();
      auto sb = client.Create(spec);
      auto t1 = Clock::now();
      if (!sb.ok()) {
        if (failed++ == 0) std::fprintf(stderr, "vm_bench: create: %s\n", sb.status().ToString().c_str());
        return;
      }
      auto r = sb->Exec(exec_true);
      auto t2 = Clock::now();
      std::lock_guard<std::mutex> lk(mu);
      made.push_back(*sb);
      if (!r.ok() || r->verdict() != dsec::v1::VERDICT_OK) {
        ++failed;
        return;
      }
      create_ms.push_back(Ms(t0, t1));
      first_ms.push_back(Ms(t0, t2));
    });
    if (!made.empty())
      if (auto rec = made[0].Get(); rec.ok()) accel = rec->accelerator();
    auto pc = Percentiles(create_ms), pf = Percentiles(first_ms);
    std::printf("%s (%s) concurrency %d: %d created in %.1f s = %.2f/s; create p50 %.0f ms p99 %.0f ms; "
                "create-to-first-exec (cold boot) p50 %.0f ms p99 %.0f ms; failed %d\n",
                kind.c_str(), accel.c_str(), n, static_cast<int>(create_ms.size()), s, create_ms.size() / s, pc.p50,
                pc.p99, pf.p50, pf.p99, failed.load());
    double rs = Parallel(static_cast<int>(made.size()), n, [&](int i) { (void)made[i].Destroy(); });
    std::printf("  removed %zu in %.1f s\n", made.size(), rs);
  }
  {
    auto sb = client.Create(spec);
    if (sb.ok()) {
      std::vector<double> v;
      for (int i = 0; i < execs; ++i) {
        auto t0 = Clock::now();
        auto r = sb->Exec(exec_true);
        if (r.ok()) v.push_back(Ms(t0, Clock::now()));
      }
      auto p = Percentiles(v);
      std::printf("%s (%s) exec round trip of `true`: p50 %.2f ms p99 %.2f ms (%zu execs)\n", kind.c_str(),
                  accel.c_str(), p.p50, p.p99, v.size());
      (void)sb->Destroy();
    }
  }
  if (idle > 0) {
    std::vector<dsec::Sandbox> held;
    for (int i = 0; i < idle; ++i)
      if (auto sb = client.Create(spec); sb.ok()) held.push_back(*sb);
    std::this_thread::sleep_for(std::chrono::seconds(settle_s));  // the measured quantity is memory after settling
    long pss = 0, rss = 0;
    int n = 0;
    for (pid_t p : dsec::testing::ProcessesMatching(data_dir + "/vms/")) {
      auto [a, b] = PssRss(p);
      pss += a;
      rss += b;
      ++n;
    }
    if (n > 0)
      std::printf("%s (%s) idle, %d VMs of 256 MiB up %d s: host memory per VM: PSS %.1f MiB, RSS %.1f MiB "
                  "(%d QEMU processes)\n",
                  kind.c_str(), accel.c_str(), static_cast<int>(held.size()), settle_s, pss / 1024.0 / n,
                  rss / 1024.0 / n, n);
    for (auto& sb : held) (void)sb.Destroy();
  }
  return 0;
}
