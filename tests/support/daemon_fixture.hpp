// A gtest fixture sharing one real dsecd across the tests of a suite; tests
// skip, saying why, when the host cannot run fncall sandboxes.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dsec/client.hpp"
#include "tests/support/daemon.hpp"

namespace dsec::testing {

// A daemon of one test's own (for flags the shared one lacks) and a client
// of it. "" when both are up; else why the test cannot go on: fncall missing
// on this host (skip), or a daemon or client failure (already reported as a
// test failure).
// What a client of `d` needs: its address and its data dir (the SDK token).
inline ClientOptions ClientOptionsFor(const TestDaemon& d) {
  ClientOptions co;
  co.address = d.sdk_addr();
  co.data_dir = d.data_dir();
  return co;
}

// Connects a client to `d`: "" or why not (reported as a test failure).
inline std::string ConnectClient(const TestDaemon& d, std::unique_ptr<Client>* client) {
  auto c = Client::Connect(ClientOptionsFor(d));
  if (!c.ok()) {
    ADD_FAILURE() << "SDK cannot connect: " << c.status().ToString();
    return "SDK cannot connect";
  }
  *client = std::move(*c);
  return "";
}

inline std::string StartOwnDaemon(TestDaemonOptions o, std::unique_ptr<TestDaemon>* daemon,
                                  std::unique_ptr<Client>* client) {
  auto d = TestDaemon::Start(std::move(o));
  if (!d.ok()) {
    ADD_FAILURE() << "dsecd did not start: " << d.status().ToString();
    return "dsecd did not start";
  }
  *daemon = std::move(*d);
  auto status = (*daemon)->Admin("status");
  bool fncall = false;
  for (const auto& k : status.value("kinds", nlohmann::json::array())) fncall = fncall || k == "fncall";
  if (!fncall) return "fncall sandboxes unavailable on this host: " + status.dump();
  return ConnectClient(**daemon, client);
}

class DaemonTest : public ::testing::Test {
 protected:
  // A daemon that does not start or a client that cannot connect fails the
  // tests (StartOwnDaemon reports it); only a host without fncall skips them.
  static void SetUpTestSuite() { skip_ = StartOwnDaemon(TestDaemonOptions(), &daemon_, &client_); }
  static void TearDownTestSuite() {
    client_.reset();
    daemon_.reset();
  }
  void SetUp() override {
    if (!client_) GTEST_SKIP() << skip_;
  }

  static inline std::unique_ptr<TestDaemon> daemon_;
  static inline std::unique_ptr<Client> client_;
  static inline std::string skip_;
};

}  // namespace dsec::testing
