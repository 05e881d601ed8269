// A real FncallDriver (real dsec-spawner, namespaces, cgroups) shared by the
// tests of one binary, with a synchronous Run(). Tests skip, saying why, on a
// host that cannot run fncall sandboxes (not root, no cgroup v1 controllers).
#pragma once

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "drivers/fncall/fncall_driver.hpp"
#include "drivers/limits.hpp"

namespace dsec::testing {

class FncallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    drivers::FncallOptions o;
    o.pool_size = 4;
    o.cgroup_parent = "dsec-test";
    auto d = drivers::FncallDriver::Start(o);
    if (d.ok()) driver_ = std::move(*d);
    else skip_reason_ = d.status().ToString();
  }
  static void TearDownTestSuite() { driver_.reset(); }
  void SetUp() override {
    if (!driver_) GTEST_SKIP() << "fncall sandboxes unavailable on this host: " << skip_reason_;
  }

  // Runs argv with the node's default limits, overridden by `limits`.
  static v1::ExecResult Run(std::vector<std::string> argv, v1::Limits limits = {},
                            std::string stdin_data = {}) {
    v1::ExecRequest req;
    for (auto& a : argv) req.add_argv(a);
    req.set_stdin(std::move(stdin_data));
    *req.mutable_limits() = limits;
    v1::SandboxRecord sb;
    auto eff = drivers::EffectiveLimits(drivers::LimitPolicy::Default(), sb.spec(), req);
    EXPECT_TRUE(eff.ok()) << eff.status().ToString();
    *req.mutable_limits() = *eff;
    std::promise<Result<v1::ExecResult>> p;
    auto f = p.get_future();
    driver_->Exec(sb, "test-run-" + std::to_string(++counter_), req,
                  [&p](Result<v1::ExecResult> r) { p.set_value(std::move(r)); });
    auto r = f.get();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : v1::ExecResult{};
  }
  static v1::ExecResult Sh(const std::string& script, v1::Limits limits = {}) {
    return Run({"/bin/sh", "-c", script}, limits);
  }

  static inline std::unique_ptr<drivers::FncallDriver> driver_;
  static inline std::string skip_reason_;
  static inline int counter_ = 0;
};

}  // namespace dsec::testing
