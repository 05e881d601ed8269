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
// watch_writes (with notify): WatchedWrites() go to the listener too, which
// lets each go on and counts those refused by a read-only mount.
Result<SeccompProgram> BuildSandboxSeccomp(bool notify = false, bool watch_writes = false);

// The calls that write to or remove an existing path, as a container's
// listener watches them (write_watch.cpp): opened for writing without
// O_EXCL (a creation's O_EXCL is how caches and lock files are made, which
// honest tools try on read-only trees), unlinked, renamed, truncated, its
// mode, owner, times or extended attributes set. Argument positions of the
// path(s) and their directory descriptors (-1: none, AT_FDCWD's).
struct WatchedWrite {
  const char* name;
  int dirfd = -1, path = 0;    // the path written, relative to dirfd
  int dirfd2 = -1, path2 = -1;  // a rename's second path
  bool follow = true;          // a final symlink is followed
  int flags = -1;              // open flags' argument (only writes notified); -2: openat2's struct
};
const std::vector<WatchedWrite>& WatchedWrites();

// Of DeniedSyscalls, the ones a container's listener sees (each a sign of
// misbehaviour that honest tools do not show, none a read: the clock set, a
// mount tried, a BPF program loaded). Not ptrace (LeakSanitizer, gdb and
// strace call it) nor unshare/setns (nested sandboxes such as bwrap try).
const std::vector<const char*>& NotifiedSyscalls();

// The syscall names BuildSandboxSeccomp denies (for docs and tests).
const std::vector<const char*>& DeniedSyscalls();

}  // namespace dsec::fncall
