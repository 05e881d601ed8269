// microVM snapshots, restores and forks (issue 30), with its own dsecd:
//
//   build/bin/vm_fork_bench --fork 16 --rounds 8
//   build/bin/vm_fork_bench --kind vm --fork 4 --rounds 4 --pause 4
//
// Prints, each from this one run, guests of 256 MiB:
//   - cold boot: create + first exec (`true`) answered, one at a time, p50/p99;
//   - from the warm pool (a second dsecd with --vm-pool 1): the same, p50/p99,
//     and from a named snapshot's pool there (restored ahead);
//   - Snapshot() of a running guest, p50/p99, and how long the guest stood;
//   - restore: create from the snapshot + first exec answered, p50/p99;
//   - Fork(n) to all ready (every fork's first exec answered);
//   - host memory: the sum of QEMU PSS of the n forks against n cold guests
//     (each settled), and the snapshot's memory file;
//   - Pause(memory) and Resume of --pause guests at once: their times, and
//     the sum of QEMU PSS before, while paused (no QEMU) and after.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "dsec/client.hpp"
#include "dsec/snapshot.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "perf/bench_daemon.hpp"
#include "perf/bench_util.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers

int Fail(const std::string& what, const dsec::Status& s) {
  std::fprintf(stderr, "vm_fork_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

bool FirstExec(const dsec::Sandbox& sb) {
  auto r = sb.Exec(dsec::Command({"/bin/true"}));
  return r.ok() && r->exit_code() == 0;
}

// The sum of PSS (KiB) of the QEMU processes of `sbs`, how many, and the
// sum less their TCG translation buffers (a KVM host's QEMU has none).
struct Pss {
  long pss = 0, guest = 0;
  int n = 0;
};
// A guest's QEMU is found by what its command line holds: a microvm's
// its dir (<vm_root><id>/), a vm's its domain's name (guest=dsec-<tag>-<id>,).
Pss QemuPss(const std::string& vm_root, const std::vector<dsec::Sandbox>& sbs) {
  Pss out;
  for (const auto& sb : sbs)
    for (pid_t p : dsec::testing::ProcessesMatching(vm_root.empty() ? "-" + sb.id() + "," : vm_root + sb.id() + "/")) {
      long pss = PssRss(p).first;
      out.pss += pss;
      out.guest += pss - TcgBufferPss(p);
      ++out.n;
    }
  return out;
}

struct Bench {
  dsec::testing::TestDaemon* daemon;
  dsec::Client* client;
  dsec::v1::SandboxSpec spec;
  std::string vm_root;
};

// `rounds` creations of `spec`, one at a time, each to its first exec: ms.
dsec::Result<std::vector<double>> Creations(const Bench& b, const dsec::v1::SandboxSpec& spec, int rounds,
                                            std::vector<dsec::Sandbox>* keep = nullptr) {
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    auto sb = b.client->Create(spec);
    if (!sb.ok()) return sb.status();
    if (!FirstExec(*sb)) return dsec::Status::Internal("first exec of " + sb->id());
    ms.push_back(Ms(t0, Clock::now()));
    if (keep) keep->push_back(*sb);
    else (void)sb->Destroy();
  }
  return ms;
}

void DestroyAll(std::vector<dsec::Sandbox>* sbs) {
  for (auto& sb : *sbs) (void)sb.Destroy();
  sbs->clear();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"microVM snapshot, restore and fork against cold boots and the warm pool (starts its own dsecd)"};
  int fork_n = 16, rounds = 8, settle_s = 10, pause_n = 8;
  std::string kind = "microvm";
  app.add_option("--kind", kind, "microvm or vm (libvirt)")->check(CLI::IsMember({"microvm", "vm"}))->capture_default_str();
  app.add_option("--fork", fork_n, "forks (and cold guests) whose memory is compared (1-100)")->capture_default_str();
  app.add_option("--rounds", rounds, "creations, snapshots and restores timed")->capture_default_str();
  app.add_option("--pause", pause_n, "guests paused with memory and resumed at once")->capture_default_str();
  app.add_option("--settle", settle_s, "seconds guests settle before their memory is read")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto daemon = StartBenchDaemon();
  if (!daemon.ok()) return Fail("dsecd", daemon.status());
  auto& d = **daemon;
  auto scratch = ScratchRootfs("dsec-vm-fork-bench", {"sh", "true", "cat", "echo", "sleep", "head"});
  if (!scratch.ok()) return Fail("rootfs", scratch.status());
  const std::string rootfs = *scratch;
  if (auto built = BuildBenchImage(d, rootfs, "vm-fork-bench"); !built.ok()) return Fail("image", built);
  auto client = BenchClient(d);
  if (!client.ok()) return Fail("connect", client.status());
  const bool microvm = kind == "microvm";
  Bench b{&d, &**client, dsec::ContainerSpec("vm-fork-bench"), microvm ? d.data_dir() + "/vms/" : ""};
  b.spec.set_kind(microvm ? dsec::v1::KIND_MICROVM : dsec::v1::KIND_VM);
  b.spec.mutable_limits()->set_memory_bytes(256ull << 20);
  std::printf("# vm_fork_bench: dsecd pid %d, %s guests of 256 MiB\n", d.pid(), kind.c_str());

  auto cold = Creations(b, b.spec, rounds);
  if (!cold.ok()) return Fail("cold boot", cold.status());
  Pct pc = Percentiles(*cold);
  std::printf("cold boot to first exec:      p50 %6.0f ms  p99 %6.0f ms  (%d)\n", pc.p50, pc.p99, rounds);

  auto source = b.client->Create(b.spec);
  if (!source.ok()) return Fail("source", source.status());
  // Something in its memory: a counter, and 32 MiB of a file in its tmpfs.
  auto primed = source->Exec(dsec::Command(
      {"/bin/sh", "-c", "head -c 33554432 /dev/urandom > /tmp/blob && "
                        "{ sh -c 'i=0; while :; do i=$((i+1)); echo $i > /run/count; sleep 0.1; done' "
                        ">/dev/null 2>&1 </dev/null & }"}));
  if (!primed.ok() || primed->exit_code() != 0) return Fail("prime the source", primed.status());
  std::vector<double> snap_ms;
  uint64_t snap_bytes = 0;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    auto s = dsec::Snapshot(*source, "bench-" + std::to_string(i));
    snap_ms.push_back(Ms(t0, Clock::now()));
    if (!s.ok()) return Fail("snapshot", s.status());
    snap_bytes = s->size_bytes();
    if (i + 1 < rounds) (void)dsec::RemoveSnapshot(*b.client, s->name());
  }
  Pct ps = Percentiles(snap_ms);
  std::printf("Snapshot():                   p50 %6.0f ms  p99 %6.0f ms  (%d; memory file %.1f MiB)\n", ps.p50,
              ps.p99, rounds, snap_bytes / 1048576.0);

  auto from = b.spec;
  from.set_snapshot("bench-" + std::to_string(rounds - 1));
  auto restored = Creations(b, from, rounds);
  if (!restored.ok()) return Fail("restore", restored.status());
  Pct pr = Percentiles(*restored);
  std::printf("restore to first exec:        p50 %6.0f ms  p99 %6.0f ms  (%d)   vs cold boot %.2fx\n", pr.p50,
              pr.p99, rounds, pr.p50 / pc.p50);

  auto t0 = Clock::now();
  auto forks = dsec::Fork(*source, static_cast<uint32_t>(fork_n));
  if (!forks.ok()) return Fail("fork", forks.status());
  std::vector<std::future<bool>> firsts;
  for (const auto& f : *forks) firsts.push_back(std::async(std::launch::async, [f] { return FirstExec(f); }));
  for (auto& f : firsts)
    if (!f.get()) return Fail("a fork's first exec", dsec::Status::Internal("failed"));
  double fork_ms = Ms(t0, Clock::now());
  std::printf("Fork(%d) to all ready:        %6.0f ms  (%.0f ms each)\n", fork_n, fork_ms, fork_ms / fork_n);
  std::this_thread::sleep_for(std::chrono::seconds(settle_s));  // what is measured is memory after settling
  Pss fork_pss = QemuPss(b.vm_root, *forks);
  DestroyAll(&*forks);

  std::vector<dsec::Sandbox> colds;
  auto cold_n = Creations(b, b.spec, fork_n, &colds);
  if (!cold_n.ok()) return Fail("cold guests", cold_n.status());
  for (auto& sb : colds) {
    auto r = sb.Exec(dsec::Command({"/bin/sh", "-c", "head -c 33554432 /dev/urandom > /tmp/blob"}));
    if (!r.ok() || r->exit_code() != 0) return Fail("cold guest's file", r.status());
  }
  std::this_thread::sleep_for(std::chrono::seconds(settle_s));
  Pss cold_pss = QemuPss(b.vm_root, colds);
  std::printf("host memory, sum of QEMU PSS: %d forks %.0f MiB (%d QEMU)  vs %d cold guests with the same 32 MiB "
              "file %.0f MiB (%d QEMU): %.2fx;\n  less the TCG translation buffers: %.0f MiB vs %.0f MiB: %.2fx\n",
              fork_n, fork_pss.pss / 1024.0, fork_pss.n, fork_n, cold_pss.pss / 1024.0, cold_pss.n,
              static_cast<double>(fork_pss.pss) / cold_pss.pss, fork_pss.guest / 1024.0, cold_pss.guest / 1024.0,
              static_cast<double>(fork_pss.guest) / cold_pss.guest);
  (void)source->Destroy();

  // Pause with memory: the first `pause_n` cold guests (settled, with
  // their 32 MiB file) go to disk and come back, all at once each way.
  std::vector<dsec::Sandbox> paused(colds.begin(), colds.begin() + std::min<size_t>(colds.size(), pause_n));
  Pss before = QemuPss(b.vm_root, paused);
  auto all = [&](auto call) {
    std::vector<std::future<dsec::Status>> f;
    for (const auto& sb : paused) f.push_back(std::async(std::launch::async, [&call, sb] { return call(sb); }));
    dsec::Status first;
    for (auto& x : f)
      if (auto s = x.get(); !s.ok() && first.ok()) first = s;
    return first;
  };
  t0 = Clock::now();
  if (auto s = all([](const dsec::Sandbox& sb) { return sb.Pause(true); }); !s.ok()) return Fail("pause", s);
  double pause_ms = Ms(t0, Clock::now());
  Pss during = QemuPss(b.vm_root, paused);
  t0 = Clock::now();
  if (auto s = all([](const dsec::Sandbox& sb) {
        dsec::Status r = sb.Resume();
        return r.ok() && !FirstExec(sb) ? dsec::Status::Internal("first exec after resume") : r;
      });
      !s.ok())
    return Fail("resume", s);
  double resume_ms = Ms(t0, Clock::now());
  std::this_thread::sleep_for(std::chrono::seconds(settle_s));
  Pss after = QemuPss(b.vm_root, paused);
  std::printf("Pause(memory) of %zu guests: %.0f ms all (%.0f ms each); Resume to first exec: %.0f ms all (%.0f ms "
              "each)\n  sum of QEMU PSS: before %.0f MiB (%d QEMU), paused %.0f MiB (%d QEMU), resumed %.0f MiB (%d "
              "QEMU)\n",
              paused.size(), pause_ms, pause_ms / paused.size(), resume_ms, resume_ms / paused.size(), before.pss / 1024.0,
              before.n, during.pss / 1024.0, during.n, after.pss / 1024.0, after.n);
  DestroyAll(&colds);

  daemon->reset();

  // The warm pool, on a dsecd of its own: each creation takes a booted
  // guest, and the pool boots the next meanwhile (`settle` seconds apart).
  auto pooled = StartBenchDaemon({"--vm-pool", "1"});
  if (!pooled.ok()) return Fail("dsecd with a pool", pooled.status());
  auto& pd = **pooled;
  if (auto built = BuildBenchImage(pd, rootfs, "vm-fork-bench"); !built.ok()) return Fail("image", built);
  auto pclient = BenchClient(pd);
  if (!pclient.ok()) return Fail("connect", pclient.status());
  Bench pb{&pd, &**pclient, b.spec, microvm ? pd.data_dir() + "/vms/" : ""};
  if (auto first = Creations(pb, pb.spec, 1); !first.ok()) return Fail("the pool's first", first.status());
  std::vector<double> warm;
  for (int i = 0; i < rounds; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(settle_s));  // the pool refills
    auto one = Creations(pb, pb.spec, 1);
    if (!one.ok()) return Fail("from the pool", one.status());
    warm.push_back(one->front());
  }
  Pct pw = Percentiles(warm);
  std::printf("warm pool to first exec:      p50 %6.0f ms  p99 %6.0f ms  (%d)   restore vs pool %.2fx\n", pw.p50,
              pw.p99, rounds, pr.p50 / pw.p50);
  // A named snapshot's pool on the same dsecd: guests restored ahead, each
  // given its identity when taken.
  auto psource = pb.client->Create(pb.spec);
  if (!psource.ok()) return Fail("the pool's source", psource.status());
  if (auto s = dsec::Snapshot(*psource, "pool-bench"); !s.ok()) return Fail("the pool's snapshot", s.status());
  auto pfrom = pb.spec;
  pfrom.set_snapshot("pool-bench");
  if (auto first = Creations(pb, pfrom, 1); !first.ok()) return Fail("the snapshot pool's first", first.status());
  std::vector<double> warm_restore;
  for (int i = 0; i < rounds; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(settle_s));  // the snapshot's pool refills
    auto one = Creations(pb, pfrom, 1);
    if (!one.ok()) return Fail("from the snapshot's pool", one.status());
    warm_restore.push_back(one->front());
  }
  Pct pws = Percentiles(warm_restore);
  std::printf("snapshot's pool to first exec: p50 %6.0f ms  p99 %6.0f ms  (%d)   restore vs its pool %.2fx\n",
              pws.p50, pws.p99, rounds, pr.p50 / pws.p50);
  (void)psource->Destroy();
  dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
  return 0;
}
