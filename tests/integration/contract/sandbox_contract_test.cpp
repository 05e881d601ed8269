// The sandbox contract: one suite, run against every sandbox kind through a
// real dsecd and the SDK. An operation a kind supports must behave the same
// everywhere (create, exec, files, limits, streaming, pause/resume, destroy,
// re-adoption after kill -9); one it does not support must say so, naming
// the kind, and change nothing.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsec/files.hpp"
#include "dsec/processes.hpp"
#include "dsec/watch.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/daemon_fixture.hpp"
#include "tests/support/host_probes.hpp"
#include "tests/support/kind_sandbox_fixture.hpp"
#include "tests/support/kinds.hpp"
#include "tests/support/probes.hpp"
#include "tests/support/vm_probes.hpp"

namespace dsec::testing {
namespace {

class Contract : public ContainerTest, public ::testing::WithParamInterface<KindParam> {
 protected:
  // The shared daemon offers the fake kind too (tests only).
  static void SetUpTestSuite() {
    TestDaemonOptions o;
    o.extra_args = {"--fake-kind"};
    start_ = TryStartContainerDaemon(o, &daemon_, &client_);
  }
  // The suite's shared sandboxes (Reusable) go before its daemon does.
  static void TearDownTestSuite() {
    SharedSandboxes::Release();
    ContainerTest::TearDownTestSuite();
  }
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (auto gap = KindHostGap(GetParam()); !gap.empty()) GTEST_SKIP() << gap;
  }
  // Host-image kinds run on the host's files; the others on the tools image.
  static v1::SandboxSpec Spec() {
    v1::SandboxSpec spec = GetParam().traits.host_image ? FncallSpec() : ContainerSpec(kImage);
    spec.set_kind(GetParam().kind);
    return spec;
  }
  Result<Sandbox> New() {
    auto sb = client_->Create(Spec());
    if (sb.ok()) made_.push_back(*sb);
    return sb;
  }
  // For a test that leaves its sandbox as good a subject as it found it (no
  // process left running, no file another such test looks at): on a kind
  // whose creation is a boot, the one guest such tests share (destroyed,
  // and checked to go, when the suite ends); a new one on the others.
  Result<Sandbox> Reusable() {
    if (!OwnKernel()) return New();
    return SharedSandboxes::Get(GetParam().name, 0, [] { return client_->Create(Spec()); });
  }
  // The end of such a test: a new sandbox is destroyed, leaving nothing.
  void Finish(const Sandbox& sb) {
    if (!OwnKernel()) Destroy(sb);
  }
  // Its sandboxes run their own kernel: their processes and files are not
  // the host's to see (checks go through the guest, or QEMU's monitor).
  static bool OwnKernel() { return GetParam().traits.isolation >= v1::ISOLATION_KERNEL; }
  // The fake kind's sandboxes live in dsecd: what runs in them and whether
  // they are paused is what its driver says (the console's inspect).
  static bool Simulated() { return GetParam().traits.test_only; }
  nlohmann::json DriverState(const std::string& id) {
    auto j = daemon_->Admin("inspect " + id);
    return j.value("ok", false) ? j["sandbox"]["driver_state"] : nlohmann::json();
  }
  // How the host keeps the sandbox stopped: the cgroup freezer's state
  // (FROZEN, THAWED) of a container; QEMU's run state (paused, running) of a
  // VM, from its monitor or libvirt.
  std::string HostPauseState(const std::string& id) {
    if (Simulated()) return DriverState(id).value("paused", false) ? "FROZEN" : "THAWED";
    if (!OwnKernel()) return FreezerState(id);
    std::string st = VmRunState(*daemon_, GetParam().kind, id);
    return st == "paused" ? "FROZEN" : st == "running" ? "THAWED" : st;
  }
  // Processes in the sandbox whose command line holds `arg`: seen from the
  // host, or for a VM, from inside (a command of its own).
  size_t SandboxProcessesWithArg(const Sandbox& sb, const std::string& arg) {
    if (Simulated()) {
      size_t n = 0;
      for (const auto& run : DriverState(sb.id()).value("running", nlohmann::json::array()))
        n += run.is_string() && run.get<std::string>().find(arg) != std::string::npos;
      return n;
    }
    if (!OwnKernel()) return HostProcessesWithArg(arg).size();
    auto r = ShIn(sb, "n=0; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null | grep -q -- '" + arg +
                          " *$' && n=$((n+1)); done; echo $n");
    return static_cast<size_t>(std::atoi(r.stdout().c_str()));
  }
  // The answer to an operation this kind does not have.
  static void ExpectUnsupported(const Status& st, const char* op) {
    EXPECT_EQ(st.code(), Status::Code::kUnimplemented) << op << ": " << st.ToString();
    EXPECT_NE(st.message().find(GetParam().name), std::string::npos) << op << " should name the kind: " << st.message();
  }
};

TEST_P(Contract, CreateGivesARunningSandboxAndDestroyRemovesIt) {
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(sb->id().rfind("sb-", 0), 0u) << sb->id();
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_EQ(rec->id(), sb->id());
  // A VM's record says what runs its guest; the other kinds have none.
  if (OwnKernel()) EXPECT_TRUE(rec->accelerator() == "kvm" || rec->accelerator() == "tcg") << rec->accelerator();
  else EXPECT_EQ(rec->accelerator(), "");
  Destroy(*sb);
  auto gone = sb->Get();
  EXPECT_EQ(gone.status().code(), Status::Code::kNotFound) << gone.status().ToString();
  auto exec = sb->Exec(Command({"true"}));
  EXPECT_EQ(exec.status().code(), Status::Code::kNotFound) << exec.status().ToString();
  EXPECT_NE(exec.status().message().find(sb->id()), std::string::npos) << exec.status().message();
}

TEST_P(Contract, ExecReportsOutputExitCodeAndStdin) {
  auto sb = Reusable();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto r = ShIn(*sb, "echo out; echo err >&2; exit 3");
  EXPECT_EQ(r.stdout(), "out\n");
  EXPECT_EQ(r.stderr(), "err\n");
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.verdict(), v1::VERDICT_RUNTIME_ERROR);
  auto req = Command({"cat"});
  req.set_stdin("from stdin");
  auto cat = Exec(*sb, req);
  EXPECT_EQ(cat.verdict(), v1::VERDICT_OK);
  EXPECT_EQ(cat.stdout(), "from stdin");
  auto env = Command({"sh", "-c", "echo $GREETING; pwd"});
  (*env.mutable_env())["GREETING"] = "hi";
  env.set_cwd("/tmp");
  EXPECT_EQ(Exec(*sb, env).stdout(), "hi\n/tmp\n");
  auto missing = Exec(*sb, Command({"no-such-program"}));
  EXPECT_EQ(missing.exit_code(), 127);
  Finish(*sb);
}

