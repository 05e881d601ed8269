// The microvm kind's registry entry: its dsecd flags and how it starts.
#include <CLI/CLI.hpp>

#include "drivers/microvm/microvm_driver.hpp"
#include "drivers/registry.hpp"
#include "drivers/vm/guest_flags.hpp"

namespace dsec::drivers {

namespace {

class Microvm : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_MICROVM; }
  const char* name() const override { return "microvm"; }
  const KindTraits& traits() const override { return MicrovmDriver::Traits(); }

  void AddFlags(CLI::App& app) override {
    app.add_option("--microvm-qemu", qemu_, "the QEMU binary microVMs run in (a path, or a name looked up in PATH)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->capture_default_str();
    AddGuestFlags(app);
  }

  Result<std::unique_ptr<Driver>> Start(const DriverEnv& env) override {
    MicrovmOptions o;
    FillGuestOptions(env, name(), &o);
    o.qemu = qemu_;
    auto d = MicrovmDriver::Start(std::move(o));
    if (!d.ok()) return d.status();
    return std::unique_ptr<Driver>(std::move(*d));
  }

 private:
  std::string qemu_ = MicrovmOptions().qemu;
};

}  // namespace

std::unique_ptr<Kind> MicrovmKind() { return std::make_unique<Microvm>(); }

}  // namespace dsec::drivers
