#include "drivers/spawner/seccomp_filter.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

namespace dsec::fncall {

const std::vector<const char*>& DeniedSyscalls() {
  static const std::vector<const char*> kDenied = {
      // filesystems and roots (mknod stays allowed: FIFOs need it, and device
      // nodes need CAP_MKNOD, which no program has)
      "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount", "fsconfig",
      "fspick", "move_mount", "open_tree", "mount_setattr", "open_by_handle_at",
      "name_to_handle_at", "quotactl", "quotactl_fd", "swapon", "swapoff",
      // namespaces
      "unshare", "setns",
      // other processes
      "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
      // kernel
      "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "bpf",
      "perf_event_open", "userfaultfd", "reboot", "syslog", "acct", "lookup_dcookie",
      "iopl", "ioperm", "vhangup", "nfsservctl", "uselib", "sysfs", "_sysctl",
      "io_uring_setup", "io_uring_enter", "io_uring_register",
      // keyrings
      "keyctl", "add_key", "request_key",
      // POSIX message queues live in the ipc namespace, which is recycled
      // (System V objects are checked for; mqueues cannot be cheaply).
      "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
      // time
      "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
  };
  return kDenied;
}

const std::vector<const char*>& NotifiedSyscalls() {
  static const std::vector<const char*> kNotified = {
      "settimeofday", "clock_settime", "mount", "umount2", "pivot_root", "bpf",
  };
  return kNotified;
}

const std::vector<WatchedWrite>& WatchedWrites() {
  // name, dirfd, path, dirfd2, path2, follow, flags
  static const std::vector<WatchedWrite> kWrites = {
      {"open", -1, 0, -1, -1, true, 1},          {"openat", 0, 1, -1, -1, true, 2},
      {"openat2", 0, 1, -1, -1, true, -2},       {"creat", -1, 0},
      {"truncate", -1, 0},                       {"unlink", -1, 0, -1, -1, false},
      {"unlinkat", 0, 1, -1, -1, false},         {"rmdir", -1, 0, -1, -1, false},
      {"rename", -1, 0, -1, 1, false},           {"renameat", 0, 1, 2, 3, false},
      {"renameat2", 0, 1, 2, 3, false},          {"chmod", -1, 0},
      {"fchmodat", 0, 1},                        {"fchmodat2", 0, 1},
      {"chown", -1, 0},
      {"lchown", -1, 0, -1, -1, false},          {"fchownat", 0, 1},
      {"utime", -1, 0},                          {"utimes", -1, 0},
      {"utimensat", 0, 1},                       {"futimesat", 0, 1},
      {"setxattr", -1, 0},                       {"lsetxattr", -1, 0, -1, -1, false},
      {"removexattr", -1, 0},                    {"lremovexattr", -1, 0, -1, -1, false},
  };
  return kWrites;
}

Result<SeccompProgram> BuildSandboxSeccomp(bool notify, bool watch_writes) {
  std::unique_ptr<void, void (*)(scmp_filter_ctx)> ctx(seccomp_init(SCMP_ACT_ALLOW),
                                                        seccomp_release);
  if (!ctx) return Status::Internal("seccomp_init failed");
  // A binary tree instead of a linear list: installing the filter (once per
  // runner) costs about half as much, and so does every filtered syscall.
  seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2);
  for (const char* name : DeniedSyscalls()) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    bool notified = notify && std::any_of(NotifiedSyscalls().begin(), NotifiedSyscalls().end(),
                                          [&](const char* n) { return std::strcmp(n, name) == 0; });
    int rc = seccomp_rule_add(ctx.get(), notified ? SCMP_ACT_NOTIFY : SCMP_ACT_ERRNO(EPERM), nr, 0);
    if (rc < 0) return Status::FromErrno(-rc, std::string("seccomp rule for ") + name);
  }
  for (const auto& w : watch_writes && notify ? WatchedWrites() : std::vector<WatchedWrite>{}) {
    int nr = seccomp_syscall_resolve_name(w.name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    int rc = 0;
    if (w.flags >= 0) {
      // Opened for writing (O_WRONLY or O_RDWR), not as an O_EXCL creation:
      // one masked comparison each (a rule takes one per argument).
      auto arg = static_cast<unsigned>(w.flags);
      for (uint64_t mode : {uint64_t{O_WRONLY}, uint64_t{O_RDWR}}) {
        scmp_arg_cmp cmp{arg, SCMP_CMP_MASKED_EQ, O_ACCMODE | O_EXCL, mode};
        if ((rc = seccomp_rule_add_array(ctx.get(), SCMP_ACT_NOTIFY, nr, 1, &cmp)) < 0) break;
      }
    } else {
      rc = seccomp_rule_add(ctx.get(), SCMP_ACT_NOTIFY, nr, 0);
    }
    if (rc < 0) return Status::FromErrno(-rc, std::string("seccomp rule for watched writes by ") + w.name);
  }
  constexpr uint64_t kNsFlags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                                CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP | 0x00000080 /*CLONE_NEWTIME*/;
  // libseccomp has no "masked != 0" comparison: one rule per namespace flag.
  int rc = 0;
  for (uint64_t bit = 1; bit; bit <<= 1) {
    if (!(kNsFlags & bit)) continue;
    rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, bit, bit));
    if (rc < 0) return Status::FromErrno(-rc, "seccomp rule for clone namespace flags");
  }
  int nr3 = seccomp_syscall_resolve_name("clone3");
  if (nr3 != __NR_SCMP_ERROR) {
    rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), nr3, 0);
    if (rc < 0) return Status::FromErrno(-rc, "seccomp rule for clone3");
  }
  // Export the compiled program through a memfd and read it back.
  int fd = memfd_create("dsec-seccomp", MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create for seccomp export");
  rc = seccomp_export_bpf(ctx.get(), fd);
  if (rc < 0) {
    ::close(fd);
    return Status::FromErrno(-rc, "seccomp_export_bpf");
  }
  off_t size = ::lseek(fd, 0, SEEK_END);
  SeccompProgram p;
  p.insns.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  ssize_t n = ::pread(fd, p.insns.data(), static_cast<size_t>(size), 0);
  ::close(fd);
  if (n != size || p.insns.empty()) return Status::Internal("seccomp export read back short");
  return p;
}

}  // namespace dsec::fncall
