// One sandbox of a registered kind per test (the kind is the test's
// parameter, tests/support/kinds.hpp), on the container suite's daemon: a
// host-image kind runs on the host's files, the others on the tools image.
// A suite that needs limits sets them in the spec (SpecLimits), where every
// kind takes them: fncall as the default of each run, the container for the
// whole sandbox; an exec can still set its own wall clock (timeout_ms).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "tests/support/container_fixture.hpp"
#include "tests/support/kinds.hpp"

namespace dsec::testing {

// Sandboxes the tests of one suite share, by kind and slot. A VM's creation
// is a boot (seconds of emulation under TCG), so the tests that leave a
// guest as good a subject for the next test as a new one take a shared
// guest instead of booting their own. Made at first use (again when the one
// there is no longer running: a test before failed it); Release destroys
// them, checking that each goes, before the suite's daemon stops.
class SharedSandboxes {
 public:
  static Result<Sandbox> Get(const std::string& kind, int slot, const std::function<Result<Sandbox>()>& make) {
    auto it = all_.find({kind, slot});
    if (it != all_.end()) {
      auto rec = it->second.Get();
      if (rec.ok() && rec->phase() == v1::SANDBOX_PHASE_RUNNING) return it->second;
      (void)it->second.Destroy();
      all_.erase(it);
    }
    auto sb = make();
    if (sb.ok()) all_.emplace(std::make_pair(kind, slot), *sb);
    return sb;
  }
  // The shared one (made if there is none), no longer shared: the caller's.
  static Result<Sandbox> Take(const std::string& kind, int slot, const std::function<Result<Sandbox>()>& make) {
    auto sb = Get(kind, slot, make);
    all_.erase({kind, slot});
    return sb;
  }
  static void Release() {
    for (const auto& [key, sb] : all_) {
      Status gone = sb.Destroy();
      EXPECT_TRUE(gone.ok()) << "the shared " << key.first << " sandbox " << sb.id() << ": " << gone.ToString();
    }
    all_.clear();
  }

 private:
  static inline std::map<std::pair<std::string, int>, Sandbox> all_;
};

class KindSandboxTest : public ContainerTest, public ::testing::WithParamInterface<KindParam> {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (auto gap = KindHostGap(GetParam()); !gap.empty()) GTEST_SKIP() << gap;
    auto sb = SharesItsSandbox() ? SharedSandbox() : NewSandbox();
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    sb_.emplace(*sb);
  }
  // The suite's shared sandboxes go before its daemon does.
  static void TearDownTestSuite() {
    SharedSandboxes::Release();
    ContainerTest::TearDownTestSuite();
  }

  // Limits the suite's sandboxes are created with (spec.limits); none here,
  // so the node's defaults hold.
  virtual v1::Limits SpecLimits() const { return {}; }

  // Whether sb_ is the sandbox the suite's tests share (slot 0 of
  // SharedSandbox) rather than a new one per test: no, unless a suite whose
  // tests change nothing the next one looks at says so for a kind whose
  // creation is a boot.
  virtual bool SharesItsSandbox() const { return false; }

  // A new sandbox of the test's kind, with the spec SetUp gave sb_ (its
  // limits too); TearDown destroys it.
  Result<Sandbox> NewSandbox() {
    auto sb = CreateSandbox();
    if (sb.ok()) made_.push_back(*sb);
    return sb;
  }
  // The sandbox in `slot` the suite's tests of this kind share (made like
  // NewSandbox's at first use); the suite destroys it after its last test.
  Result<Sandbox> SharedSandbox(int slot = 0) {
    return SharedSandboxes::Get(GetParam().name, slot, [this] { return CreateSandbox(); });
  }
  // The shared sandbox in `slot`, taken for this test alone (one it kills):
  // TearDown destroys it; a later test that asks for the slot gets a new one.
  Result<Sandbox> TakeSharedSandbox(int slot = 0) {
    auto sb = SharedSandboxes::Take(GetParam().name, slot, [this] { return CreateSandbox(); });
    if (sb.ok()) made_.push_back(*sb);
    return sb;
  }

  v1::ExecResult Run(const v1::ExecRequest& req) { return Exec(*sb_, req); }
  v1::ExecResult Run(std::vector<std::string> argv) { return Exec(*sb_, Command(std::move(argv))); }

  std::optional<Sandbox> sb_;

 private:
  Result<Sandbox> CreateSandbox() {
    v1::SandboxSpec spec = GetParam().traits.host_image ? FncallSpec() : ContainerSpec(kImage);
    spec.set_kind(GetParam().kind);
    spec.mutable_limits()->MergeFrom(SpecLimits());
    return client_->Create(spec);
  }
};

}  // namespace dsec::testing
