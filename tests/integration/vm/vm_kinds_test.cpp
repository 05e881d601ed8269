// The VM kinds (microvm, vm) against a real dsecd: what a bad request or a
// missing piece of the host gets (a clear error naming the object and the
// fix, and nothing left behind), and kill -9 of dsecd with VMs running.
#include <gmock/gmock.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "dsec/snapshot.hpp"
#include "runtime/files.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/e2b_sdk.hpp"
#include "tests/support/kinds.hpp"
#include "tests/support/vm_probes.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

// Nothing of `kind`'s VMs on the host for `daemon`: no QEMU, no VM dir, no
// group, no libvirt domain.
void ExpectNoVm(const TestDaemon& daemon, v1::Kind kind) {
  EXPECT_TRUE(VmProcesses(daemon, kind).empty()) << "a QEMU is left";
  EXPECT_TRUE(ListSubdirs(VmRoot(daemon, kind)).empty()) << "a VM dir is left";
  for (const std::string root : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup"}) {
    auto left = ListSubdirs(root + "/dsec-test/vm");
    auto Read = [](const std::string& path) {
      auto text = ReadFileToString(path);
      return text.ok() ? *text : std::string("?");
    };
    std::string names, said;
    for (const auto& n : left) {
      names += " " + n;
      // When it was made, what is in it, and what dsecd's log says of it
      // (CI keeps no log file).
      struct stat st {};
      std::string dir = root + "/dsec-test/vm/" + n;
      if (::stat(dir.c_str(), &st) == 0)
        said += "\n  made " + std::to_string(::time(nullptr) - st.st_ctime) + " s ago; its tasks: [" +
                Read(dir + "/cgroup.procs") + "]";
      std::ifstream log(daemon.log_path());
      for (std::string line; std::getline(log, line);)
        if (line.find(n) != std::string::npos) said += "\n  " + line;
    }
    if (!left.empty())  // another daemon's VMs would show here too
      for (pid_t p : ProcessesMatching("dsecd")) {
        std::string cmd = Read("/proc/" + std::to_string(p) + "/cmdline").substr(0, 300);
        std::replace(cmd.begin(), cmd.end(), '\0', ' ');
        said += "\n  dsecd pid " + std::to_string(p) + ": " + cmd;
      }
    EXPECT_TRUE(left.empty()) << "a VM group is left in " << root << ":" << names << " (dsecd's log: "
                              << daemon.log_path() << ")" << said;
  }
  if (kind == v1::KIND_VM) {
    EXPECT_TRUE(VmDomains(daemon).empty()) << "a libvirt domain is left";
  }
}

class VmKinds : public ContainerTest, public ::testing::WithParamInterface<KindParam> {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (auto gap = KindHostGap(GetParam()); !gap.empty()) GTEST_SKIP() << gap;
  }
  static v1::SandboxSpec Spec(const std::string& image = kImage) {
    auto spec = ContainerSpec(image);
    spec.set_kind(GetParam().kind);
    return spec;
  }
  void ExpectNoVm(const TestDaemon& daemon) const { dsec::testing::ExpectNoVm(daemon, GetParam().kind); }
};

TEST_P(VmKinds, BadRequestsAreRefusedNamingWhatIsWrongAndLeaveNothing) {
  auto unknown = client_->Create(Spec("no-such-image"));
  EXPECT_EQ(unknown.status().code(), Status::Code::kNotFound) << unknown.status().ToString();
  EXPECT_THAT(unknown.status().message(), HasSubstr("no-such-image"));
  auto spec = Spec();
  spec.mutable_limits()->set_memory_bytes(1ull << 40);
  auto big = client_->Create(spec);
  EXPECT_EQ(big.status().code(), Status::Code::kInvalidArgument) << big.status().ToString();
  EXPECT_THAT(big.status().message(), HasSubstr("--vm-max-memory"));
  spec = Spec();
  spec.mutable_limits()->set_cpu_millis(64000);
  auto cpus = client_->Create(spec);
  EXPECT_EQ(cpus.status().code(), Status::Code::kInvalidArgument) << cpus.status().ToString();
  EXPECT_THAT(cpus.status().message(), HasSubstr("--vm-max-vcpus"));
  ExpectNoVm(*daemon_);
}

