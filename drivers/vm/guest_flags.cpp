#include "drivers/vm/guest_flags.hpp"

#include <CLI/CLI.hpp>

#include "drivers/registry.hpp"
#include "drivers/vm/guest_driver.hpp"

namespace dsec::drivers {

namespace {

struct GuestFlags {
  GuestDriverOptions o;
  double boot_timeout_s = 90;
  double reclaim_idle_s = 30;
};

GuestFlags& Flags() {
  static GuestFlags f;
  return f;
}

}  // namespace

void AddGuestFlags(CLI::App& app) {
  if (app.get_option_no_throw("--guest-dir")) return;
  GuestFlags& f = Flags();
  app.add_option("--guest-dir", f.o.guest_dir,
                 "where the VM guest (kernel and initramfs) is prepared, by `dsec-image guest --dir DIR` "
                 "(default: <data-dir>/guest)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--vm-accel", f.o.accel,
                 "accelerator of VM sandboxes: auto (kvm where hardware virtualisation backs /dev/kvm, else tcg), "
                 "kvm or tcg")
      ->check(CLI::IsMember({"auto", "kvm", "tcg"}))
      ->capture_default_str();
  app.add_option("--vm-max-memory", f.o.max_memory, "the most memory one VM sandbox may ask for (limits.memory_bytes)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--vm-max-vcpus", f.o.max_vcpus, "the most vCPUs one VM sandbox may ask for (limits.cpu_millis / 1000)")
      ->capture_default_str();
  app.add_option("--vm-pool", f.o.pool_size,
                 "booted guests each VM kind keeps ready per image and size (the first creation of a size boots, "
                 "and starts the refill; at most 4 sizes are kept warm). 0: every creation boots")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--vm-reclaim-idle", f.reclaim_idle_s,
                 "seconds a VM sandbox is idle (no exec, no file call) before its guest drops its clean caches and "
                 "compacts its free memory, which its balloon's free-page reporting returns to the host (once per "
                 "idle spell). 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--vm-boot-timeout", f.boot_timeout_s,
                 "seconds from a VM's launch to its guest agent's first answer before a creation fails")
      ->capture_default_str();
}

void FillGuestOptions(const DriverEnv& env, const char* kind_name, GuestDriverOptions* o) {
  const GuestFlags& f = Flags();
  o->guest_dir = f.o.guest_dir;
  o->accel = f.o.accel;
  o->max_memory = f.o.max_memory;
  o->max_vcpus = f.o.max_vcpus;
  o->pool_size = f.o.pool_size;
  o->reclaim_idle_ms = static_cast<int>(f.reclaim_idle_s * 1000);
  o->boot_timeout_ms = static_cast<int>(f.boot_timeout_s * 1000);
  o->data_dir = env.data_dir;
  o->cgroup_parent = env.cgroup_parent;
  o->images = env.images;
  o->network = env.network;
  o->network_unavailable = env.network_unavailable;
  o->network_open = env.network_open;
  o->lost = env.lost;
  if (env.log) o->log = env.log(kind_name);
}

}  // namespace dsec::drivers
