// A real dsecd that can run containers, with one image ("tools": the host's
// shell tools and python3, tests/support/rootfs.hpp) built through dsec-image,
// shared by the tests of one suite. Tests skip, saying why, on a host that
// cannot run containers (not root, no erofs-utils, no cgroup v1 ...).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dsec/client.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/rootfs.hpp"

namespace dsec::testing {

class ContainerTest : public ::testing::Test {
 public:
  static constexpr const char* kImage = "tools";

 protected:
  static void SetUpTestSuite() { skip_ = StartContainerDaemon(TestDaemonOptions(), &daemon_, &client_); }
  static void TearDownTestSuite() {
    client_.reset();
    daemon_.reset();
  }
  void SetUp() override {
    if (!client_) GTEST_SKIP() << skip_;
  }
  // Destroys what Make made and a failed ASSERT left behind.
  void TearDown() override;

  // A new container (NewContainer) that TearDown destroys if the test
  // does not.
  Result<Sandbox> Make(v1::Limits limits = {});
  // Destroys `sb` and checks the host keeps nothing of it.
  void Destroy(const Sandbox& sb);

  // Starts a daemon, checks it offers containers, builds the tools image
  // in it and connects a client. "" on success, else why the tests skip.
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
  // (memory hierarchy), processes in it; "" when nothing is left.
  static std::string Remains(const std::string& sandbox_id);
  // The host pid of the container's init (its agent), from the driver's
  // state; 0 (and a test failure recorded) when there is none.
  static int InitPid(const Sandbox& sb);
  // The container's freezer.state ("THAWED", "FROZEN"; "" when it has no group).
  static std::string FreezerState(const std::string& sandbox_id);

  static inline std::unique_ptr<TestDaemon> daemon_;
  static inline std::unique_ptr<Client> client_;
  static inline std::string skip_;
  std::vector<Sandbox> made_;
};

}  // namespace dsec::testing