// kind auto: isolation kernel gives microvm, hardware gives vm.
TEST_P(VmKinds, TheRecordSaysWhichKindAndAcceleratorAutoGave) {
  auto spec = ContainerSpec(kImage);
  spec.set_kind(v1::KIND_AUTO);
  spec.set_isolation(GetParam().traits.isolation);
  auto sb = client_->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->spec().kind(), GetParam().kind);
  bool hw = ::access("/sys/module/kvm_intel", F_OK) == 0 || ::access("/sys/module/kvm_amd", F_OK) == 0;
  EXPECT_EQ(rec->accelerator(), hw && ::access("/dev/kvm", R_OK | W_OK) == 0 ? "kvm" : "tcg");
  EXPECT_THAT(ShIn(*sb, "cat /proc/sys/kernel/osrelease").stdout(), HasSubstr("cloud-amd64"));
  EXPECT_TRUE(sb->Destroy().ok());
  ExpectNoVm(*daemon_);
}

// A microVM's fork carries its memory (DESIGN.md section 14): a counter
// running in the source's memory goes on in every fork from where it
// stood, each fork then goes its own way, with its own hostname,
// machine-id and random numbers; the forks outlive their source. The vm
// kind's forks are restores of libvirt's memory snapshot as new domains.
TEST_P(VmKinds, AForkOfEightCarriesMemoryAndEachGuestIsItsOwn) {
  auto src = client_->Create(Spec());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  made_.push_back(*src);
  // Eight microVMs; three of the vm kind (each a whole QEMU's memory
  // loaded through libvirt: they share nothing, and take longer).
  const uint32_t n = GetParam().kind == v1::KIND_MICROVM ? 8 : 3;
  // A counter in a shell's memory, shown in /run/count at each tick (slow
  // ticks: nine guests share the host's cores under TCG).
  ASSERT_EQ(ShIn(*src, "sh -c 'i=0; while :; do i=$((i+1)); echo $i > /run/count; sleep 0.5; done' "
                       ">/dev/null 2>&1 </dev/null & echo $! > /run/counter; echo ok")
                .stdout(),
            "ok\n");
  auto count_in = [](const Sandbox& sb) {
    return std::atol(ShIn(sb, "while [ \"$(cat /run/count 2>/dev/null || echo 0)\" -lt 2 ]; do sleep 0.1; done; "
                              "cat /run/count").stdout().c_str());
  };
  long before = count_in(*src);
  std::string counter = ShIn(*src, "cat /run/counter").stdout();
  auto forks = Fork(*src, n);
  ASSERT_TRUE(forks.ok()) << forks.status().ToString();
  ASSERT_EQ(forks->size(), n);
  for (auto& f : *forks) made_.push_back(f);
  // Its counter; who it is (hostname, machine-id, 16 random bytes).
  constexpr const char* kLook =
      "cat /run/counter; kill -0 $(cat /run/counter) && echo alive; cat /run/count; "
      "echo; hostname; cat /etc/machine-id; head -c 16 /dev/urandom | sha256sum";
  // Its hostname, machine-id and random bytes, each unlike every other guest's.
  std::set<std::string> seen[3];
  auto identity = [&seen](const std::string& out, const std::string& who) {
    std::string id = out.substr(out.find("\n\n") + 2);
    std::istringstream lines(id);
    std::string line;
    for (auto& set : seen) {
      std::getline(lines, line);
      EXPECT_FALSE(line.empty()) << who << ": " << out;
      EXPECT_TRUE(set.insert(line).second) << who << " has another guest's " << line;
    }
    return id;
  };
  identity(ShIn(*src, kLook).stdout(), "the source");
  for (size_t i = 0; i < forks->size(); ++i) {
    const Sandbox& f = (*forks)[i];
    std::string out = ShIn(f, kLook + std::string("; echo fork-") + std::to_string(i) + " > /run/mine").stdout();
    // The same process, alive, counting on from the source's value (a
    // counter started afresh would be at 1 and have another pid).
    EXPECT_EQ(out.substr(0, out.find('\n') + 1), counter) << "fork " << i << ": " << out;
    EXPECT_NE(out.find("\nalive\n"), std::string::npos) << "fork " << i << ": " << out;
    size_t at = out.find("alive\n") + 6;
    EXPECT_GE(std::atol(out.c_str() + std::min(at, out.size())), before) << "fork " << i << ": its counter went back";
    std::string id = identity(out, "fork " + std::to_string(i));
    EXPECT_EQ(id.substr(0, id.find('\n')), f.id().substr(0, 63)) << "its hostname is its own id";
  }
  // Each goes its own way: what one writes, no other guest sees.
  for (size_t i = 0; i < forks->size(); ++i)
    EXPECT_EQ(ShIn((*forks)[i], "cat /run/mine").stdout(), "fork-" + std::to_string(i) + "\n");
  EXPECT_EQ(ShIn(*src, "cat /run/mine 2>&1 || echo none").stdout().find("fork-"), std::string::npos);
  // A fork's memory is a private mapping of the snapshot's: paused with
  // memory it comes back, and a fork of it carries it on.
  Status paused = (*forks)[0].Pause(/*memory=*/true);
  ASSERT_TRUE(paused.ok()) << paused.ToString();
  EXPECT_TRUE(VmProcessesOf(*daemon_, GetParam().kind, (*forks)[0].id()).empty());
  Status resumed = (*forks)[0].Resume();
  ASSERT_TRUE(resumed.ok()) << resumed.ToString();
  EXPECT_EQ(ShIn((*forks)[0], "kill -0 $(cat /run/counter) && cat /run/mine").stdout(), "fork-0\n");
  auto grand = Fork((*forks)[1], 1);
  ASSERT_TRUE(grand.ok()) << grand.status().ToString();
  made_.push_back((*grand)[0]);
  EXPECT_EQ(ShIn((*grand)[0], "kill -0 $(cat /run/counter) && cat /run/mine").stdout(), "fork-1\n");
  // The source goes; its forks go on.
  ASSERT_TRUE(src->Destroy().ok());
  for (auto& f : *forks) EXPECT_GT(count_in(f), before);
  for (auto& f : *forks) EXPECT_TRUE(f.Destroy().ok());
  EXPECT_TRUE((*grand)[0].Destroy().ok());
  made_.clear();
  auto left = ListSnapshots(*client_);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_TRUE(left->empty()) << "the fork's snapshot goes with its last sandbox";
  ExpectNoVm(*daemon_);
}