TEST_P(Contract, StateOutlivesAnExecOnlyInStatefulKinds) {
  auto sb = Reusable();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "echo kept > /work/state").verdict(), v1::VERDICT_OK);
  auto r = ShIn(*sb, "cat /work/state 2>/dev/null || echo fresh");
  EXPECT_EQ(r.stdout(), GetParam().traits.stateful ? "kept\n" : "fresh\n");
  Finish(*sb);
}

// What a sandbox uses: its CPU time grows with a busy loop, whose share
// the next reading says (since the last reading); its memory against its
// limit; a container's disk with what it writes. Kinds without a sandbox
// that lives between calls say they cannot tell.
TEST_P(Contract, UsageSaysWhatTheSandboxUses) {
  auto sb = Reusable();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  if (!GetParam().traits.stateful || Simulated()) {
    ExpectUnsupported(MeasureUsage(*sb).status(), "usage");
    return Finish(*sb);
  }
  auto before = MeasureUsage(*sb);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_GE(before->cpu_count(), 1u);
  EXPECT_GT(before->mem_used_bytes(), 0u);
  EXPECT_GT(before->mem_total_bytes(), before->mem_used_bytes());
  if (uint64_t limit = Spec().limits().memory_bytes()) {
    EXPECT_LE(before->mem_total_bytes(), limit);
    EXPECT_GE(before->mem_total_bytes(), limit / 2) << "a VM guest's MemTotal is a little under its memory";
  }
  EXPECT_GE(before->cpu_used_pct(), 0.0) << "the first reading's share is over a window of its own";
  EXPECT_LE(before->cpu_used_pct(), 100.0);
  EXPECT_GT(before->at_ms(), 0);
  ASSERT_EQ(ShIn(*sb, "dd if=/dev/zero of=/work/usage.bin bs=1M count=8 2>/dev/null; "
                      "timeout 1 sh -c 'while :; do :; done'; true").verdict(),
            v1::VERDICT_OK);
  auto after = MeasureUsage(*sb);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_GE(after->cpu_ns() - before->cpu_ns(), 300'000'000u) << "a second's busy loop took a third of a second at least";
  EXPECT_GT(after->cpu_used_pct(), 100.0 / 3 / after->cpu_count() / 4) << "the share since the last reading";
  EXPECT_LE(after->cpu_used_pct(), 100.0);
  if (!OwnKernel()) {
    // What it wrote is in its page cache (its disk's count: container_disk_test).
    EXPECT_GE(after->mem_cache_bytes(), before->mem_cache_bytes() + (8u << 20)) << "the file it wrote";
    auto rec = sb->Get();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(after->disk_total_bytes(), rec->spec().limits().disk_bytes());
  }
  ShIn(*sb, "rm -f /work/usage.bin");
  ASSERT_TRUE(sb->Pause().ok());
  EXPECT_EQ(MeasureUsage(*sb).status().code(), Status::Code::kFailedPrecondition) << "a paused sandbox runs nothing";
  ASSERT_TRUE(sb->Resume().ok());
  Finish(*sb);
}

