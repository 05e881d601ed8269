// A gtest fixture sharing one real dsecd across the tests of a suite; tests
// skip, saying why, when the host lacks what fncall sandboxes need
// (FncallHostGap); on a host that has it all, a daemon that does not start,
// offers no fncall or takes no client fails them.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dsec/client.hpp"
#include "harness/daemon.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {

// What a client of `d` needs: its address and its data dir (the SDK token).
inline ClientOptions ClientOptionsFor(const TestDaemon& d) {
  ClientOptions co;
  co.address = d.sdk_addr();
  co.data_dir = d.data_dir();
  return co;
}

// Connects a client to `d`: "" or why not.
inline std::string ConnectClient(const TestDaemon& d, std::unique_ptr<Client>* client) {
  auto c = Client::Connect(ClientOptionsFor(d));
  if (!c.ok()) return "SDK cannot connect: " + c.status().ToString();
  *client = std::move(*c);
  return "";
}

// What starting a daemon of one's own (for flags the shared one lacks) and a
// client of it came to: both empty when they are up; `skip`, the host lacks
// what fncall needs; `failure`, dsecd, its fncall or the SDK failed on a host
// that has all they need. Reports nothing: from SetUpTestSuite a failure
// would make gtest skip the suite's tests (and ctest count them as passed).
struct DaemonStart {
  std::string skip, failure;
};
inline DaemonStart TryStartOwnDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                     std::unique_ptr<Client>* client) {
  if (auto gap = FncallHostGap(); !gap.empty()) return {"fncall sandboxes unavailable on this host: " + gap, ""};
  auto d = TestDaemon::Start(std::move(o));
  if (!d.ok()) return {"", "dsecd did not start: " + d.status().ToString()};
  *daemon = std::move(*d);
  auto status = (*daemon)->Admin("status");
  bool fncall = false;
  for (const auto& k : status.value("kinds", nlohmann::json::array())) fncall = fncall || k == "fncall";
  if (!fncall) return {"", "dsecd offers no fncall on a host that has all it needs: " + status.dump()};
  return {"", ConnectClient(**daemon, client)};
}

// The same from a test (SetUp or its body): a failure is reported as the
// test's at once. "" when both are up; else why the test cannot go on.
inline std::string StartOwnDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                  std::unique_ptr<Client>* client) {
  auto s = TryStartOwnDaemon(std::move(o), daemon, client);
  if (!s.failure.empty()) ADD_FAILURE() << s.failure;
  return s.failure.empty() ? s.skip : s.failure;
}

class DaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { start_ = TryStartOwnDaemon(TestDaemonOptions(), &daemon_, &client_); }
  static void TearDownTestSuite() {
    client_.reset();
    daemon_.reset();
  }
  // Only a host without fncall skips; a failure fails each test.
  void SetUp() override {
    ASSERT_TRUE(start_.failure.empty()) << start_.failure;
    if (!client_) GTEST_SKIP() << start_.skip;
  }

  static inline std::unique_ptr<TestDaemon> daemon_;
  static inline std::unique_ptr<Client> client_;
  static inline DaemonStart start_;
};

}  // namespace dsec::testing
