// The registry of kinds: the auto kind as a pure function of the spec and
// the kinds' traits, and what a node says of kinds it cannot run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "drivers/registry.hpp"

namespace dsec::drivers {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<const Kind*> Ptrs(const std::vector<std::unique_ptr<Kind>>& kinds) {
  std::vector<const Kind*> out;
  for (const auto& k : kinds) out.push_back(k.get());
  return out;
}

v1::SandboxSpec Spec(const std::string& image, v1::Isolation isolation = v1::ISOLATION_UNSPECIFIED,
                     v1::Kind kind = v1::KIND_AUTO) {
  v1::SandboxSpec s;
  s.set_image(image);
  s.set_isolation(isolation);
  s.set_kind(kind);
  return s;
}

TEST(ChooseKind, TheLightestKindThatMeetsTheIsolationAndTheImage) {
  auto kinds = AllKinds();
  auto all = Ptrs(kinds);
  EXPECT_EQ(*ChooseKind(Spec(""), all), v1::KIND_FNCALL);
  EXPECT_EQ(*ChooseKind(Spec("host"), all), v1::KIND_FNCALL);
  EXPECT_EQ(*ChooseKind(Spec("tools"), all), v1::KIND_CONTAINER) << "fncall runs only on the host's files";
  EXPECT_EQ(*ChooseKind(Spec("", v1::ISOLATION_CONTAINER), all), v1::KIND_CONTAINER);
  EXPECT_EQ(*ChooseKind(Spec("", v1::ISOLATION_PROCESS, v1::KIND_UNSPECIFIED), all), v1::KIND_FNCALL);
  // A spec that names its kind gets it, whatever the traits.
  EXPECT_EQ(*ChooseKind(Spec("tools", v1::ISOLATION_UNSPECIFIED, v1::KIND_FNCALL), all), v1::KIND_FNCALL);
  EXPECT_EQ(*ChooseKind(Spec("tools", v1::ISOLATION_KERNEL), all), v1::KIND_MICROVM);
  EXPECT_EQ(*ChooseKind(Spec("tools", v1::ISOLATION_HARDWARE), all), v1::KIND_VM);
  // Without the kind that offers it: unavailable, naming what is missing.
  decltype(all) no_vm;
  for (auto* k : all)
    if (k->kind() != v1::KIND_VM) no_vm.push_back(k);
  auto hardware = ChooseKind(Spec("tools", v1::ISOLATION_HARDWARE), no_vm);
  EXPECT_EQ(hardware.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(hardware.status().message(), HasSubstr("hardware isolation"));
  EXPECT_THAT(hardware.status().message(), HasSubstr("vm: not implemented yet"));
}

// A kind this build lacks, as a registry entry would describe it.
class KernelKind : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_MICROVM; }
  const char* name() const override { return "microvm"; }
  const KindTraits& traits() const override {
    static const KindTraits t = [] {
      KindTraits t;
      t.isolation = v1::ISOLATION_KERNEL;
      t.stateful = true;
      return t;
    }();
    return t;
  }
  void AddFlags(CLI::App&) override {}
  Result<std::unique_ptr<Driver>> Start(const DriverEnv&) override {
    return Status::FailedPrecondition("microvm: no /dev/kvm on this host");
  }
};

// A kind this build lacks yet, as its registry entry would describe it.
class HardwareKind : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_VM; }
  const char* name() const override { return "vm"; }
  const KindTraits& traits() const override {
    static const KindTraits t = [] {
      KindTraits t;
      t.isolation = v1::ISOLATION_HARDWARE;
      t.stateful = true;
      return t;
    }();
    return t;
  }
  void AddFlags(CLI::App&) override {}
  Result<std::unique_ptr<Driver>> Start(const DriverEnv&) override {
    return Status::FailedPrecondition("vm: libvirtd is not running");
  }
};

TEST(ChooseKind, ANewKindIsChosenByItsTraitsAlone) {
  auto kinds = AllKinds();
  kinds.push_back(std::make_unique<HardwareKind>());
  auto all = Ptrs(kinds);
  EXPECT_EQ(*ChooseKind(Spec("tools", v1::ISOLATION_HARDWARE), all), v1::KIND_VM);
  EXPECT_EQ(*ChooseKind(Spec("tools", v1::ISOLATION_KERNEL), all), v1::KIND_MICROVM) << "still the lightest that fits";
  EXPECT_EQ(*ChooseKind(Spec("tools"), all), v1::KIND_CONTAINER) << "still the lightest that fits";
}

TEST(Registry, AKindThatCannotStartSaysWhyAndTheOthersStillServe) {
  std::vector<std::unique_ptr<Kind>> kinds;
  kinds.push_back(std::make_unique<KernelKind>());
  Registry r(std::move(kinds));
  std::vector<std::string> warned;
  r.StartAll(DriverEnv(), [&](const std::string& why) { warned.push_back(why); });
  EXPECT_THAT(warned, ElementsAre("microvm: no /dev/kvm on this host"));
  auto d = r.DriverFor(Spec("tools", v1::ISOLATION_KERNEL));
  EXPECT_EQ(d.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_THAT(d.status().message(), HasSubstr("no /dev/kvm"));
  auto absent = r.DriverFor(Spec("", v1::ISOLATION_UNSPECIFIED, v1::KIND_FNCALL));
  EXPECT_EQ(absent.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(absent.status().message(), HasSubstr("'fncall' is not available on this node yet (available: microvm)"));
  std::vector<std::string> available, unavailable;
  r.Kinds(&available, &unavailable);
  EXPECT_TRUE(available.empty());
  EXPECT_THAT(unavailable, ElementsAre("microvm: microvm: no /dev/kvm on this host", "fncall: not implemented yet",
                                       "container: not implemented yet", "vm: not implemented yet"));
  EXPECT_TRUE(r.Drivers().empty());
}

}  // namespace
}  // namespace dsec::drivers