TEST_P(Contract, LimitsGiveVerdictsAndTheSandboxLivesOn) {
  auto sb = Reusable();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  v1::Limits t;
  t.set_timeout_ms(500);
  auto slow = ShIn(*sb, "sleep 30", t);
  EXPECT_EQ(slow.verdict(), v1::VERDICT_TIME_LIMIT) << slow.error();
  // Zeros without a newline: tail keeps them all, until its memory limit
  // (it takes the shell's place, so the exec itself is what the limit kills).
  auto hog = Sh("exec tail < /dev/zero");
  if (GetParam().traits.stateful) {
    // One cgroup holds the sandbox: its memory limit is set at creation, and
    // an exec asking for another is refused, not silently ignored.
    auto req = hog;
    req.mutable_limits()->set_memory_bytes(64ull << 20);
    auto refused = sb->Exec(req);
    EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("create"), std::string::npos) << refused.status().message();
  }
  auto spec = Spec();
  spec.mutable_limits()->set_memory_bytes(64ull << 20);
  auto small = client_->Create(spec);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  made_.push_back(*small);
  auto capped = Exec(*small, hog);
  EXPECT_EQ(capped.verdict(), v1::VERDICT_MEMORY_LIMIT) << capped.error() << capped.stderr();
  EXPECT_EQ(ShIn(*small, "echo survived").stdout(), "survived\n");
  Destroy(*small);
  v1::Limits o;
  o.set_output_bytes(1000);
  auto loud = ShIn(*sb, "head -c 100000 /dev/zero", o);
  EXPECT_EQ(loud.verdict(), v1::VERDICT_OUTPUT_LIMIT);
  EXPECT_TRUE(loud.stdout_truncated());
  EXPECT_LE(loud.stdout().size(), 1000u);
  // None of that broke the sandbox.
  EXPECT_EQ(ShIn(*sb, "echo alive").stdout(), "alive\n");
  Finish(*sb);
}

TEST_P(Contract, StreamedOutputArrivesInOrderAndTheResultCarriesNone) {
  auto sb = Reusable();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  if (!GetParam().traits.streaming) {
    // Refused before anything runs: the command would have left its mark.
    bool ran = false;
    auto r = sb->ExecStream(Sh("echo ran"), [&](const v1::ExecOutput&) { ran = true; });
    ExpectUnsupported(r.status(), "ExecStream");
    EXPECT_NE(r.status().message().find("cannot stream"), std::string::npos) << r.status().message();
    EXPECT_FALSE(ran);
    EXPECT_EQ(ShIn(*sb, "echo alive").stdout(), "alive\n");
    Finish(*sb);
    return;
  }
  std::mutex mu;
  std::string out, err;
  auto r = sb->ExecStream(Sh("for i in 1 2 3 4 5; do echo line$i; echo e$i >&2; done"),
                          [&](const v1::ExecOutput& o) {
                            std::lock_guard<std::mutex> lk(mu);
                            out += o.stdout();
                            err += o.stderr();
                          });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verdict(), v1::VERDICT_OK);
  EXPECT_EQ(r->stdout(), "");
  EXPECT_EQ(r->stderr(), "");
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(out, "line1\nline2\nline3\nline4\nline5\n");
  EXPECT_EQ(err, "e1\ne2\ne3\ne4\ne5\n");
  // Streamed output has no cap unless the exec asks for one (past the 1 MiB
  // default a buffered exec would be cut); with one, it is cut there.
  if (Simulated()) return Finish(*sb);  // the fake kind's shell has no /dev/zero
  size_t streamed = 0;
  auto big = sb->ExecStream(Sh("head -c 3000000 /dev/zero"), [&](const v1::ExecOutput& o) { streamed += o.stdout().size(); });
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->verdict(), v1::VERDICT_OK) << big->error();
  EXPECT_EQ(streamed, 3000000u);
  auto capped = Sh("head -c 3000000 /dev/zero");
  capped.mutable_limits()->set_output_bytes(100000);
  streamed = 0;
  big = sb->ExecStream(capped, [&](const v1::ExecOutput& o) { streamed += o.stdout().size(); });
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->verdict(), v1::VERDICT_OUTPUT_LIMIT);
  EXPECT_EQ(streamed, 100000u);
  Finish(*sb);
}