// Pause with memory (DESIGN.md section 14): a microVM's memory and
// devices go to disk and its QEMU ends; Resume brings back what it held in
// memory (a running process, a file in its tmpfs), also after a kill -9 of
// dsecd meanwhile; with resume_on_call, a call wakes it. The vm kind's is
// libvirt's save and restore.
TEST_P(VmKinds, PauseWithMemoryEndsTheVmmAndResumeBringsItsMemoryBack) {
  auto a = client_->Create(Spec());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  made_.push_back(*a);
  auto spec = Spec();
  spec.set_resume_on_call(true);
  auto b = client_->Create(spec);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  made_.push_back(*b);
  // In memory: a counting process and 8 MiB in a tmpfs file.
  constexpr const char* kStart =
      "head -c 8388608 /dev/urandom > /tmp/blob; sha256sum < /tmp/blob > /run/sum; "
      "sh -c 'i=0; while :; do i=$((i+1)); echo $i > /run/count; sleep 0.5; done' >/dev/null 2>&1 </dev/null & "
      "echo $! > /run/counter; echo ok";
  constexpr const char* kCheck =
      "kill -0 $(cat /run/counter) && [ \"$(sha256sum < /tmp/blob)\" = \"$(cat /run/sum)\" ] && echo same";
  for (const Sandbox* sb : {&*a, &*b}) ASSERT_EQ(ShIn(*sb, kStart).stdout(), "ok\n");
  const std::string counter_a = ShIn(*a, "cat /run/counter").stdout();
  for (const Sandbox* sb : {&*a, &*b}) {
    ASSERT_TRUE(sb->Pause(/*memory=*/true).ok());
    auto rec = sb->Get();
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_PAUSED);
    EXPECT_TRUE(rec->paused_memory());
    EXPECT_TRUE(VmProcessesOf(*daemon_, GetParam().kind, sb->id()).empty()) << "its QEMU is still there";
  }
  // Without resume_on_call a call is refused, saying why; it stays paused.
  auto refused = a->Exec(Command({"/bin/true"}));
  EXPECT_EQ(refused.status().code(), Status::Code::kFailedPrecondition) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr("paused"));
  // With it, a call wakes it and runs.
  EXPECT_EQ(ShIn(*b, kCheck).stdout(), "same\n");
  auto woken = b->Get();
  ASSERT_TRUE(woken.ok());
  EXPECT_EQ(woken->phase(), v1::SANDBOX_PHASE_RUNNING);
  EXPECT_FALSE(woken->paused_memory());
  // kill -9 of dsecd while `a` is on disk: still paused after, and whole.
  daemon_->Kill9();
  ASSERT_TRUE(daemon_->Restart().ok());
  auto rec = a->Get();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_PAUSED) << rec->error();
  EXPECT_TRUE(rec->paused_memory());
  ASSERT_TRUE(a->Resume().ok());
  EXPECT_EQ(ShIn(*a, kCheck).stdout(), "same\n");
  EXPECT_EQ(ShIn(*a, "cat /run/counter").stdout(), counter_a) << "the same process, not a new one";
  // Paused and resumed again, it goes on (a resumed guest's memory is its own).
  ASSERT_TRUE(a->Pause(true).ok());
  ASSERT_TRUE(a->Resume().ok());
  EXPECT_EQ(ShIn(*a, kCheck).stdout(), "same\n");
  for (auto& sb : made_) EXPECT_TRUE(sb.Destroy().ok());
  made_.clear();
  ExpectNoVm(*daemon_);
}

