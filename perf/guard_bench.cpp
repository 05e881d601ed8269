// The reward guard's costs (issue 29), with its own dsecd, on an image whose
// task repository has 10 000 files, of which the agent changes 100:
//
//   build/bin/guard_bench --grades 50 --steps 200
//
// Prints, each from this one run:
//   - Grade(): from the call to its answer, with a grader of `true` (a fresh
//     sandbox carrying the 100 changed files, its first exec, the step
//     logged), p50/p99, next to a plain container created and its first exec
//     (`true`) on the same image;
//   - the per-step cost of the protected-path check: a session step (`true`)
//     on a guarded agent sandbox holding 100 changes against the same step on
//     an unguarded one with the same changes, p50/p99 (with --vm-kind, in a
//     guest of that kind too);
//   - the read detector's cost to a file-heavy step: `git status` over the
//     10 000 files (committed, with 100 more changed on a later branch the
//     image's git-watch marks: 103 watched objects) in a sandbox of the
//     image built with git-watch against one of the same tree built with
//     --no-git-watch, steps interleaved, p50/p99;
//   - the write detector's cost to a write-heavy step in a guarded task's
//     container: 1 000 files written by shell redirections (each an open for
//     writing through the container's seccomp listener) against the same
//     step on a second dsecd started with --no-write-watch, steps
//     interleaved, p50/p99.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "dsec/client.hpp"
#include "dsec/report.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "perf/bench_daemon.hpp"
#include "perf/bench_util.hpp"

