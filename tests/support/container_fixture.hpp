// A real dsecd that can run containers, with one image ("tools": the host's
// shell tools and python3, harness/rootfs.hpp) built through dsec-image,
// shared by the tests of one suite. Tests skip, saying why, on a host that
// cannot run containers (not root, no erofs-utils, no cgroup v1 ...).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dsec/client.hpp"
#include "harness/daemon.hpp"
#include "harness/rootfs.hpp"
#include "tests/support/daemon_fixture.hpp"

namespace dsec::testing {

class ContainerTest : public ::testing::Test {
 public:
  static constexpr const char* kImage = "tools";

  // Stops the daemon the suites of this process shared (UseSharedDaemon),
  // if one is up: after the last suite (a gtest environment calls it).
  static void ReleaseSharedDaemon();

 protected:
  static void SetUpTestSuite() {
    if (SharedDaemonAsked()) return UseSharedDaemon();
    start_ = TryStartContainerDaemon(TestDaemonOptions(), &daemon_, &client_);
  }
  // A shared daemon stays up for the next suite; any other stops here.
  static void TearDownTestSuite() {
    if (shared_) return;
    client_.reset();
    daemon_.reset();
  }
  // $DSEC_TEST_SHARED_DAEMON=1 (tests/CMakeLists.txt sets it for the
  // binaries that ask, SHARED): the suites of this process that take the
  // default daemon share one, started by the first and stopped after the
  // last, instead of one each (a daemon and its image are seconds to set
  // up). Every suite's tests destroy what they make, so the next suite
  // finds the daemon as a new one but for its counters, which no test of
  // such a binary reads as absolute. A suite of its own options, or a test
  // with a daemon of its own (OwnContainerDaemonTest), stops the shared one
  // first; the next suite starts another.
  static bool SharedDaemonAsked();
  static void UseSharedDaemon();
  // Only a host without what containers need skips; a failure fails each test.
  void SetUp() override {
    ASSERT_TRUE(start_.failure.empty()) << start_.failure;
    if (!client_) GTEST_SKIP() << start_.skip;
  }
  // Destroys what Make made and a failed ASSERT left behind.
  void TearDown() override;

  // A new container (NewContainer) that TearDown destroys if the test
  // does not.
  Result<Sandbox> Make(v1::Limits limits = {});
  // Destroys `sb` and checks the host keeps nothing of it.
  void Destroy(const Sandbox& sb);

  // Starts a daemon, checks it offers containers, builds the tools image
  // in it and connects a client. Both empty on success; `skip` when the host
  // lacks what containers need; `failure` when the product failed. Reports
  // nothing (for SetUpTestSuite, where a failure would make gtest skip).
  // The image's tree (MakeRootfs: the host's programs and python) is made
  // once per process and packed into each daemon's store; a tree made the
  // same way elsewhere is taken from $DSEC_TEST_ROOTFS (the cgroup v2
  // guest's image carries one). Started into daemon_, it first stops the
  // shared daemon, if that is what daemon_ holds.
  static DaemonStart TryStartContainerDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                             std::unique_ptr<Client>* client);
  // The tools image's tree packed into `daemon`'s store as `name` (the way
  // TryStartContainerDaemon does); the tree's dir in *dir.
  static DaemonStart BuildToolsImage(const TestDaemon& daemon, const std::string& name, std::string* dir = nullptr);
  // The same from a test (SetUp or its body): a failure is reported as the
  // test's at once. "" when all is up; else why the test cannot go on.
  static std::string StartContainerDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                          std::unique_ptr<Client>* client);

  // A new container on the tools image with these limits.
  static Result<Sandbox> NewContainer(v1::Limits limits = {});
  static v1::ExecRequest Sh(const std::string& script, v1::Limits limits = {});
  // Exec that must reach the sandbox (an error status fails the test).
  static v1::ExecResult Exec(const Sandbox& sb, v1::ExecRequest req);
  static v1::ExecResult ShIn(const Sandbox& sb, const std::string& script, v1::Limits limits = {}) {
    return Exec(sb, Sh(script, limits));
  }
  // What the daemon keeps of a container on the host: its dir, its cgroup
  // (any hierarchy, v1 or v2); "" when nothing is left.
  static std::string Remains(const std::string& sandbox_id);
  // The host pid of the container's init (its agent), from the driver's
  // state (the console's inspect); 0 (and a test failure recorded) when
  // there is none.
  static int InitPid(const Sandbox& sb);
  // The container's freezer.state ("THAWED", "FROZEN"; "" when it has no
  // group); under cgroup v2, the same read off cgroup.events.
  static std::string FreezerState(const std::string& sandbox_id);

  static inline std::unique_ptr<TestDaemon> daemon_;
  static inline std::unique_ptr<Client> client_;
  static inline DaemonStart start_;
  static inline bool shared_ = false;  // daemon_ is the shared one (UseSharedDaemon)
  std::vector<Sandbox> made_;
};

// A daemon of each test's own, which the test may kill and restart (the
// shared one would outlive such a test in a state others do not expect).
class OwnContainerDaemonTest : public ContainerTest {
 protected:
  static void SetUpTestSuite() {}
  void SetUp() override {
    auto skip = StartContainerDaemon(TestDaemonOptions(), &daemon_, &client_);
    if (!client_) GTEST_SKIP() << skip;
  }
  void TearDown() override {
    ContainerTest::TearDown();
    client_.reset();
    daemon_.reset();
  }
};

}  // namespace dsec::testing
