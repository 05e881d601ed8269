// The cgroup v2 backend, for real. This host mounts cgroup v1 (its cgroup2
// mount holds no controller a sandbox needs), so a microVM is booted for
// the purpose: Debian 12's own kernel (6.1) with cgroup v2 alone mounted at
// /sys/fs/cgroup, as on a stock Debian 12 host. In it run, unchanged, the
// groups backend's v2 cases (cgroup_test) and the container limits suite
// (container_security_test), whose dsecd creates and limits containers in
// that hierarchy. The guest's image is this build's binaries and the
// host's tools, made here; what they print is this test's output.
#include <gmock/gmock.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "harness/rootfs.hpp"
#include "tests/support/container_fixture.hpp"
#include "tests/support/kinds.hpp"

namespace dsec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kGuestImage = "cgroup-v2-guest";
constexpr const char* kGuestBin = "/dsec/bin";
constexpr const char* kToolsTree = "/dsec/tools-rootfs";

class CgroupV2Guest : public ContainerTest {
 protected:
  static void SetUpTestSuite() {
    ContainerTest::SetUpTestSuite();
    if (!client_) return;
    KindParam microvm;
    for (const auto& k : RegisteredKinds())
      if (k.kind == v1::KIND_MICROVM) microvm = k;
    if (microvm.name.empty()) {
      gap_ = "this build has no microvm kind";
      return;
    }
    if (gap_ = KindHostGap(microvm); !gap_.empty()) {
      // (From SetUpTestSuite a failure would make gtest skip: SetUp reports it.)
      if (gap_.rfind("FAILED: ", 0) == 0) failure_ = gap_.substr(8), gap_.clear();
      return;
    }
    failure_ = BuildImage();
    if (!failure_.empty()) return;
    // Room for a dsecd, its containers and their images on the guest's
    // writable layer (tmpfs, counted in its memory).
    auto spec = ContainerSpec(kGuestImage);
    spec.set_kind(v1::KIND_MICROVM);
    spec.mutable_limits()->set_memory_bytes(1536ull << 20);
    spec.mutable_limits()->set_disk_bytes(1ull << 30);
    spec.mutable_limits()->set_cpu_millis(2000);
    spec.mutable_limits()->set_pids(4096);  // dsecd's threads count too
    auto vm = client_->Create(spec);
    if (!vm.ok()) {
      failure_ = "the guest did not boot: " + vm.status().ToString();
      return;
    }
    vm_ = std::make_unique<Sandbox>(*vm);
    // The test dsecd's data dir (in /tmp) on a filesystem of its own, as on
    // a host's disk: the guest's root is an overlay, and overlayfs refuses
    // an upper dir (a container's) on another overlay.
    auto req = Command({"/bin/sh", "-c", "mount -t tmpfs -o size=1g,mode=1777 tmp /tmp"});
    auto tmp = vm_->Exec(req);
    if (!tmp.ok() || tmp->exit_code() != 0)
      failure_ = "cannot mount a tmpfs on the guest's /tmp: " +
                 (tmp.ok() ? tmp->stderr() + tmp->error() : tmp.status().ToString());
  }
  static void TearDownTestSuite() {
    if (vm_) (void)vm_->Destroy();
    vm_.reset();
    ContainerTest::TearDownTestSuite();
  }
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!gap_.empty()) GTEST_SKIP() << gap_;
    ASSERT_TRUE(failure_.empty()) << failure_;
    ASSERT_TRUE(vm_);
  }

  // The guest's image: the test tools image's programs and python, plus
  // what the suites run inside need: this build's binaries in /dsec/bin,
  // ldd (MakeRootfs in the guest), tar, mkfs.erofs (dsec-image), and the
  // tree of the tools image (kToolsTree) their daemons build it from
  // ($DSEC_TEST_ROOTFS): made here once, not by each suite under emulation
  // (the same files: the guest's are the host's).
  static std::string BuildImage() {
    char tmpl[] = "/tmp/dsec-test-rootfs-XXXXXX";
    if (!::mkdtemp(tmpl)) return std::string("mkdtemp: ") + std::strerror(errno);
    std::string rootfs = tmpl;
    RootfsOptions o;
    for (const char* p : {"tar", "mkfs.erofs", "sed"}) o.programs.push_back(p);
    o.files.push_back({"/usr/bin/ldd", "/usr/bin/ldd"});
    for (const char* b : {"cgroup_test", "container_security_test", "contract_test", "dsecd", "dsecctl", "dsec-image", "dsec-agent",
                          "dsec-spawner", "leak_check"})
      o.files.push_back({BinDir() + "/" + b, std::string(kGuestBin) + "/" + b});
    Status made = MakeRootfs(rootfs, o);
    if (made.ok()) made = MakeRootfs(rootfs + kToolsTree);
    ProcResult built;
    if (made.ok())
      built = RunProcess({BinDir() + "/dsec-image", "--data-dir", daemon_->data_dir(), "build", rootfs, kGuestImage});
    RunProcess({"/bin/rm", "-rf", rootfs});
    if (!made.ok()) return "cannot make the guest's rootfs: " + made.ToString();
    if (built.exit_code != 0) return "dsec-image build of the guest's image failed: " + built.err;
    return "";
  }

  // Runs a test binary of this build in the guest (its output printed as
  // this test's) and expects all `tests` it selects to run and pass: none
  // failed, none skipped for want of something in the guest.
  static void ExpectSuitePasses(const std::string& binary, const std::string& filter, int tests) {
    auto req = Command({"env", std::string("DSEC_BIN_DIR=") + kGuestBin, std::string("DSEC_TEST_ROOTFS=") + kToolsTree,
                        std::string(kGuestBin) + "/" + binary, "--gtest_filter=" + filter, "--gtest_color=no"});
    req.mutable_limits()->set_timeout_ms(900'000);
    req.mutable_limits()->set_output_bytes(8 << 20);
    auto r = Exec(*vm_, req);
    std::cout << "---- " << binary << " --gtest_filter=" << filter << " in the guest ----\n"
              << r.stdout() << r.stderr() << "---- exit " << r.exit_code() << " ----" << std::endl;
    SCOPED_TRACE(binary);
    ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
    EXPECT_EQ(r.exit_code(), 0);
    std::smatch m;
    int passed = std::regex_search(r.stdout(), m, std::regex(R"(\[  PASSED  \] (\d+) test)")) ? std::stoi(m[1]) : 0;
    EXPECT_EQ(passed, tests) << binary << ": every test selected ran and passed";
    EXPECT_THAT(r.stdout(), Not(HasSubstr("[  SKIPPED ]"))) << binary << ": a test skipped, the guest lacks what it needs";
  }

  // Runs leak_check in the guest, as ctest runs it after the host's tests:
  // nothing the suites made is left there (processes, cgroups of the v2
  // hierarchy, mounts, data dirs).
  static void ExpectNothingLeftInTheGuest() {
    auto req = Command({"env", std::string("DSEC_BIN_DIR=") + kGuestBin, std::string(kGuestBin) + "/leak_check"});
    req.mutable_limits()->set_timeout_ms(120'000);
    auto r = Exec(*vm_, req);
    std::cout << "---- leak_check in the guest ----\n" << r.stdout() << r.stderr() << "---- exit " << r.exit_code()
              << " ----" << std::endl;
    ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error();
    EXPECT_EQ(r.exit_code(), 0) << "the suites left something in the guest: " << r.stdout();
  }

  static inline std::string gap_, failure_;
  static inline std::unique_ptr<Sandbox> vm_;
};

// One test (one guest booted, one image built): ctest runs each test in a
// process of its own, and the VM tests run one at a time.
TEST_F(CgroupV2Guest, TheV2BackendContainersAndTheContractPassInAGuestWithCgroupV2Alone) {
  {
    SCOPED_TRACE("the guest");
    auto r = ShIn(*vm_, "cat /proc/mounts; cat /sys/fs/cgroup/cgroup.controllers; cat /proc/sys/kernel/osrelease");
    ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << r.stderr();
    EXPECT_THAT(r.stdout(), HasSubstr("cgroup2 /sys/fs/cgroup cgroup2 rw"));
    EXPECT_THAT(r.stdout(), Not(HasSubstr(" cgroup rw"))) << "a cgroup v1 hierarchy is mounted";
    for (const char* c : {"memory", "pids", "cpu "}) EXPECT_THAT(r.stdout(), HasSubstr(c));
    // Linux 6.1 mounts EROFS images from block devices only: the containers
    // below mount theirs through loop devices.
    EXPECT_THAT(r.stdout(), HasSubstr("6.1.0-"));
  }
  // The groups backend: every v2 case.
  ExpectSuitePasses("cgroup_test", "*/v2", 8);
  // Containers created and limited there.
  ExpectSuitePasses("container_security_test", "ContainerLimits.*", 5);
  // The sandbox contract, for the kinds whose groups are cgroups: fncall's
  // pooled run groups and containers (pause is a v2 freeze there).
  // Not the users', paths' and processes' tests: no cgroup in them (and each costs seconds under TCG).
  ExpectSuitePasses("contract_test", "*/fncall:*/container:-*ExecAsAUser*:*Interactive*", 22);
  ExpectNothingLeftInTheGuest();
}

}  // namespace
}  // namespace dsec::testing
