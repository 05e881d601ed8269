// Container fork (issue 30), with its own dsecd, on an image whose task
// repository has 10 000 files, of which the source changes 100:
//
//   build/bin/fork_bench --counts 16,100 --rounds 3
//
// Prints, each from this one run, per count n:
//   - Fork(n) to all ready: from the call until every fork has answered its
//     first exec (`true`), median over the rounds;
//   - the same n fresh containers of the image, each created and its first
//     exec answered, all at once (what a trainer without fork starts from,
//     before replaying the source's steps);
//   - the fork's snapshot: its entries and bytes (the changes, not the tree).
// And Snapshot() alone (the copy of 100 changed files), p50/p99; and two
// snapshots of a sandbox that wrote 2 000 files of 16 KiB (its own tree,
// as a pip install or a build makes), 10 of them changed between the two:
// what the second stores and shares with the first (layers deduplicated
// where they are the same), and what each took.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <string>
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
  std::fprintf(stderr, "fork_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// Each sandbox's first exec, all at once; false when one failed.
bool FirstExecs(const std::vector<dsec::Sandbox>& sbs) {
  std::vector<std::future<dsec::Result<dsec::v1::ExecResult>>> done;
  for (const auto& sb : sbs) done.push_back(sb.ExecAsync(dsec::Command({"/bin/true"})));
  bool ok = true;
  for (auto& f : done) {
    auto r = f.get();
    ok = ok && r.ok() && r->exit_code() == 0;
  }
  return ok;
}

void DestroyAll(const std::vector<dsec::Sandbox>& sbs) {
  std::vector<std::future<void>> gone;
  for (const auto& sb : sbs) gone.push_back(std::async(std::launch::async, [sb] { (void)sb.Destroy(); }));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"container fork: Fork(n) to all ready against n fresh containers (starts its own dsecd)"};
  std::string counts = "16,100";
  int rounds = 3, snapshots = 30;
  app.add_option("--counts", counts, "fork sizes, comma-separated (1-100 each)")->capture_default_str();
  app.add_option("--rounds", rounds, "rounds per size (the median is printed)")->capture_default_str();
  app.add_option("--snapshots", snapshots, "Snapshot() calls timed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto daemon = StartBenchDaemon();
  if (!daemon.ok()) return Fail("dsecd", daemon.status());
  auto& d = **daemon;
  auto scratch = ScratchRootfs("dsec-fork-bench", {"sh", "true", "cat", "echo", "seq", "head", "mkdir"});
  if (!scratch.ok()) return Fail("rootfs", scratch.status());
  const std::string rootfs = *scratch;
  auto repo = dsec::testing::RunProcess(
      {"/bin/sh", "-c",
       "mkdir -p " + rootfs + "/work/repo && cd " + rootfs + "/work/repo && for d in $(seq 0 99); do mkdir d$d; "
       "for f in $(seq 0 99); do echo \"x = $d$f\" > d$d/f$f.py; done; done"});
  auto built = dsec::testing::RunProcess(
      {dsec::testing::BinDir() + "/dsec-image", "--data-dir", d.data_dir(), "build", rootfs, "fork-bench"});
  dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
  if (repo.exit_code != 0 || built.exit_code != 0) {
    std::fprintf(stderr, "fork_bench: image: %s %s\n", repo.err.c_str(), built.err.c_str());
    return 1;
  }
  dsec::ClientOptions co;
  co.address = d.sdk_addr();
  co.data_dir = d.data_dir();
  auto client = dsec::Client::Connect(co);
  if (!client.ok()) return Fail("connect", client.status());
  auto& c = **client;
  auto spec = dsec::ContainerSpec("fork-bench");
  auto source = c.Create(spec);
  if (!source.ok()) return Fail("source", source.status());
  auto changed = source->Exec(dsec::Command(
      {"/bin/sh", "-c", "cd /work/repo && for d in 0 1 2 3 4 5 6 7 8 9; do for f in 0 1 2 3 4 5 6 7 8 9; do "
                        "echo changed >> d$d/f$f.py; done; done"}));
  if (!changed.ok() || changed->exit_code() != 0) return Fail("change", changed.status());
  std::printf("# fork_bench: dsecd pid %d; image: 10 000 files under /work/repo, 100 changed in the source\n",
              d.pid());

  std::vector<double> snap_ms;
  for (int i = 0; i < snapshots; ++i) {
    auto t0 = Clock::now();
    auto s = dsec::Snapshot(*source, "bench-" + std::to_string(i));
    snap_ms.push_back(Ms(t0, Clock::now()));
    if (!s.ok()) return Fail("snapshot", s.status());
    (void)dsec::RemoveSnapshot(c, s->name());
  }
  Pct sp = Percentiles(snap_ms);
  std::printf("Snapshot() of 100 changed files: p50 %.1f ms  p99 %.1f ms\n", sp.p50, sp.p99);

  {
    auto writer = c.Create(spec);
    if (!writer.ok()) return Fail("writer", writer.status());
    auto wrote = writer->Exec(dsec::Command(
        {"/bin/sh", "-c", "mkdir -p /work/out && for i in $(seq 1 2000); do head -c 16384 /dev/urandom > "
                          "/work/out/f$i; done"}));
    if (!wrote.ok() || wrote->exit_code() != 0) return Fail("write 2000 files", wrote.status());
    auto t0 = Clock::now();
    auto first = dsec::Snapshot(*writer, "dedup-1");
    double first_ms = Ms(t0, Clock::now());
    if (!first.ok()) return Fail("snapshot", first.status());
    auto more = writer->Exec(dsec::Command(
        {"/bin/sh", "-c", "for i in $(seq 1 10); do head -c 16384 /dev/urandom > /work/out/f$i; done"}));
    if (!more.ok() || more->exit_code() != 0) return Fail("change 10 files", more.status());
    t0 = Clock::now();
    auto second = dsec::Snapshot(*writer, "dedup-2");
    double second_ms = Ms(t0, Clock::now());
    if (!second.ok()) return Fail("snapshot", second.status());
    auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
    std::printf("2 snapshots of 2000 written files (10 changed between): first %.1f MiB stored in %.0f ms; "
                "second %.1f MiB of which %.1f MiB shared, %.2f MiB stored (%.3fx of a full copy) in %.0f ms\n",
                mib(first->size_bytes()), first_ms, mib(second->size_bytes()), mib(second->shared_bytes()),
                mib(second->size_bytes() - second->shared_bytes()),
                static_cast<double>(second->size_bytes() - second->shared_bytes()) /
                    static_cast<double>(std::max<uint64_t>(second->size_bytes(), 1)),
                second_ms);
    (void)writer->Destroy();
    (void)dsec::RemoveSnapshot(c, "dedup-2");
    (void)dsec::RemoveSnapshot(c, "dedup-1");
  }

  for (int n : SplitInts(counts)) {
    std::vector<double> fork_ms, fresh_ms;
    uint64_t entries = 0, bytes = 0;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      auto forks = dsec::Fork(*source, static_cast<uint32_t>(n));
      if (!forks.ok()) return Fail("fork " + std::to_string(n), forks.status());
      if (!FirstExecs(*forks)) return Fail("a fork's first exec", dsec::Status::Internal("failed"));
      fork_ms.push_back(Ms(t0, Clock::now()));
      auto all = dsec::ListSnapshots(c);
      if (all.ok() && !all->empty()) {
        entries = (*all)[0].entries();
        bytes = (*all)[0].size_bytes();
      }
      DestroyAll(*forks);
      // The baseline: n fresh containers of the image, created at once.
      t0 = Clock::now();
      std::vector<std::future<dsec::Result<dsec::Sandbox>>> making;
      for (int i = 0; i < n; ++i)
        making.push_back(std::async(std::launch::async, [&c, &spec] { return c.Create(spec); }));
      std::vector<dsec::Sandbox> fresh;
      for (auto& m : making) {
        auto sb = m.get();
        if (!sb.ok()) return Fail("fresh container", sb.status());
        fresh.push_back(*sb);
      }
      if (!FirstExecs(fresh)) return Fail("a fresh container's first exec", dsec::Status::Internal("failed"));
      fresh_ms.push_back(Ms(t0, Clock::now()));
      DestroyAll(fresh);
    }
    Pct f = Percentiles(fork_ms), b = Percentiles(fresh_ms);
    std::printf("fork of %3d to all ready: median %.0f ms (%.1f ms each)   %d fresh containers: median %.0f ms   "
                "ratio %.2fx   (snapshot: %llu entries, %llu bytes)\n",
                n, f.p50, f.p50 / n, n, b.p50, f.p50 / b.p50, static_cast<unsigned long long>(entries),
                static_cast<unsigned long long>(bytes));
  }
  (void)source->Destroy();
  return 0;
}