TEST_P(Contract, StreamedOutputArrivesWhileTheCommandRuns) {
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  if (!GetParam().traits.streaming) {
    ExpectUnsupported(sb->ExecStream(Sh("echo started"), [](const v1::ExecOutput&) {}).status(), "ExecStream");
    Destroy(*sb);
    return;
  }
  // The command prints, then waits for a file only the test creates, and
  // the test creates it only once it has seen the first line: the exec can
  // end only if its output was streamed.
  std::promise<void> first;
  std::once_flag once;
  std::mutex mu;
  std::string out;
  auto done = std::async(std::launch::async, [&] {
    return sb->ExecStream(Sh("echo started; while [ ! -e /work/go ]; do sleep 0.01; done; echo finished"),
                          [&](const v1::ExecOutput& o) {
                            std::lock_guard<std::mutex> lk(mu);
                            out += o.stdout();
                            if (out.find("started\n") != std::string::npos) std::call_once(once, [&] { first.set_value(); });
                          });
  });
  ASSERT_EQ(first.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "no output streamed while the command ran";
  ASSERT_EQ(ShIn(*sb, "touch /work/go").verdict(), v1::VERDICT_OK);
  auto r = done.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verdict(), v1::VERDICT_OK);
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(out, "started\nfinished\n");
  Destroy(*sb);
}

TEST_P(Contract, FilesRoundTripThroughExec) {
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  if (!GetParam().traits.files) {
    ExpectUnsupported(sb->WriteFile("/work/a.txt", "x"), "WriteFile");
    ExpectUnsupported(sb->ReadFile("/work/a.txt").status(), "ReadFile");
    ExpectUnsupported(sb->ListFiles("/work").status(), "ListFiles");
    Destroy(*sb);
    return;
  }
  std::string binary(300000, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(sb->WriteFile("/work/blob", binary, 0640).ok());
  ASSERT_TRUE(sb->WriteFile("/work/deep/er/note.txt", "hello\n", 0644, /*make_parents=*/true).ok());
  EXPECT_EQ(ShIn(*sb, "stat -c '%a %s' /work/blob; cat /work/deep/er/note.txt").stdout(), "640 300000\nhello\n");
  ASSERT_EQ(ShIn(*sb, "echo made by exec > /work/out.txt").verdict(), v1::VERDICT_OK);
  auto back = sb->ReadFile("/work/out.txt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, "made by exec\n");
  auto blob = sb->ReadFile("/work/blob");
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  EXPECT_TRUE(*blob == binary) << "binary content changed on the way";
  auto list = sb->ListFiles("/work");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  std::vector<std::string> names;
  for (const auto& e : list->entries()) names.push_back(e.name());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"blob", "deep", "out.txt"}));
  // Errors name the path and change nothing.
  auto missing = sb->ReadFile("/work/none");
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("/work/none"), std::string::npos) << missing.status().message();
  auto relative = sb->WriteFile("work/x", "x");
  EXPECT_EQ(relative.code(), Status::Code::kInvalidArgument) << relative.ToString();
  auto too_big = sb->ReadFile("/work/blob", 1000);
  EXPECT_FALSE(too_big.ok());
  EXPECT_EQ(ShIn(*sb, "ls /work | tr '\\n' ' '").stdout(), "blob deep out.txt ");
  Destroy(*sb);
}

