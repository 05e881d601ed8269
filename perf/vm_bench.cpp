// VM-kind macro benchmark (microvm, vm) against a running dsecd, through
// the SDK:
//
//   build/bin/vm_bench --data-dir ./dsec-data --kind microvm --creates 16 --concurrency 1,8 --idle 8
//   build/bin/vm_bench --data-dir ./dsec-data --kind vm --creates 0 --execs 0 --idle 0 --shared-read 128
//
// Prints, each from this one run, with the accelerator the VMs got:
//   - at each concurrency: creations/s, create latency and create-to-first-
//     exec latency (p50, p99; a cold boot each: no pool yet);
//   - with --pool-settle S (against a dsecd with --vm-pool N >= --creates):
//     one creation to start the pool's refill, S seconds for it, then
//     --creates creations one at a time, each from the pool (p50, p99);
//   - exec round trip of `true` in one VM (p50, p99);
//   - with --idle N VMs up at once and settled: host memory per VM as the
//     sum of their QEMU processes' PSS and RSS, divided by N;
//   - with --shared-read MB: 8 VMs (--readers) each read the same file of MB
//     MiB from one image (built uncompressed, so vm's virtio-pmem + DAX can
//     map it): the host memory they hold then, as the sum of their QEMU
//     processes' PSS (a page cache page mapped by k of them counts 1/k to
//     each), and under TCG the same less QEMU's translation buffers (a KVM
//     guest has none). Run it against a dsecd with --vm-image-device pmem,
//     then blk;
//   - with --idle-window W: the same VMs read the file once and then stay
//     mostly idle (a `true` exec each every 45 s) for W seconds: the host
//     memory they hold (sum of QEMU PSS, sampled every second), time-
//     weighted over the window. Run it against a dsecd with
//     --vm-reclaim-idle 0, then with the reclaimer on.
//   - the same-run reference (--baseline N, default 4): N plain QEMU boots,
//     one at a time, of the same kernel and initramfs dsecd boots (from
//     --guest-dir, default <data-dir>/guest), with the accelerator dsecd's
//     VMs got, the same machine type and memory, no devices, and busybox
//     as the first program, which powers off at once: from exec to QEMU's
//     exit (p50, p99). A cold create-to-first-exec above is that plus the
//     image disk, the agent's start and its handshake, and dsecd's work.
// The image (--image, default "bench") is built from the host's own sh,
// true, cat and sleep with dsec-image when dsecd does not have it.
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "dsec/client.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "perf/bench_util.hpp"
#include "runtime/files.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"VM-kind macro benchmark against a running dsecd"};
  std::string addr, data_dir = "./dsec-data", image = "bench", conc = "1,8", kind = "microvm";
  int creates = 16, execs = 200, idle = 8, settle_s = 20, shared_mb = 0, readers = 8, pool_settle_s = 0,
      window_s = 0, baseline = 4;
  std::string guest_dir, qemu = "qemu-system-x86_64";
  app.add_option("--addr", addr, "dsecd SDK entry (default: <data-dir>/dsecd.json)");
  app.add_option("--data-dir", data_dir, "dsecd's data dir")->capture_default_str();
  app.add_option("--kind", kind, "microvm or vm")->capture_default_str();
  app.add_option("--image", image, "image to boot (built from host sh/true when missing)")->capture_default_str();
  app.add_option("--creates", creates, "VMs created per concurrency")->capture_default_str();
  app.add_option("--concurrency", conc, "comma-separated concurrencies")->capture_default_str();
  app.add_option("--execs", execs, "sequential `true` execs for the round trip")->capture_default_str();
  app.add_option("--idle", idle, "idle VMs held at once for the memory figure (0: skip)")->capture_default_str();
  app.add_option("--settle", settle_s, "seconds the idle VMs settle before memory is read")->capture_default_str();
  app.add_option("--shared-read", shared_mb, "MiB of one file 8 VMs read from one image (0: skip)")->capture_default_str();
  app.add_option("--readers", readers, "VMs reading it")->capture_default_str();
  app.add_option("--idle-window", window_s,
                 "seconds the readers of --shared-read then stay mostly idle, for the time-weighted memory figure (0: "
                 "skip)")
      ->capture_default_str();
  app.add_option("--pool-settle", pool_settle_s,
                 "measure creations from the warm pool: seconds for dsecd's pool (--vm-pool) to fill first (0: skip)")
      ->capture_default_str();
  app.add_option("--baseline", baseline, "plain QEMU boots of the same kernel and initramfs: the reference (0: skip)")
      ->capture_default_str();
  app.add_option("--guest-dir", guest_dir, "the guest dsecd boots (default: <data-dir>/guest)");
  app.add_option("--qemu", qemu, "QEMU for the reference")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::string vm_root = data_dir + (kind == "vm" ? "/domains/" : "/vms/");
  auto qemu_memory = [&] {
    long pss = 0, rss = 0;
    int n = 0;
    for (pid_t p : dsec::testing::ProcessesMatching(vm_root)) {
      auto [a, b] = PssRss(p);
      pss += a;
      rss += b;
      ++n;
    }
    return std::make_tuple(pss, rss, n);
  };
  // The sum of QEMU PSS less the TCG translation buffers (KiB).
  auto qemu_memory_without_tcg = [&] {
    long pss = 0;
    for (pid_t p : dsec::testing::ProcessesMatching(vm_root)) pss += PssRss(p).first - TcgBufferPss(p);
    return pss;
  };
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
  // An image of the host's sh, true, cat and sleep (plus a file of `blob_mb`
  // MiB of random bytes at /data/blob), unless dsecd has `name` already.
  auto ensure_image = [&](const std::string& name, int blob_mb, const std::string& compress) {
    if (client.GetImage(name).ok()) return true;
    std::string rootfs = "/tmp/dsec-bench-vm-rootfs";
    dsec::testing::RootfsOptions ro;
    ro.programs = {"sh", "true", "cat", "sleep"};
    ro.python = false;
    if (auto st = dsec::testing::MakeRootfs(rootfs, ro); !st.ok()) {
      std::fprintf(stderr, "vm_bench: rootfs: %s\n", st.ToString().c_str());
      return false;
    }
    if (blob_mb > 0) {
      dsec::testing::RunProcess({"/bin/mkdir", "-p", rootfs + "/data"});
      dsec::testing::RunProcess({"/bin/dd", "if=/dev/urandom", "of=" + rootfs + "/data/blob", "bs=1M",
                                 "count=" + std::to_string(blob_mb), "status=none"});
    }
    auto r = dsec::testing::RunProcess({dsec::testing::BinDir() + "/dsec-image", "--data-dir", data_dir, "build",
                                        "--compress", compress, rootfs, name});
    dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
    if (r.exit_code != 0) std::fprintf(stderr, "vm_bench: dsec-image build: %s\n", r.err.c_str());
    return r.exit_code == 0;
  };
  if (!ensure_image(image, 0, "lz4")) return 1;
  dsec::v1::SandboxSpec spec = dsec::ContainerSpec(image);
  dsec::v1::Kind k;
  if (!dsec::v1::Kind_Parse("KIND_" + std::string(kind == "vm" ? "VM" : "MICROVM"), &k)) return 2;
  spec.set_kind(k);
  spec.mutable_limits()->set_memory_bytes(256ull << 20);
  std::string accel = "?";
  auto exec_true = dsec::Command({"true"});
  for (int n : creates > 0 ? SplitInts(conc) : std::vector<int>{}) {
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
  if (baseline > 0) {
    if (guest_dir.empty()) guest_dir = data_dir + "/guest";
    // A bare name is looked up in PATH (the spawn below does not).
    if (qemu.find('/') == std::string::npos) {
      const char* path = std::getenv("PATH");
      std::istringstream dirs(path ? path : "/usr/bin:/bin");
      for (std::string dir; std::getline(dirs, dir, ':');)
        if (!dir.empty() && ::access((dir + "/" + qemu).c_str(), X_OK) == 0) {
          qemu = dir + "/" + qemu;
          break;
        }
    }
    bool kvm = accel == "kvm";
    std::vector<double> boot_ms;
    int failed = 0;
    for (int i = 0; i < baseline; ++i) {
      auto t0 = Clock::now();
      auto r = dsec::testing::RunProcess(
          {qemu, "-M", kind == "vm" ? "q35" : "microvm,acpi=on,rtc=on", "-accel", kvm ? "kvm" : "tcg,tb-size=64",
           "-cpu", kvm ? "host" : "max", "-m", "256", "-smp", "1", "-nodefaults", "-no-user-config", "-nographic",
           "-no-reboot", "-kernel", guest_dir + "/vmlinux", "-initrd", guest_dir + "/base.cpio", "-append",
           "console=ttyS0 quiet panic=-1 reboot=t rdinit=/bin/busybox -- poweroff -f"});
      if (r.exit_code != 0) {
        if (failed++ == 0) std::fprintf(stderr, "vm_bench: plain QEMU boot: exit %d: %s\n", r.exit_code, r.err.c_str());
        continue;
      }
      boot_ms.push_back(Ms(t0, Clock::now()));
    }
    auto pb = Percentiles(boot_ms);
    std::printf("reference: plain QEMU boot of the same kernel and initramfs to its first program and out (%s, %s), "
                "one at a time: p50 %.0f ms p99 %.0f ms (%zu ok, %d failed)\n",
                kind == "vm" ? "q35" : "microvm", kvm ? "kvm" : "tcg", pb.p50, pb.p99, boot_ms.size(), failed);
  }
  if (pool_settle_s > 0 && creates > 0) {
    if (auto prime = client.Create(spec); prime.ok()) {  // starts the refill
      if (auto rec = prime->Get(); rec.ok()) accel = rec->accelerator();
      (void)prime->Destroy();
    }
    std::this_thread::sleep_for(std::chrono::seconds(pool_settle_s));          // the pool fills: what is measured is a take
    std::vector<double> create_ms, first_ms;
    std::vector<dsec::Sandbox> made;
    for (int i = 0; i < creates; ++i) {
      auto t0 = Clock::now();
      auto sb = client.Create(spec);
      auto t1 = Clock::now();
      if (!sb.ok()) continue;
      made.push_back(*sb);
      auto r = sb->Exec(exec_true);
      if (!r.ok() || r->verdict() != dsec::v1::VERDICT_OK) continue;
      create_ms.push_back(Ms(t0, t1));
      first_ms.push_back(Ms(t0, Clock::now()));
    }
    auto pc = Percentiles(create_ms), pf = Percentiles(first_ms);
    std::printf("%s (%s) from the pool, one at a time: %zu created; create p50 %.0f ms p99 %.0f ms; "
                "create-to-first-exec p50 %.0f ms p99 %.0f ms\n",
                kind.c_str(), accel.c_str(), create_ms.size(), pc.p50, pc.p99, pf.p50, pf.p99);
    for (auto& sb : made) (void)sb.Destroy();
  }
  if (execs > 0) {
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
    auto [pss, rss, n] = qemu_memory();
    if (n > 0)
      std::printf("%s (%s) idle, %d VMs of 256 MiB up %d s: host memory per VM: PSS %.1f MiB, RSS %.1f MiB "
                  "(%d QEMU processes)\n",
                  kind.c_str(), accel.c_str(), static_cast<int>(held.size()), settle_s, pss / 1024.0 / n,
                  rss / 1024.0 / n, n);
    for (auto& sb : held) (void)sb.Destroy();
  }
  if (shared_mb > 0) {
    const std::string shared_image = "bench-shared-" + std::to_string(shared_mb);
    if (!ensure_image(shared_image, shared_mb, "none")) return 1;
    dsec::v1::SandboxSpec shared = dsec::ContainerSpec(shared_image);
    shared.set_kind(k);
    shared.mutable_limits()->set_memory_bytes(256ull << 20);
    std::vector<dsec::Sandbox> held;
    for (int i = 0; i < readers; ++i)
      if (auto sb = client.Create(shared); sb.ok()) held.push_back(*sb);
    std::this_thread::sleep_for(std::chrono::seconds(settle_s));  // boot-time memory settles first
    auto [pss0, rss0, n0] = qemu_memory();
    long peak = pss0, bare0 = qemu_memory_without_tcg(), bare_peak = bare0;
    int read_ok = 0;
    for (auto& sb : held) {
      auto r = sb.Exec(dsec::Command({"sh", "-c", "cat /data/blob > /dev/null && echo read"}));
      if (r.ok() && r->stdout() == "read\n") ++read_ok;
      peak = std::max(peak, std::get<0>(qemu_memory()));
      bare_peak = std::max(bare_peak, qemu_memory_without_tcg());
    }
    std::this_thread::sleep_for(std::chrono::seconds(5));  // what stays held after the reads
    auto [pss1, rss1, n1] = qemu_memory();
    peak = std::max(peak, pss1);
    bare_peak = std::max(bare_peak, qemu_memory_without_tcg());
    std::string device = "?";
    if (!held.empty()) {
      // The image's device: the disks but the guest's (unused) loop devices.
      auto r = held[0].Exec(dsec::Command({"sh", "-c", "cd /sys/block && for d in *; do case $d in loop*) ;; *) echo $d;; esac; done"}));
      if (r.ok()) device = r->stdout().substr(0, r->stdout().find('\n'));
      if (auto rec = held[0].Get(); rec.ok()) accel = rec->accelerator();
    }
    if (window_s > 0) {
      // Mostly idle: a `true` in each every 45 s; memory sampled every second.
      double sum = 0;
      long top = 0;
      int samples = 0;
      auto start = Clock::now();
      auto next_touch = start + std::chrono::seconds(45);
      while (Clock::now() - start < std::chrono::seconds(window_s)) {
        if (Clock::now() >= next_touch) {
          for (auto& sb : held) (void)sb.Exec(exec_true);
          next_touch += std::chrono::seconds(45);
        }
        long pss = std::get<0>(qemu_memory());
        sum += pss;
        top = std::max(top, pss);
        ++samples;
        std::this_thread::sleep_for(std::chrono::seconds(1));  // the sampling period of the figure
      }
      std::printf("%s (%s) %d VMs mostly idle for %d s after reading %d MiB each: host memory (sum of QEMU PSS) "
                  "time-weighted %.0f MiB, peak %.0f MiB, end %.0f MiB (%d samples)\n",
                  kind.c_str(), accel.c_str(), static_cast<int>(held.size()), window_s, shared_mb,
                  samples ? sum / samples / 1024.0 : 0.0, top / 1024.0, std::get<0>(qemu_memory()) / 1024.0, samples);
    }
    std::printf("%s (%s) %d VMs (image on %s) each read the same %d MiB file: host memory (sum of QEMU PSS) "
                "before %.0f MiB, after %.0f MiB, peak %.0f MiB (%d QEMU processes, %d reads ok)\n",
                kind.c_str(), accel.c_str(), static_cast<int>(held.size()), device.c_str(), shared_mb,
                pss0 / 1024.0, pss1 / 1024.0, peak / 1024.0, n1, read_ok);
    if (accel == "tcg")
      std::printf("%s (%s) the same less QEMU's TCG translation buffers (code generated for the guest, which a "
                  "KVM guest has none of): before %.0f MiB, peak %.0f MiB\n",
                  kind.c_str(), accel.c_str(), bare0 / 1024.0, bare_peak / 1024.0);
    for (auto& sb : held) (void)sb.Destroy();
  }
  return 0;
}