// The unmodified E2B SDK drives a guest of this kind through the door
// (docs/e2b.md: a template's kind by metadata dsec.kind): a subset of its
// calls, those whose path in a guest differs from a container's (the
// agent over virtio, the relay to a port, pause with memory).
TEST_P(VmKinds, TheE2bSdkDrivesAGuestThroughTheDoor) {
  std::string skip, module = E2bSdkModule(&skip);
  if (module.empty()) GTEST_SKIP() << skip;
  auto r = RunE2bScript(*daemon_, module, "microvm.cjs",
                        {std::string("TEMPLATE=") + kImage, "KIND=" + std::string(GetParam().name)});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  EXPECT_EQ(out["run"], nlohmann::json::parse(R"([4, "line 1\nline 2\nline 3\n", "err\n", "line 1\nline 2\nline 3\n"])"))
      << "streamed, in order, with its exit code";
  EXPECT_EQ(out["hostname"], out["id"]) << "the guest's hostname is its sandbox's id";
  EXPECT_EQ(out["read"], "in a guest");
  EXPECT_EQ(out["list"], nlohmann::json::array({"a.txt"}));
  EXPECT_EQ(out["watched"], true);
  EXPECT_EQ(out["port"], nlohmann::json::parse(R"([200, "hello from a guest"])")) << "a service by its port";
  EXPECT_EQ(out["pausedState"], "paused");
  EXPECT_EQ(out["resumedState"], "running");
  EXPECT_EQ(out["busyListed"], true) << "a command running at the pause goes on after it";
  EXPECT_EQ(out["afterResume"], "in a guest");
  EXPECT_EQ(out["killed"], true);
  ExpectNoVm(*daemon_);
}