// Users and the tree's changes (ExecRequest.user, PathOpRequest), which
// E2B's door and dsecctl fs stand on: a uid the image's passwd lacks is run
// as itself (home "/"), a name it lacks is refused, naming it; a directory
// made for a user is theirs; move and remove do what they say; a watched
// directory's changes are reported as they happen.
TEST_P(Contract, ExecAsAUserAndPathOperations) {
  if (!GetParam().traits.files) return;
  if (GetParam().name == "fake") GTEST_SKIP() << "the fake kind does not model users or path operations";
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto req = Command({"sh", "-c", "id -u; id -g; echo $HOME; pwd"});
  req.set_user("1234");
  auto r = sb->Exec(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout(), "1234\n1234\n/\n/\n") << r->stderr();
  req.set_user("nosuchuser");
  auto refused = sb->Exec(req);
  EXPECT_FALSE(refused.ok() && refused->verdict() == v1::VERDICT_OK);
  std::string why = refused.ok() ? refused->error() : refused.status().message();
  EXPECT_NE(why.find("no user 'nosuchuser'"), std::string::npos) << why;
  auto made = MakeDir(*sb, "/work/pd/a/b", "1234");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(made->name(), "b");
  EXPECT_EQ(made->uid(), 1234u);
  EXPECT_EQ(MakeDir(*sb, "/work/pd/a/b").status().code(), Status::Code::kAlreadyExists);
  ASSERT_TRUE(sb->WriteFile("/work/pd/a/b/f", "x").ok());
  auto moved = Move(*sb, "/work/pd/a", "/work/pd/z");
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_TRUE(S_ISDIR(moved->mode()));
  EXPECT_EQ(ShIn(*sb, "stat -c '%u %n' /work/pd/z/b; cat /work/pd/z/b/f").stdout(), "1234 /work/pd/z/b\nx");
  ASSERT_TRUE(Remove(*sb, "/work/pd/z").ok());
  EXPECT_EQ(ShIn(*sb, "ls -A /work/pd | wc -l").stdout(), "0\n");
  EXPECT_EQ(Remove(*sb, "/work/pd/none").code(), Status::Code::kNotFound);
  EXPECT_EQ(Move(*sb, "/work/pd", "../x").status().code(), Status::Code::kInvalidArgument);
  // Watches: a directory's changes as they happen, named relative to it;
  // a recursive one sees into directories made after it began.
  ASSERT_TRUE(MakeDir(*sb, "/work/w").ok());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> deep_seen, flat_seen;
  auto into = [&](std::vector<std::string>* seen) {
    return [&mu, &cv, seen](const v1::FsEvent& e) {
      static const char* kTypes[] = {"?", "create", "write", "remove", "rename", "chmod"};
      std::lock_guard<std::mutex> lk(mu);
      seen->push_back(std::string(kTypes[e.type() >= 0 && e.type() <= 5 ? e.type() : 0]) + " " + e.name());
      cv.notify_all();
    };
  };
  auto seen_has = [&](const std::vector<std::string>& seen, const std::string& what) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(30),
                       [&] { return std::find(seen.begin(), seen.end(), what) != seen.end(); });
  };
  WatchOptions recursive;
  recursive.recursive = true;
  auto deep = WatchDir(*sb, "/work/w", into(&deep_seen), recursive);
  ASSERT_TRUE(deep.ok()) << deep.status().ToString();
  auto flat = WatchDir(*sb, "/work/w", into(&flat_seen));
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  ShIn(*sb, "mkdir /work/w/sub");
  ASSERT_TRUE(seen_has(deep_seen, "create sub"));  // its watch is added as its create is read
  ShIn(*sb, "cd /work/w && echo hi > a && chmod 600 a && echo x > sub/b && mv a c && rm c && mkdir done");
  ASSERT_TRUE(seen_has(deep_seen, "create done"));
  ASSERT_TRUE(seen_has(flat_seen, "create done"));
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(deep_seen, (std::vector<std::string>{"create sub", "create a", "write a", "chmod a", "create sub/b",
                                                    "write sub/b", "rename a", "create c", "remove c",
                                                    "create done"}));
    EXPECT_EQ(flat_seen, (std::vector<std::string>{"create sub", "create a", "write a", "chmod a", "rename a",
                                                    "create c", "remove c", "create done"}));
  }
  // A directory renamed within the tree is watched under its new name; one
  // moved out is not watched any more.
  ShIn(*sb, "mv /work/w/sub /work/w/sub2 && : > /work/w/sub2/x && mv /work/w/sub2 /work/moved && "
            ": > /work/moved/y && mkdir /work/w/end");
  ASSERT_TRUE(seen_has(deep_seen, "create end"));
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(std::vector<std::string>(deep_seen.begin() + 10, deep_seen.end()),
              (std::vector<std::string>{"rename sub", "create sub2", "create sub2/x", "rename sub2", "create end"}));
  }
  // What a new directory holds before its watch is added is told too, once;
  // one made and renamed at once (mkdir tmp && mv tmp final) is watched; one
  // moved in is told with what it holds.
  ShIn(*sb, "cd /work/w && mkdir -p n/o/p && : > n/o/p/f && python3 -c \"import os; os.mkdir('t'); "
            "os.rename('t', 'u'); open('u/z', 'w')\" && mkdir -p /work/i/j && mv /work/i w2 && mkdir end2");
  ASSERT_TRUE(seen_has(deep_seen, "create end2"));
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(std::vector<std::string>(deep_seen.begin() + 15, deep_seen.end()),
              (std::vector<std::string>{"create n", "create n/o", "create n/o/p", "create n/o/p/f", "create t",
                                        "rename t", "create u", "create u/z", "create w2", "create w2/j",
                                        "create end2"}));
  }
  auto stopped = (*deep)->Stop();
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  EXPECT_EQ(*stopped, 26u);
  EXPECT_EQ((*deep)->Stop().status().code(), Status::Code::kOk) << "stopped again: how it ended";
  ShIn(*sb, "touch /work/w/later");
  ASSERT_TRUE(seen_has(flat_seen, "create later"));
  EXPECT_EQ(deep_seen.size(), 26u) << "a stopped watch reports nothing more";
  EXPECT_EQ(WatchDir(*sb, "/work/none", nullptr).status().code(), Status::Code::kNotFound);
  ASSERT_TRUE(Remove(*sb, "/work/w").ok());
  auto gone = (*flat)->Wait();  // its directory removed: it ends, saying so
  EXPECT_EQ(gone.status().code(), Status::Code::kNotFound) << gone.status().ToString();
  Destroy(*sb);
}

