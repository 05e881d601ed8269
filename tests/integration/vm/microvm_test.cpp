// The microvm kind against a real dsecd: what a bad request or a missing
// piece of the host gets (a clear error naming the object and the fix, and
// nothing left behind), and kill -9 of dsecd with VMs running.
#include <gmock/gmock.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "runtime/files.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/kinds.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;

KindParam Microvm() {
  for (const auto& k : RegisteredKinds())
    if (k.kind == v1::KIND_MICROVM) return k;
  return {};
}

class MicrovmTest : public ContainerTest {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (auto gap = KindHostGap(Microvm()); !gap.empty()) GTEST_SKIP() << gap;
  }
  static v1::SandboxSpec Spec(const std::string& image = kImage) {
    auto spec = ContainerSpec(image);
    spec.set_kind(v1::KIND_MICROVM);
    return spec;
  }
  // Nothing of VMs on the host for `daemon`: no QEMU, no VM dir, no group.
  static void ExpectNoVm(const TestDaemon& daemon) {
    EXPECT_TRUE(ProcessesMatching(daemon.data_dir() + "/vms/").empty()) << "a QEMU is left";
    EXPECT_TRUE(ListSubdirs(daemon.data_dir() + "/vms").empty()) << "a VM dir is left";
    for (const std::string root : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup"})
      EXPECT_TRUE(ListSubdirs(root + "/dsec-test/vm").empty()) << "a VM group is left in " << root;
  }
};

TEST_F(MicrovmTest, BadRequestsAreRefusedNamingWhatIsWrongAndLeaveNothing) {
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

TEST_F(MicrovmTest, TheRecordSaysWhichKindAndAcceleratorAutoGave) {
  auto spec = ContainerSpec(kImage);
  spec.set_kind(v1::KIND_AUTO);
  spec.set_isolation(v1::ISOLATION_KERNEL);
  auto sb = client_->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  made_.push_back(*sb);
  auto rec = sb->Get();
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->spec().kind(), v1::KIND_MICROVM);
  bool hw = ::access("/sys/module/kvm_intel", F_OK) == 0 || ::access("/sys/module/kvm_amd", F_OK) == 0;
  EXPECT_EQ(rec->accelerator(), hw && ::access("/dev/kvm", R_OK | W_OK) == 0 ? "kvm" : "tcg");
  EXPECT_THAT(ShIn(*sb, "cat /proc/sys/kernel/osrelease").stdout(), HasSubstr("cloud-amd64"));
  EXPECT_TRUE(sb->Destroy().ok());
  ExpectNoVm(*daemon_);
}

// kill -9 of dsecd with 8 VMs up: the next dsecd re-adopts every one, with
// what it held, and after they are destroyed nothing of them is left.
TEST_F(MicrovmTest, Kill9OfDsecdWithEightVmsReadoptsThemAllWithTheirState) {
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
  ASSERT_EQ(ProcessesMatching(daemon_->data_dir() + "/vms/").size(), 8u) << "the VMs did not outlive dsecd";
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
class MicrovmHostGap : public ContainerTest {
 protected:
  static void SetUpTestSuite() {}
  static void TearDownTestSuite() {}
  void SetUp() override {
    if (auto gap = KindHostGap(Microvm()); !gap.empty()) GTEST_SKIP() << gap;
  }
  void TearDown() override {}
};

// A dsecd whose microvm kind lacks a piece says so: in its kinds, and in the
// error of a creation, naming the fix.
TEST_F(MicrovmHostGap, MissingQemuOrGuestMakesTheKindUnavailableSayingWhy) {
  {
    std::unique_ptr<TestDaemon> d;
    std::unique_ptr<Client> c;
    TestDaemonOptions o;
    o.extra_args = {"--microvm-qemu", "/nonexistent/qemu-system-x86_64"};
    std::string why = StartContainerDaemon(o, &d, &c);
    if (!why.empty()) GTEST_SKIP() << why;
    auto status = d->Admin("status");
    EXPECT_THAT(status.dump(), HasSubstr("apt-get install qemu-system-x86"));
    auto spec = ContainerSpec(ContainerTest::kImage);
    spec.set_kind(v1::KIND_MICROVM);
    auto sb = c->Create(spec);
    EXPECT_FALSE(sb.ok());
    EXPECT_THAT(sb.status().message(), HasSubstr("qemu-system-x86"));
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
    spec.set_kind(v1::KIND_MICROVM);
    auto sb = c->Create(spec);
    EXPECT_EQ(sb.status().code(), Status::Code::kFailedPrecondition) << sb.status().ToString();
    EXPECT_THAT(sb.status().message(), HasSubstr(std::string("dsec-image guest --dir ") + tmpl));
    ::rmdir(tmpl);
  }
}

// A guest whose agent never answers: the creation fails at its deadline,
// saying so, and nothing of the VM is left.
TEST_F(MicrovmHostGap, AGuestWhoseAgentNeverAnswersFailsAtItsDeadlineAndLeavesNothing) {
  char tmpl[] = "/tmp/dsec-test-mute-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string mute = std::string(tmpl) + "/agent";
  ASSERT_TRUE(WriteFileAtomic(mute, "#!/bin/sh\nexec sleep 100000\n", 0755).ok());
  ::setenv("DSEC_AGENT", mute.c_str(), 1);  // dsecd's guests get this "agent"
  std::unique_ptr<TestDaemon> d;
  std::unique_ptr<Client> c;
  TestDaemonOptions o;
  o.extra_args = {"--vm-boot-timeout", "15"};
  std::string why = StartContainerDaemon(o, &d, &c);
  ::unsetenv("DSEC_AGENT");
  if (!why.empty()) GTEST_SKIP() << why;
  auto spec = ContainerSpec(ContainerTest::kImage);
  spec.set_kind(v1::KIND_MICROVM);
  auto t0 = std::chrono::steady_clock::now();
  auto sb = c->Create(spec);
  auto s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), Status::Code::kDeadlineExceeded) << sb.status().ToString();
  EXPECT_THAT(sb.status().message(), HasSubstr("did not answer"));
  EXPECT_GE(s, 14);
  EXPECT_TRUE(ProcessesMatching(d->data_dir() + "/vms/").empty()) << "a QEMU is left";
  EXPECT_TRUE(ListSubdirs(d->data_dir() + "/vms").empty()) << "a VM dir is left";
  c.reset();
  d.reset();
  ::unlink(mute.c_str());
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace dsec::testing