// kill -9 of dsecd with 8 VMs up: the next dsecd re-adopts every one, with
// what it held, and after they are destroyed nothing of them is left.
TEST_P(VmKinds, Kill9OfDsecdWithEightVmsReadoptsThemAllWithTheirState) {
  // One after the other: under TCG a boot takes a core, and 8 at once on a
  // small host outlast the SDK's 30 s call timeout (the concurrency of
  // creations is vm_bench's).
  std::vector<Sandbox> vms;
  for (int i = 0; i < 8; ++i) {
    auto sb = client_->Create(Spec());
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    vms.push_back(*sb);
    made_.push_back(*sb);
  }
  for (size_t i = 0; i < vms.size(); ++i)
    ASSERT_EQ(ShIn(vms[i], "echo state-" + std::to_string(i) + " > /work/f && echo ok").stdout(), "ok\n");
  daemon_->Kill9();
  ASSERT_EQ(VmProcesses(*daemon_, GetParam().kind).size(), 8u) << "the VMs did not outlive dsecd";
  ASSERT_TRUE(daemon_->Restart().ok());
  for (size_t i = 0; i < vms.size(); ++i) {
    auto rec = vms[i].Get();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(rec->phase(), v1::SANDBOX_PHASE_RUNNING) << rec->error();
    EXPECT_EQ(ShIn(vms[i], "cat /work/f").stdout(), "state-" + std::to_string(i) + "\n");
  }
  for (auto& sb : vms) EXPECT_TRUE(sb.Destroy().ok());
  made_.clear();
  ExpectNoVm(*daemon_);
}

// Each test starts a dsecd of its own (no shared one).
class VmHostGap : public ContainerTest, public ::testing::WithParamInterface<KindParam> {
 protected:
  static void SetUpTestSuite() {}
  static void TearDownTestSuite() {}
  void SetUp() override {
    if (auto gap = KindHostGap(GetParam()); !gap.empty()) GTEST_SKIP() << gap;
  }
  void TearDown() override {}
  // A dsecd with --vm-pool 1 and its client; "" or why it could not start.
  static std::string StartPooled(std::unique_ptr<TestDaemon>* d, std::unique_ptr<Client>* c) {
    TestDaemonOptions o;
    o.extra_args = {"--vm-pool", "1"};
    return StartContainerDaemon(o, d, c);
  }
  // A figure of the kind's pool in `d`'s stats (-1: none).
  static int Pool(const TestDaemon& d, const char* what) {
    return d.Admin("stats").value(GetParam().name, nlohmann::json::object()).value(what, -1);
  }
  // Waits until `want` guests are ready in the pools (the refills boot or
  // restore them, bounded); the count then.
  static int WaitReady(const TestDaemon& d, int want) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (Pool(d, "pool_ready") != want && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return Pool(d, "pool_ready");
  }
};

