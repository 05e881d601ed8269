// The vm kind's registry entry: its dsecd flags and how it starts.
#include <CLI/CLI.hpp>

#include "drivers/fullvm/vm_driver.hpp"
#include "drivers/registry.hpp"
#include "drivers/vm/guest_flags.hpp"

namespace dsec::drivers {

namespace {

class Vm : public Kind {
 public:
  v1::Kind kind() const override { return v1::KIND_VM; }
  const char* name() const override { return "vm"; }
  const KindTraits& traits() const override { return VmDriver::Traits(); }

  void AddFlags(CLI::App& app) override {
    app.add_option("--vm-libvirt", uri_, "the libvirt URI vm sandboxes are domains of")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->capture_default_str();
    app.add_option("--vm-image-device", image_device_,
                   "how a vm sandbox's image is attached: pmem (virtio-pmem mounted with DAX: one host page cache "
                   "for every guest of an image) or blk (a read-only virtio-blk disk)")
        ->check(CLI::IsMember({"pmem", "blk"}))
        ->capture_default_str();
    AddGuestFlags(app);
  }

  Result<std::unique_ptr<Driver>> Start(const DriverEnv& env) override {
    VmOptions o;
    FillGuestOptions(env, name(), &o);
    o.uri = uri_;
    o.image_device = image_device_;
    auto d = VmDriver::Start(std::move(o));
    if (!d.ok()) return d.status();
    return std::unique_ptr<Driver>(std::move(*d));
  }

 private:
  std::string uri_ = VmOptions().uri;
  std::string image_device_ = VmOptions().image_device;
};

}  // namespace

std::unique_ptr<Kind> VmKind() { return std::make_unique<Vm>(); }

}  // namespace dsec::drivers