// Execs by pid (ProcessRequest), which E2B's commands and dsecctl stand
// on: an interactive exec names its pid first, is listed, takes input in
// order until its stdin is closed; it outlives the client that started it
// and is attached to by pid (its output from then on, its end; an
// attachment's timeout leaves it running); a signal by pid reaches it; a
// gone pid is NotFound.
TEST_P(Contract, InteractiveExecsAreReachedByTheirPid) {
  if (!GetParam().traits.files) return;
  if (GetParam().name == "fake") GTEST_SKIP() << "the fake kind does not model processes by pid";
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto run = [&](v1::ExecRequest req, std::string* out) {
    req.set_interactive(true);
    auto pid = std::make_shared<std::promise<uint32_t>>();
    auto done = std::async(std::launch::async, [&sb, req, pid, out] {
      return sb->ExecStream(req, [pid, out](const v1::ExecOutput& o) {
        if (o.pid()) pid->set_value(o.pid());
        *out += o.stdout() + o.pty();  // pieces come one at a time, in order
      });
    });
    auto f = pid->get_future();
    bool named = f.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    EXPECT_TRUE(named) << "no piece named the pid";
    return std::make_pair(named ? f.get() : 0u, std::move(done));
  };
  std::string out;
  auto [pid, done] = run(Command({"sh", "-c", "while read l; do echo got $l; done; echo eof"}), &out);
  ASSERT_GT(pid, 0u);
  auto listed = ListProcesses(*sb);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  bool found = false;
  for (const auto& p : *listed)
    if (p.pid() == pid) found = p.argv(0) == "sh" && p.stdin_open();
  EXPECT_TRUE(found) << "the running exec is listed, its stdin open";
  ASSERT_TRUE(SendInput(*sb, pid, "a\n").ok());
  ASSERT_TRUE(SendInput(*sb, pid, "b\n").ok());
  ASSERT_TRUE(CloseStdin(*sb, pid).ok());
  auto r = done.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(out, "got a\ngot b\neof\n");
  EXPECT_EQ(SendInput(*sb, pid, "x").code(), Status::Code::kNotFound);
  // It outlives its caller: started by a client that then goes away, it
  // runs on, and another attaches to its output from then on (and its end).
  uint32_t orphan = 0;
  {
    std::unique_ptr<Client> other;
    ASSERT_EQ(ConnectClient(*daemon_, &other), "");
    auto theirs = other->Attach(sb->id());
    ASSERT_TRUE(theirs.ok()) << theirs.status().ToString();
    auto started = std::make_shared<std::promise<uint32_t>>();
    auto echoed = std::make_shared<std::promise<void>>();
    auto req = Command({"sh", "-c", "while read l; do echo again $l; done; exit 7"});
    req.set_interactive(true);
    theirs->ExecStreamAsync(
        req,
        [started, echoed](const v1::ExecOutput& o) {
          if (o.pid()) started->set_value(o.pid());
          if (o.stdout() == "again before\n") echoed->set_value();
        },
        [](Result<v1::ExecResult>) {});
    auto f = started->get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    orphan = f.get();
    ASSERT_TRUE(SendInput(*sb, orphan, "before\n").ok());
    ASSERT_EQ(echoed->get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
    other.reset();  // its caller is gone
  }
  std::string later;
  auto attached = std::make_shared<std::promise<void>>();
  v1::ExecRequest attach;
  attach.set_attach_pid(orphan);
  auto following = std::async(std::launch::async, [&sb, attach, attached, &later] {
    return sb->ExecStream(attach, [attached, &later](const v1::ExecOutput& o) {
      if (o.pid()) attached->set_value();
      later += o.stdout();
    });
  });
  ASSERT_EQ(attached->get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_TRUE(SendInput(*sb, orphan, "after\n").ok());
  ASSERT_TRUE(CloseStdin(*sb, orphan).ok());
  auto ended = following.get();
  ASSERT_TRUE(ended.ok()) << ended.status().ToString();
  EXPECT_EQ(later, "again after\n") << "the output from the attachment on, not before";
  EXPECT_EQ(ended->exit_code(), 7);
  attach.set_attach_pid(orphan);
  EXPECT_EQ(sb->ExecStream(attach, [](const v1::ExecOutput&) {}).status().code(), Status::Code::kNotFound);
  std::string slept;
  auto [sleeper, sleeping] = run(Command({"sleep", "60"}), &slept);
  ASSERT_GT(sleeper, 0u);
  // An attachment with a timeout ends at it; the process runs on.
  attach.set_attach_pid(sleeper);
  attach.mutable_limits()->set_timeout_ms(200);
  EXPECT_EQ(sb->ExecStream(attach, [](const v1::ExecOutput&) {}).status().code(), Status::Code::kDeadlineExceeded);
  ASSERT_TRUE(SignalProcess(*sb, sleeper, SIGTERM).ok());
  auto killed = sleeping.get();
  ASSERT_TRUE(killed.ok()) << killed.status().ToString();
  EXPECT_EQ(killed->signal(), SIGTERM);
  EXPECT_EQ(SignalProcess(*sb, sleeper, SIGTERM).code(), Status::Code::kNotFound);
  // A terminal: the command's stdin and stdout are one, typed into by pid.
  auto term_req = Command({"sh", "-c", "test -t 0 && test -t 1 && echo on-a-tty; read x; echo got $x"});
  term_req.mutable_pty()->set_cols(100);
  term_req.mutable_pty()->set_rows(30);
  std::string screen;
  auto [term, typing] = run(term_req, &screen);
  ASSERT_GT(term, 0u);
  ASSERT_TRUE(SendInput(*sb, term, "hi\n").ok());
  auto typed = typing.get();
  ASSERT_TRUE(typed.ok()) << typed.status().ToString();
  EXPECT_NE(screen.find("on-a-tty"), std::string::npos) << screen;
  EXPECT_NE(screen.find("got hi"), std::string::npos) << screen;
  EXPECT_NE(screen.find("\r\n"), std::string::npos) << "a terminal's line endings: " << screen;
  Destroy(*sb);
}

TEST_P(Contract, PauseFreezesEveryProcessAndResumeContinues) {
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  if (!GetParam().traits.pause) {
    ExpectUnsupported(sb->Pause(), "Pause");
    ExpectUnsupported(sb->Resume(), "Resume");
    EXPECT_EQ(ShIn(*sb, "echo still").stdout(), "still\n");
    Destroy(*sb);
    return;
  }
  // A ticker that appends a line every 10 ms; ticking before the pause.
  ASSERT_EQ(ShIn(*sb, "(while :; do echo t >> /work/ticks; sleep 0.01; done) > /dev/null 2>&1 &").verdict(),
            v1::VERDICT_OK);
  ASSERT_EQ(ShIn(*sb, "until [ \"$(wc -l < /work/ticks)\" -ge 3 ]; do sleep 0.01; done; echo ticking").stdout(),
            "ticking\n");
  Status paused = sb->Pause();
  ASSERT_TRUE(paused.ok()) << paused.ToString();
  EXPECT_EQ(HostPauseState(sb->id()), "FROZEN");
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_PAUSED);
  auto refused = sb->Exec(Command({"true"}));
  EXPECT_EQ(refused.status().code(), Status::Code::kFailedPrecondition) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("resume"), std::string::npos) << refused.status().message();
  // Frozen: the ticker's file does not grow (read from the host).
  std::string upper = daemon_->data_dir() + "/sandboxes/" + sb->id() + "/upper/work/ticks";
  auto count = [&]() -> long {
    if (Simulated()) {  // its files are in dsecd: read through the SDK
      auto data = sb->ReadFile("/work/ticks");
      return data.ok() ? std::count(data->begin(), data->end(), '\n') : -1;
    }
    std::ifstream in(upper);
    return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
  };
  if (!OwnKernel()) {
    // A VM's files are its guest's; its whole machine is stopped (above).
    auto before = count();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the time in which nothing may happen
    EXPECT_EQ(count(), before) << "a process ran while the sandbox was paused";
  }
  EXPECT_TRUE(sb->Pause().ok()) << "pausing a paused sandbox is a no-op";

  ASSERT_TRUE(sb->Resume().ok());
  EXPECT_EQ(HostPauseState(sb->id()), "THAWED");
  rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING);
  auto r = ShIn(*sb, "n=$(wc -l < /work/ticks); while [ $(wc -l < /work/ticks) -le $n ]; do sleep 0.01; done; echo ticking");
  EXPECT_EQ(r.stdout(), "ticking\n");
  EXPECT_TRUE(sb->Resume().ok()) << "resuming a running sandbox is a no-op";
  Destroy(*sb);
}