// A dsecd whose VM kind lacks a piece says so: in its kinds, and in the
// error of a creation, naming the fix. The piece: QEMU for microvm,
// libvirtd for vm (here: a socket where none listens); the guest for both.
TEST_P(VmHostGap, MissingVmmOrGuestMakesTheKindUnavailableSayingWhy) {
  const bool vm = GetParam().kind == v1::KIND_VM;
  {
    std::unique_ptr<TestDaemon> d;
    std::unique_ptr<Client> c;
    TestDaemonOptions o;
    if (vm) o.extra_args = {"--vm-libvirt", "qemu+unix:///system?socket=/nonexistent/libvirt-sock"};
    else o.extra_args = {"--microvm-qemu", "/nonexistent/qemu-system-x86_64"};
    std::string why = StartContainerDaemon(o, &d, &c);
    if (!why.empty()) GTEST_SKIP() << why;
    const std::string fix = vm ? "libvirtd -d" : "apt-get install qemu-system-x86";
    // libvirtd is tried in the background: its answer shows within seconds.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::string status;
    while ((status = d->Admin("status").dump()).find(fix) == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling the kind's state, bounded
    EXPECT_THAT(status, HasSubstr(fix));
    auto spec = ContainerSpec(ContainerTest::kImage);
    spec.set_kind(GetParam().kind);
    auto sb = c->Create(spec);
    EXPECT_FALSE(sb.ok());
    EXPECT_THAT(sb.status().message(), HasSubstr(vm ? "libvirtd" : "qemu-system-x86"));
    ExpectNoVm(*d, GetParam().kind);
  }
  {
    char tmpl[] = "/tmp/dsec-test-noguest-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    std::unique_ptr<TestDaemon> d;
    std::unique_ptr<Client> c;
    TestDaemonOptions o;
    o.extra_args = {"--guest-dir", tmpl};  // the later flag wins
    std::string why = StartContainerDaemon(o, &d, &c);
    if (!why.empty()) GTEST_SKIP() << why;
    auto spec = ContainerSpec(ContainerTest::kImage);
    spec.set_kind(GetParam().kind);
    auto sb = c->Create(spec);
    EXPECT_EQ(sb.status().code(), Status::Code::kFailedPrecondition) << sb.status().ToString();
    EXPECT_THAT(sb.status().message(), HasSubstr(std::string("dsec-image guest --dir ") + tmpl));
    // A guest prepared by an older dsec-image (its guest.txt names no
    // format): refused, saying to prepare it again.
    const std::string dir = tmpl, real = TestGuestDir();
    for (const char* f : {"/vmlinux", "/base.cpio"}) ASSERT_EQ(::symlink((real + f).c_str(), (dir + f).c_str()), 0);
    ASSERT_TRUE(WriteFileAtomic(dir + "/guest.txt", "kernel 6.1.0-0-cloud-amd64\n").ok());
    sb = c->Create(spec);
    EXPECT_EQ(sb.status().code(), Status::Code::kFailedPrecondition) << sb.status().ToString();
    EXPECT_THAT(sb.status().message(), HasSubstr("prepared by an older dsec-image"));
    EXPECT_THAT(sb.status().message(), HasSubstr("dsec-image guest --dir " + dir + "` again"));
    ExpectNoVm(*d, GetParam().kind);
    for (const char* f : {"/vmlinux", "/base.cpio", "/guest.txt"}) ::unlink((dir + f).c_str());
    ::rmdir(tmpl);
  }
}

// With --vm-pool 1, the first creation of a size boots and starts the
// refill; the next one gets the ready guest (no boot of its own), a fresh
// machine that shares nothing with the first; dsecd's stop removes what is
// left in the pool.
TEST_P(VmHostGap, APooledGuestServesTheNextCreationAndNothingIsLeft) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  std::string why = StartPooled(&d, &c);
  if (!why.empty()) GTEST_SKIP() << why;
  auto spec = ContainerSpec(ContainerTest::kImage);
  spec.set_kind(GetParam().kind);
  auto a = c->Create(spec);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(ShIn(*a, "echo mine > /work/f && echo ok").stdout(), "ok\n");
  ASSERT_EQ(WaitReady(*d, 1), 1) << d->Admin("stats").dump();
  auto t0 = std::chrono::steady_clock::now();
  auto b = c->Create(spec);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto r = ShIn(*b, "cat /work/f 2>/dev/null || echo fresh");
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.stdout(), "fresh\n");
  EXPECT_EQ(Pool(*d, "pool_hits"), 1);
  std::printf("create-to-first-exec from the pool: %lld ms\n", static_cast<long long>(ms));
  EXPECT_TRUE(a->Destroy().ok());
  EXPECT_TRUE(b->Destroy().ok());
  // The refill after b: one more ready guest, removed when dsecd stops.
  EXPECT_EQ(WaitReady(*d, 1), 1);
  c.reset();
  EXPECT_EQ(d->Stop(), 0);
  ExpectNoVm(*d, GetParam().kind);
}

