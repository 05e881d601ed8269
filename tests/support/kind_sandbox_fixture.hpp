// One sandbox of a registered kind per test (the kind is the test's
// parameter, tests/support/kinds.hpp), on the container suite's daemon: a
// host-image kind runs on the host's files, the others on the tools image.
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
    v1::SandboxSpec spec = GetParam().traits.host_image ? FncallSpec() : ContainerSpec(kImage);
    spec.set_kind(GetParam().kind);
    auto sb = client_->Create(spec);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    made_.push_back(*sb);
    sb_.emplace(*sb);
  }
  v1::ExecResult Run(const v1::ExecRequest& req) { return Exec(*sb_, req); }
  v1::ExecResult Run(std::vector<std::string> argv) { return Exec(*sb_, Command(std::move(argv))); }

  std::optional<Sandbox> sb_;
};

}  // namespace dsec::testing
