// The seccomp filter every sandboxed program runs under: built once with
// libseccomp, exported as a raw BPF program, and loaded with one prctl in the
// child right before execve (no libseccomp work on the per-run path).
#pragma once

#include <linux/filter.h>

#include <vector>

#include "dsec/status.hpp"

namespace dsec::fncall {

struct SeccompProgram {
  std::vector<sock_filter> insns;
  sock_fprog prog() const {
    return sock_fprog{static_cast<unsigned short>(insns.size()),
                      const_cast<sock_filter*>(insns.data())};
  }
};

// Denies (EPERM) what a sandboxed program never needs and what would let it
// out or at the host: mount family, namespaces (unshare, setns, clone with
// CLONE_NEW*), ptrace and process_vm_*, module loading, kexec, bpf, keyrings,
// perf, userfaultfd, io_uring, clock setting, reboot, swap, and friends.
// clone3 gets ENOSYS so libc falls back to clone, whose flags we can check.
// notify: NotifiedSyscalls() go to the filter's listener (seccomp user
// notification) instead, which answers EPERM and counts them per sandbox:
// containers' filter (container_init.cpp, denials.cpp).
Result<SeccompProgram> BuildSandboxSeccomp(bool notify = false);

// Of DeniedSyscalls, the ones a container's listener sees (each a sign of
// misbehaviour that honest tools do not show, none a read: the clock set, a
// mount tried, a BPF program loaded). Not ptrace (LeakSanitizer, gdb and
// strace call it) nor unshare/setns (nested sandboxes such as bwrap try).
const std::vector<const char*>& NotifiedSyscalls();

// The syscall names BuildSandboxSeccomp denies (for docs and tests).
const std::vector<const char*>& DeniedSyscalls();

}  // namespace dsec::fncall
