// A real FncallDriver (real dsec-spawner, namespaces, cgroups) shared by the
// tests of one binary, with a synchronous Run(). Tests skip, saying why, on a
// host that lacks what fncall sandboxes need (FncallHostGap: not root, no
// cgroup v1 controllers ...); on a host that has it all, a driver that does
// not start fails every test.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "drivers/fncall/fncall_driver.hpp"
#include "drivers/limits.hpp"
#include "tests/support/probes.hpp"

namespace dsec::testing {

class FncallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason_ = FncallHostGap();
    if (!skip_reason_.empty()) return;
    drivers::FncallOptions o;
    o.pool_size = 4;
    o.cgroup_parent = "dsec-test";
    auto d = drivers::FncallDriver::Start(o);
    if (d.ok()) driver_ = std::move(*d);
    else failure_ = d.status().ToString();
  }
  static void TearDownTestSuite() { driver_.reset(); }
  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << "fncall sandboxes unavailable on this host: " << skip_reason_;
    // Reported here, not in SetUpTestSuite: gtest marks every test of a suite
    // whose set-up failed as skipped, and ctest counts those as passed.
    ASSERT_TRUE(driver_) << "the fncall driver did not start on a host that has all it needs: " << failure_;
  }

  // Starts argv with the node's default limits, overridden by `limits`; the
  // future holds its result.
  static std::future<Result<v1::ExecResult>> RunAsync(std::vector<std::string> argv, v1::Limits limits = {},
                                                      std::string stdin_data = {}) {
    v1::ExecRequest req;
    for (auto& a : argv) req.add_argv(a);
    req.set_stdin(std::move(stdin_data));
    *req.mutable_limits() = limits;
    v1::SandboxRecord sb;
    auto eff = drivers::EffectiveLimits(drivers::LimitPolicy::Default(), drivers::FncallDriver::Traits(), sb.spec(), req);
    EXPECT_TRUE(eff.ok()) << eff.status().ToString();
    if (eff.ok()) *req.mutable_limits() = *eff;
    auto p = std::make_shared<std::promise<Result<v1::ExecResult>>>();
    auto f = p->get_future();
    driver_->Exec(sb, "test-run-" + std::to_string(++counter_), req,
                  [p](Result<v1::ExecResult> r) { p->set_value(std::move(r)); });
    return f;
  }
  // Runs argv with the node's default limits, overridden by `limits`.
  static v1::ExecResult Run(std::vector<std::string> argv, v1::Limits limits = {},
                            std::string stdin_data = {}) {
    auto r = RunAsync(std::move(argv), limits, std::move(stdin_data)).get();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : v1::ExecResult{};
  }
  static v1::ExecResult Sh(const std::string& script, v1::Limits limits = {}) {
    return Run({"/bin/sh", "-c", script}, limits);
  }

  static inline std::unique_ptr<drivers::FncallDriver> driver_;
  static inline std::string skip_reason_, failure_;
  static inline std::atomic<int> counter_{0};
};

}  // namespace dsec::testing