// A guest from a named snapshot comes from that snapshot's pool once one
// waits there (restored ahead; docs/running.md "Snapshots and fork"): with
// the snapshot's files and memory, and an identity of its own given at
// hand-out. The pool goes when the snapshot is removed.
TEST_P(VmHostGap, ASnapshotsPooledGuestIsRestoredAheadAndGetsItsOwnIdentity) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  std::string why = StartPooled(&d, &c);
  if (!why.empty()) GTEST_SKIP() << why;
  auto spec = ContainerSpec(ContainerTest::kImage);
  spec.set_kind(GetParam().kind);
  auto a = c->Create(spec);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(ShIn(*a, "echo kept > /work/f && echo ok").stdout(), "ok\n");
  ASSERT_TRUE(Snapshot(*a, "pool-snap").ok());
  v1::SandboxSpec from;
  from.set_snapshot("pool-snap");
  auto b = c->Create(from);  // restored now: its pool is empty
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(WaitReady(*d, 2), 2) << "the image's pool and the snapshot's, one each: " << d->Admin("stats").dump();
  auto hits = Pool(*d, "pool_hits");
  auto e = c->Create(from);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(Pool(*d, "pool_hits"), hits + 1) << "taken from the snapshot's pool";
  EXPECT_EQ(ShIn(*e, "cat /work/f").stdout(), "kept\n") << "the snapshot's files";
  EXPECT_EQ(ShIn(*e, "cat /proc/sys/kernel/hostname").stdout(), e->id() + "\n") << "its own hostname";
  EXPECT_NE(ShIn(*e, "cat /etc/machine-id").stdout(), ShIn(*b, "cat /etc/machine-id").stdout());
  for (Sandbox* sb : {&*a, &*b, &*e}) EXPECT_TRUE(sb->Destroy().ok());
  ASSERT_TRUE(RemoveSnapshot(*c, "pool-snap").ok());
  EXPECT_EQ(WaitReady(*d, 1), 1) << "the snapshot's pool went with it; the image's stays";
  c.reset();
  EXPECT_EQ(d->Stop(), 0);
  ExpectNoVm(*d, GetParam().kind);
}

