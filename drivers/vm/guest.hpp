// What the VM kinds (microvm, vm) share about the guest and the host: the
// prepared guest (a kernel from Debian's package and an initramfs whose
// init hands over to dsec-agent, tools/guest/), the accelerator, and
// finding QEMU processes by what their command line names.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::drivers::vm {

// The guest every VM of this node boots.
struct Guest {
  std::string kernel;          // <guest dir>/vmlinux
  std::string initrd;          // base.cpio with this dsecd's dsec-agent appended
  std::string kernel_version;  // from guest.txt
};

// The layout of a prepared guest this dsecd boots (guest.txt: `format N`;
// none written means 1). 2: the initramfs loads the loop module too, for
// containers inside a guest (Linux before 6.12 mounts EROFS images through
// loop devices). 3: and virtio_net, for sandboxes with a network. An older
// guest is refused, naming the command that prepares it again.
constexpr int kGuestFormat = 3;

// The command that prepares a guest in `guest_dir`, for error messages.
std::string PrepareCommand(const std::string& guest_dir);

// Checks the guest prepared in `guest_dir` (dsec-guest-build) and writes
// `initrd_path`: its base.cpio (busybox and modules) followed by a cpio
// archive holding `init_path` as /init and `agent_path` as /dsec/agent
// (the kernel unpacks both), so a guest's init and agent are always those
// of the dsecd that started it. FailedPrecondition naming the command that
// prepares the guest when it is missing.
Result<Guest> LoadGuest(const std::string& guest_dir, const std::string& init_path, const std::string& agent_path,
                        const std::string& initrd_path);

// The accelerator for `want` ("auto", "kvm" or "tcg"): kvm when /dev/kvm
// opens and hardware virtualisation backs it (kvm_intel or kvm_amd is
// loaded; a paravirtual KVM such as kvm_pvm cannot boot a stock kernel),
// else tcg. *why says what was found. An explicit "kvm" that is not there
// is FailedPrecondition.
Result<std::string> ChooseAccelerator(const std::string& want, std::string* why);

// The host's TSC rate in kHz, measured against CLOCK_MONOTONIC (the guest's
// TSC runs at it under TCG and KVM alike; told to the guest kernel, which
// otherwise calibrates against an emulated PIT and, on a loaded host, can
// fail and hang).
uint64_t HostTscKhz();

// `name` when it is a path to an executable, else its first executable
// match in $PATH; "" when there is none.
std::string FindInPath(const std::string& name);
// SIGKILL to `pid` (not necessarily our child), then up to timeout_ms for it
// to be gone. True when it is gone.
bool KillAndWait(pid_t pid, int timeout_ms);
// Up to timeout_ms for `pid` to be gone. True when it is gone.
bool WaitGone(pid_t pid, int timeout_ms);

// Processes whose command line contains `marker` (e.g. a VM's own dir).
std::vector<pid_t> ProcessesWith(const std::string& marker);
// True when `pid` runs and its command line contains `marker`.
bool ProcessHas(pid_t pid, const std::string& marker);

// One QMP command on QEMU's monitor socket: connects, negotiates, runs
// `command` with `arguments` (a JSON object's text, "" for none) and
// returns the "return" member's JSON text, or the error QEMU gave
// (FailedPrecondition with its description), or Unavailable when the
// socket does not answer within timeout_ms.
Result<std::string> QmpExecute(const std::string& socket, const std::string& command, const std::string& arguments,
                               int timeout_ms);

}  // namespace dsec::drivers::vm
