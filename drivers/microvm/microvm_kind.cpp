// The microvm kind's registry entry: its dsecd flags and how it starts.
#include <CLI/CLI.hpp>

#include "drivers/microvm/microvm_driver.hpp"
#include "drivers/registry.hpp"

namespace dsec::drivers {

namespace {

class Microvm : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_MICROVM; }
  const char* name() const override { return "microvm"; }
  const KindTraits& traits() const override { return MicrovmDriver::Traits(); }

  void AddFlags(CLI::App& app) override {
    app.add_option("--microvm-qemu", o_.qemu, "the QEMU binary microVMs run in (a path, or a name looked up in PATH)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->capture_default_str();
    app.add_option("--guest-dir", o_.guest_dir,
                   "where the VM guest (kernel and initramfs) is prepared, by `dsec-image guest --dir DIR` "
                   "(default: <data-dir>/guest)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.add_option("--vm-accel", o_.accel,
                   "accelerator of VM sandboxes: auto (kvm where hardware virtualisation backs /dev/kvm, else tcg), "
                   "kvm or tcg")
        ->check(CLI::IsMember({"auto", "kvm", "tcg"}))
        ->capture_default_str();
    app.add_option("--vm-max-memory", o_.max_memory, "the most memory one VM sandbox may ask for (limits.memory_bytes)")
        ->transform(CLI::AsSizeValue(false))
        ->capture_default_str();
    app.add_option("--vm-max-vcpus", o_.max_vcpus, "the most vCPUs one VM sandbox may ask for (limits.cpu_millis / 1000)")
        ->capture_default_str();
    app.add_option("--vm-boot-timeout", boot_timeout_s_,
                   "seconds from QEMU's start to the guest agent's first answer before a creation fails")
        ->capture_default_str();
  }

  Result<std::unique_ptr<Driver>> Start(const DriverEnv& env) override {
    MicrovmOptions o = o_;
    o.data_dir = env.data_dir;
    o.cgroup_parent = env.cgroup_parent;
    o.boot_timeout_ms = static_cast<int>(boot_timeout_s_ * 1000);
    o.find_image = env.find_image;
    o.lost = env.lost;
    if (env.log) o.log = env.log(name());
    auto d = MicrovmDriver::Start(std::move(o));
    if (!d.ok()) return d.status();
    return std::unique_ptr<Driver>(std::move(*d));
  }

 private:
  MicrovmOptions o_;
  double boot_timeout_s_ = 90;
};

}  // namespace

std::unique_ptr<Kind> MicrovmKind() { return std::make_unique<Microvm>(); }

}  // namespace dsec::drivers