namespace {

using namespace dsec::bench;  // NOLINT: the benchmark helpers

constexpr const char* kChange100 = "cd /work/repo && for d in 0 1 2 3 4 5 6 7 8 9; do for f in 0 1 2 3 4 5 6 7 8 9; "
                                   "do echo changed >> d$d/f$f.py; done; done";

dsec::v1::SandboxSpec Spec(bool guarded, const std::string& image = "guard-bench") {
  auto spec = dsec::ContainerSpec(image);
  if (guarded) {
    auto* task = spec.mutable_task();
    task->set_root("/work/repo");
    for (const char* p : {"tests/**", "**/conftest.py", "pytest.ini"}) task->add_protected_paths(p);
  }
  return spec;
}

int Fail(const std::string& what, const dsec::Status& s) {
  std::fprintf(stderr, "guard_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the reward guard's costs: Grade() latency and the per-step check (starts its own dsecd)"};
  int grades = 50, steps = 200;
  app.add_option("--grades", grades, "grades timed (each a fresh grade sandbox)")->capture_default_str();
  app.add_option("--steps", steps, "session steps timed per variant")->capture_default_str();
  std::string vm_kind;
  app.add_option("--vm-kind", vm_kind, "also time the per-step check in this kind's guest (microvm or vm), a tenth "
                                       "of --steps (at least 10)");
  CLI11_PARSE(app, argc, argv);

  auto daemon = StartBenchDaemon();
  if (!daemon.ok()) return Fail("dsecd", daemon.status());
  auto& d = **daemon;
  auto scratch = ScratchRootfs("dsec-guard-bench", {"sh", "true", "cat", "echo", "git"});
  if (!scratch.ok()) return Fail("rootfs", scratch.status());
  const std::string rootfs = *scratch;
  auto repo = dsec::testing::RunProcess(
      {"/bin/sh", "-c",
       "cd " + rootfs + " && mkdir -p work/repo/tests && cd work/repo && for d in $(seq 0 99); do mkdir d$d; "
       "for f in $(seq 0 99); do echo \"x = $d$f\" > d$d/f$f.py; done; done && echo 'def test(): pass' > "
       "tests/test_x.py && mkdir -p ../../etc && printf '[safe]\\n\\tdirectory = *\\n' > ../../etc/gitconfig && "
       "export GIT_CONFIG_GLOBAL=/dev/null && git init -q -b main . && git config gc.auto 0 && git add -A && "
       "git -c user.name=b -c user.email=b@b commit -qm repo && git checkout -qb later && "
       "for f in $(seq 0 99); do echo later >> d7/f$f.py; done && "
       "git -c user.name=b -c user.email=b@b commit -qam later && git checkout -q main && chmod -R a+rwX " +
           rootfs + "/work"});
  auto image = [&](const std::string& name, bool watch) {
    std::vector<std::string> argv{dsec::testing::BinDir() + "/dsec-image", "--data-dir", d.data_dir(), "build"};
    if (!watch) argv.push_back("--no-git-watch");
    argv.push_back(rootfs);
    argv.push_back(name);
    return dsec::testing::RunProcess(argv);
  };
  auto built = image("guard-bench", false), watched = image("guard-bench-watched", true);
  // The write detector's baseline: a second dsecd without it, same image.
  auto unwatched_daemon = StartBenchDaemon({"--no-write-watch"});
  if (!unwatched_daemon.ok()) return Fail("dsecd --no-write-watch", unwatched_daemon.status());
  auto& nd = **unwatched_daemon;
  auto built_nd = dsec::testing::RunProcess(
      {dsec::testing::BinDir() + "/dsec-image", "--data-dir", nd.data_dir(), "build", rootfs, "guard-bench"});
  dsec::testing::RunProcess({"/bin/rm", "-rf", rootfs});
  if (built_nd.exit_code != 0) {
    std::fprintf(stderr, "guard_bench: image for the second dsecd: %s\n", built_nd.err.c_str());
    return 1;
  }
  if (repo.exit_code != 0 || built.exit_code != 0 || watched.exit_code != 0) {
    std::fprintf(stderr, "guard_bench: image: %s %s %s\n", repo.err.c_str(), built.err.c_str(), watched.err.c_str());
    return 1;
  }
  dsec::ClientOptions co;
  co.address = d.sdk_addr();
  co.data_dir = d.data_dir();
  auto client = dsec::Client::Connect(co);
  if (!client.ok()) return Fail("connect", client.status());
  auto& c = **client;
  auto truth = dsec::Command({"/bin/true"});
  std::printf("# guard_bench: dsecd pid %d; image: 10 000 files under /work/repo, 100 of them changed\n", d.pid());

  // Grade() against a plain container's creation and first exec.
  {
    dsec::SessionOptions o;
    o.grade.add_command("/bin/true");
    auto s = c.OpenSession("bench/grade/0", Spec(true), o);
    if (!s.ok()) return Fail("open", s.status());
    auto changed = s->Step(0, dsec::Command({"/bin/sh", "-c", kChange100}));
    if (!changed.ok()) return Fail("change", changed.status());
    std::vector<double> grade_ms, plain_ms;
    for (int i = 0; i < grades; ++i) {
      auto t0 = Clock::now();
      auto g = dsec::Grade(*s, 1 + i);
      auto t1 = Clock::now();
      if (!g.ok()) return Fail("grade", g.status());
      grade_ms.push_back(Ms(t0, t1));
      auto sb = c.Create(Spec(false));
      if (!sb.ok()) return Fail("create", sb.status());
      auto e = sb->Exec(truth);
      plain_ms.push_back(Ms(t1, Clock::now()));
      if (!e.ok()) return Fail("exec", e.status());
      (void)sb->Destroy();
    }
    Pct gp = Percentiles(grade_ms), pp = Percentiles(plain_ms);
    std::printf("Grade() (grader `true`, 100 changed files carried): p50 %.1f ms, p99 %.1f ms  "
                "(a container created + its first exec: p50 %.1f ms, p99 %.1f ms; ratio p50 %.2f)\n",
                gp.p50, gp.p99, pp.p50, pp.p99, pp.p50 > 0 ? gp.p50 / pp.p50 : 0);
    (void)s->Close();
  }

  // The per-step check: guarded against unguarded, both holding 100
  // changes; in a container, and with --vm-kind in that kind's guest too
  // (its agent reads the guest's writable layer).
  std::vector<std::string> kinds{"container"};
  if (!vm_kind.empty()) kinds.push_back(vm_kind);
  for (const auto& kind : kinds) {
    Pct p[2];
    int n = kind == "container" ? steps : std::max(10, steps / 10);
    for (int guarded = 0; guarded < 2; ++guarded) {
      auto spec = Spec(guarded);
      if (kind != "container") spec.set_kind(kind == "vm" ? dsec::v1::KIND_VM : dsec::v1::KIND_MICROVM);
      auto s = c.OpenSession("bench/step/" + kind + "/" + std::to_string(guarded), spec);
      if (!s.ok()) return Fail("open", s.status());
      if (auto r = s->Step(0, dsec::Command({"/bin/sh", "-c", kChange100})); !r.ok()) return Fail("change", r.status());
      std::vector<double> ms;
      for (int k = 1; k <= n; ++k) {
        auto t0 = Clock::now();
        auto r = s->Step(k, truth);
        if (!r.ok()) return Fail("step", r.status());
        ms.push_back(Ms(t0, Clock::now()));
      }
      p[guarded] = Percentiles(ms);
      (void)s->Close();
    }
    std::printf("%s session step (`true`, 100 changes in the upper dir): guarded p50 %.2f ms, p99 %.2f ms; "
                "unguarded p50 %.2f ms, p99 %.2f ms; the check adds %.2f ms at p50\n",
                kind.c_str(), p[1].p50, p[1].p99, p[0].p50, p[0].p99, p[1].p50 - p[0].p50);
  }

  // The read detector: `git status` on 10 000 files, watched against not.
  {
    std::vector<dsec::Session> sessions;
    for (const char* image : {"guard-bench", "guard-bench-watched"}) {
      auto s = c.OpenSession(std::string("bench/read/") + image, Spec(false, image));
      if (!s.ok()) return Fail("open", s.status());
      sessions.push_back(std::move(*s));
    }
    auto status = dsec::Command({"/bin/sh", "-c", "cd /work/repo && git status --short | wc -l"});
    std::vector<double> ms[2];
    for (int k = 0; k <= steps / 4; ++k)
      for (int w = 0; w < 2; ++w) {
        auto t0 = Clock::now();
        auto r = sessions[w].Step(k, status);
        if (!r.ok()) return Fail("git status", r.status());
        if (k > 0) ms[w].push_back(Ms(t0, Clock::now()));  // the first refreshes the index
      }
    Pct off = Percentiles(ms[0]), on = Percentiles(ms[1]);
    std::printf("session step `git status` on 10 000 files: read detector on (git-watch marks) p50 %.1f ms, p99 %.1f "
                "ms; off (--no-git-watch) p50 %.1f ms, p99 %.1f ms; ratio p50 %.3f\n",
                on.p50, on.p99, off.p50, off.p99, off.p50 > 0 ? on.p50 / off.p50 : 0);
    for (auto& s : sessions) (void)s.Close();
  }

  // The write detector: 1 000 writes by redirection, watched against not.
  {
    dsec::ClientOptions nco;
    nco.address = nd.sdk_addr();
    nco.data_dir = nd.data_dir();
    auto nclient = dsec::Client::Connect(nco);
    if (!nclient.ok()) return Fail("connect to the second dsecd", nclient.status());
    std::vector<dsec::Session> sessions;
    for (dsec::Client* cl : {&**nclient, &c}) {
      auto s = cl->OpenSession("bench/write/0", Spec(true));  // a guarded task's container: watched
      if (!s.ok()) return Fail("open", s.status());
      sessions.push_back(std::move(*s));
    }
    auto writes = dsec::Command(
        {"/bin/sh", "-c", "cd /tmp && i=0; while [ $i -lt 1000 ]; do echo x > f$i; i=$((i+1)); done"});
    std::vector<double> ms[2];
    for (int k = 0; k <= steps / 10; ++k)
      for (int w = 0; w < 2; ++w) {
        auto t0 = Clock::now();
        auto r = sessions[w].Step(k, writes);
        if (!r.ok()) return Fail("writes", r.status());
        if (k > 0) ms[w].push_back(Ms(t0, Clock::now()));
      }
    // The watched side did watch: a write to a protected file is flagged.
    auto probe = sessions[1].Step(steps / 10 + 1, dsec::Command({"/bin/sh", "-c", "echo x > /work/repo/tests/test_x.py"}));
    if (!probe.ok() || probe->step().flags_size() != 1 || probe->step().flags(0).what() != "write_refused") {
      std::fprintf(stderr, "guard_bench: the write detector flagged nothing on the watched side\n");
      return 1;
    }
    Pct off = Percentiles(ms[0]), on = Percentiles(ms[1]);
    std::printf("session step of 1 000 writes (shell redirections): write detector on p50 %.1f ms, p99 %.1f ms; off "
                "(dsecd --no-write-watch) p50 %.1f ms, p99 %.1f ms; ratio p50 %.2f (%.1f us per watched open)\n",
                on.p50, on.p99, off.p50, off.p99, off.p50 > 0 ? on.p50 / off.p50 : 0, (on.p50 - off.p50));
    for (auto& s : sessions) (void)s.Close();
  }
  return 0;
}
