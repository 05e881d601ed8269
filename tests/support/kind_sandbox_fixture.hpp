// One sandbox of a registered kind per test (the kind is the test's
// parameter, tests/support/kinds.hpp), on the container suite's daemon: a
// host-image kind runs on the host's files, the others on the tools image.
// A suite that needs limits sets them in the spec (SpecLimits), where every
// kind takes them: fncall as the default of each run, the container for the
// whole sandbox; an exec can still set its own wall clock (timeout_ms).
#pragma once

#include <optional>

#include "tests/support/container_fixture.hpp"
#include "tests/support/kinds.hpp"

namespace dsec::testing {

class KindSandboxTest : public ContainerTest, public ::testing::WithParamInterface<KindParam> {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (auto gap = KindHostGap(GetParam()); !gap.empty()) GTEST_SKIP() << gap;
    auto sb = NewSandbox();
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    sb_.emplace(*sb);
  }

  // Limits the suite's sandboxes are created with (spec.limits); none here,
  // so the node's defaults hold.
  virtual v1::Limits SpecLimits() const { return {}; }

  // A new sandbox of the test's kind, with the spec SetUp gave sb_ (its
  // limits too); TearDown destroys it.
  Result<Sandbox> NewSandbox() {
    v1::SandboxSpec spec = GetParam().traits.host_image ? FncallSpec() : ContainerSpec(kImage);
    spec.set_kind(GetParam().kind);
    spec.mutable_limits()->MergeFrom(SpecLimits());
    auto sb = client_->Create(spec);
    if (sb.ok()) made_.push_back(*sb);
    return sb;
  }

  v1::ExecResult Run(const v1::ExecRequest& req) { return Exec(*sb_, req); }
  v1::ExecResult Run(std::vector<std::string> argv) { return Exec(*sb_, Command(std::move(argv))); }

  std::optional<Sandbox> sb_;
};

}  // namespace dsec::testing
