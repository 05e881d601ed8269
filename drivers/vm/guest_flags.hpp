// The dsecd flags both VM kinds (microvm, vm) read: the guest, the
// accelerator, the per-VM maxima and the boot deadline. Whichever kind adds
// its flags first adds these too (once per CLI::App).
#pragma once

namespace CLI {
class App;
}

namespace dsec::drivers {

struct DriverEnv;
struct GuestDriverOptions;

// Adds --guest-dir, --vm-accel, --vm-max-memory, --vm-max-vcpus, --vm-pool
// and --vm-boot-timeout to `app` unless it has them.
void AddGuestFlags(CLI::App& app);
// Fills `o` from those flags' values and from the node's environment.
void FillGuestOptions(const DriverEnv& env, const char* kind_name, GuestDriverOptions* o);

}  // namespace dsec::drivers
