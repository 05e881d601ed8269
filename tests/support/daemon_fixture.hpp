// A gtest fixture sharing one real dsecd across the tests of a suite; tests
// skip, saying why, when the host cannot run fncall sandboxes.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dsec/client.hpp"
#include "tests/support/daemon.hpp"

namespace dsec::testing {

class DaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto d = TestDaemon::Start();
    if (!d.ok()) {
      skip_ = d.status().ToString();
      return;
    }
    daemon_ = std::move(*d);
    auto status = daemon_->Admin("status");
    bool fncall = false;
    for (const auto& k : status.value("kinds", nlohmann::json::array())) fncall = fncall || k == "fncall";
    if (!fncall) {
      skip_ = "fncall sandboxes unavailable on this host: " + status.dump();
      return;
    }
    ClientOptions o;
    o.address = daemon_->sdk_addr();
    auto c = Client::Connect(o);
    if (!c.ok()) {
      skip_ = "SDK cannot connect: " + c.status().ToString();
      return;
    }
    client_ = std::move(*c);
  }
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