TEST_P(Contract, DestroyWithAnExecInFlightAnswersTheExec) {
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // A sleep of this test's own, so the host shows when it runs in the sandbox.
  const std::string secs = "60." + std::to_string(::getpid());
  auto pending = sb->ExecAsync(Command({"sleep", secs}));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (SandboxProcessesWithArg(*sb, secs) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling /proc, bounded
  ASSERT_EQ(SandboxProcessesWithArg(*sb, secs), 1u) << "the exec does not run in the sandbox";
  Destroy(*sb);
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "the exec was never answered";
  auto r = pending.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verdict(), v1::VERDICT_PLATFORM_ERROR) << v1::Verdict_Name(r->verdict()) << ": " << r->error();
  EXPECT_NE(r->error().find("sandbox " + sb->id() + " was destroyed"), std::string::npos) << r->error();
  EXPECT_TRUE(HostProcessesWithArg(secs).empty()) << "the exec outlived its sandbox";
  if (Simulated()) {
    EXPECT_FALSE(daemon_->Admin("inspect " + sb->id()).value("ok", true)) << "the sandbox outlived its destroy";
  }
  if (OwnKernel()) {
    EXPECT_TRUE(VmProcessesOf(*daemon_, GetParam().kind, sb->id()).empty()) << "the VM outlived its sandbox";
  }
}