// A guest idle past --vm-reclaim-idle drops what it cached (here: the
// image's files it read) without anyone asking, and the sandbox lives on.
TEST_P(VmHostGap, AnIdleGuestGivesBackItsPageCache) {
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  TestDaemonOptions o;
  o.extra_args = {"--vm-reclaim-idle", "2"};
  std::string why = StartContainerDaemon(o, &d, &c);
  if (!why.empty()) GTEST_SKIP() << why;
  auto spec = ContainerSpec(ContainerTest::kImage);
  spec.set_kind(GetParam().kind);
  auto sb = c->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto cached_kib = [&] {
    return std::atol(ShIn(*sb, "python3 -c \"print([l.split()[1] for l in open('/proc/meminfo') if "
                               "l.startswith('Cached:')][0])\"")
                         .stdout()
                         .c_str());
  };
  auto stat = [&](const char* what) {
    return d->Admin("stats").value(GetParam().name, nlohmann::json::object()).value(what, -1);
  };
  // Every file of the image, read once: the guest's page cache holds them
  // (on vm's DAX mount the host's cache does, and only metadata is cached).
  ASSERT_EQ(ShIn(*sb, "find / -xdev -type f -exec cat {} + > /dev/null 2>&1; echo read").stdout(), "read\n");
  long full = cached_kib();
  int before = stat("reclaims");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (stat("reclaims") <= before && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // idle for 2 s, then reclaimed; bounded
  ASSERT_GT(stat("reclaims"), before) << d->Admin("stats").dump();
  long after = cached_kib();
  EXPECT_LT(after, full) << "the guest's page cache did not shrink; " << d->Admin("stats").dump();
  EXPECT_EQ(ShIn(*sb, "echo alive").stdout(), "alive\n");
  EXPECT_TRUE(sb->Destroy().ok());
  ExpectNoVm(*d, GetParam().kind);
}

// Images on demand (docs/images.md) under a guest: a node that takes the
// controller's image lazily boots a guest of this kind on the lazy file
// (microvm: a virtio-blk drive; vm: virtio-pmem with DAX), whose reads
// fetch chunks through the node's cache; the guest reads the tree's bytes.
TEST_P(VmHostGap, AGuestOnAnImageTakenLazilyReadsTheTreesBytes) {
  TestDaemonOptions co;
  co.role = "controller";
  auto controller = TestDaemon::Start(co);
  ASSERT_TRUE(controller.ok()) << controller.status().ToString();
  std::string tree;
  DaemonStart built = BuildToolsImage(**controller, "lazytools", &tree);
  if (!built.skip.empty()) GTEST_SKIP() << built.skip;
  ASSERT_TRUE(built.failure.empty()) << built.failure;
  TestDaemonOptions no;
  no.extra_args = {"--role", "node", "--join", (*controller)->cluster_addr(), "--cluster-secret",
                   (*controller)->data_dir() + "/cluster.secret"};
  auto node = TestDaemon::Start(no);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  auto up = [&] {
    for (const auto& n : (*controller)->Admin("nodes").value("nodes", nlohmann::json::array()))
      if (n.value("state", "") == "up") return true;
    return false;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!up() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the node's join, bounded
  ASSERT_TRUE(up()) << (*controller)->Admin("nodes").dump();
  std::unique_ptr<Client> c;
  ASSERT_EQ(ConnectClient(**controller, &c), "");
  auto spec = ContainerSpec("lazytools");
  spec.set_kind(GetParam().kind);
  auto sb = c->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  // The tree's programs and libraries, read in the guest and on the host
  // (regular files by name, links left out: one digest of names and bytes).
  const std::string sums =
      "python3 -B - <<'EOF'\n"
      "import hashlib, os\n"
      "h = hashlib.sha256()\n"
      "for top in ['bin', 'sbin', 'lib', 'lib64', 'usr/bin', 'usr/sbin', 'usr/lib/x86_64-linux-gnu']:\n"
      "    for d, dirs, files in os.walk(top):\n"
      "        dirs[:] = sorted(x for x in dirs if x != '__pycache__')\n"
      "        for f in sorted(files):\n"
      "            p = os.path.join(d, f)\n"
      "            if os.path.isfile(p) and not os.path.islink(p):\n"
      "                h.update(p.encode() + b'\\0' + open(p, 'rb').read())\n"
      "print(h.hexdigest())\n"
      "EOF\n";
  auto host = RunProcess({"/bin/sh", "-c", "cd " + tree + " && " + sums});
  ASSERT_EQ(host.exit_code, 0) << host.err;
  v1::Limits slow;
  slow.set_timeout_ms(180'000);  // MBs fetched and hashed under TCG
  EXPECT_EQ(ShIn(*sb, "cd / && " + sums, slow).stdout(), host.out);
  auto lazy = (*node)->Admin("stats")["lazy_images"];
  EXPECT_EQ(lazy.value("images", 0), 1) << lazy.dump();
  EXPECT_GT(lazy.value("chunks_fetched", 0), 0) << "the guest's reads fetched no chunk: " << lazy.dump();
  EXPECT_EQ(lazy.value("digest_failures", 0), 0) << lazy.dump();
  EXPECT_TRUE(sb->Destroy().ok());
  ExpectNoVm(**node, GetParam().kind);
}

// A guest whose agent never answers: the creation fails at its deadline,
// saying so, and nothing of the VM is left.
TEST_P(VmHostGap, AGuestWhoseAgentNeverAnswersFailsAtItsDeadlineAndLeavesNothing) {
  char tmpl[] = "/tmp/dsec-test-mute-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string mute = std::string(tmpl) + "/agent";
  ASSERT_TRUE(WriteFileAtomic(mute, "#!/bin/sh\nexec sleep 100000\n", 0755).ok());
  ::setenv("DSEC_AGENT", mute.c_str(), 1);  // dsecd's guests get this "agent"
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  TestDaemonOptions o;
  o.extra_args = {"--vm-boot-timeout", "6"};
  std::string why = StartContainerDaemon(o, &d, &c);
  ::unsetenv("DSEC_AGENT");
  if (!why.empty()) GTEST_SKIP() << why;
  auto spec = ContainerSpec(ContainerTest::kImage);
  spec.set_kind(GetParam().kind);
  auto t0 = std::chrono::steady_clock::now();
  auto sb = c->Create(spec);
  auto s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), Status::Code::kDeadlineExceeded) << sb.status().ToString();
  EXPECT_THAT(sb.status().message(), HasSubstr("did not answer"));
  EXPECT_GE(s, 5);
  ExpectNoVm(*d, GetParam().kind);
  c.reset();
  d.reset();
  ::unlink(mute.c_str());
  ::rmdir(tmpl);
}

INSTANTIATE_TEST_SUITE_P(Kinds, VmKinds, ::testing::ValuesIn(RegisteredKinds(IsVm)), KindParamName);
INSTANTIATE_TEST_SUITE_P(Kinds, VmHostGap, ::testing::ValuesIn(RegisteredKinds(IsVm)), KindParamName);

}  // namespace
}  // namespace dsec::testing