// Restarts the shared daemon (gtest runs a suite in the order written: last).
TEST_P(Contract, Kill9OfTheDaemonKeepsTheSandboxAndItsState) {
  auto sb = New();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_EQ(ShIn(*sb, "echo kept > /work/state").verdict(), v1::VERDICT_OK);
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING) << rec->error();
  auto r = ShIn(*sb, "cat /work/state 2>/dev/null || echo fresh");
  EXPECT_EQ(r.stdout(), GetParam().traits.stateful ? "kept\n" : "fresh\n");
  Destroy(*sb);
}

// Every registered kind, with what it offers (its traits): the rest must be
// refused cleanly. Built twice (tests/CMakeLists.txt): contract_test for the
// kinds on the host's kernel, contract_vm_test for the VM kinds.
#ifdef DSEC_CONTRACT_VM_KINDS
INSTANTIATE_TEST_SUITE_P(Kinds, Contract, ::testing::ValuesIn(RegisteredKinds(IsVm)), KindParamName);
#else
// The fake kind (tests only) passes it too: the actors' unit tests stand on it.
INSTANTIATE_TEST_SUITE_P(Kinds, Contract, ::testing::ValuesIn(RegisteredKinds(OnTheHostKernel, /*with_test_kinds=*/true)),
                         KindParamName);
#endif

}  // namespace
}  // namespace dsec::testing
