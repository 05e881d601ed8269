// The seccomp filter a sandboxed process runs under, read from the kernel
// and tried by a process with every capability, so that a test proves the
// filter and not a missing capability refused a call.
#pragma once

#include "tests/support/host_probes.hpp"

namespace dsec::testing {

// --- the seccomp filter a sandboxed process runs under ------------------------

// One system call made raw: its name (for messages), number and arguments.
struct RawCall {
  std::string name;
  long nr;
  std::array<long, 6> a;
};
inline long Ptr(const void* p) { return reinterpret_cast<long>(p); }

// Mount calls the kernel refuses for want of CAP_SYS_ADMIN before it looks
// at these arguments: made by root with it, they fail otherwise (EFAULT,
// EINVAL), so only a filter explains an EPERM. Every kind's tests use them.
inline std::vector<RawCall> CapFirstMountCalls() {
  return {
      {"pivot_root", SYS_pivot_root, {1, 1}},
#ifdef SYS_fsopen
      {"fsopen", SYS_fsopen, {Ptr("tmpfs"), 0x10}},
      {"fsmount", SYS_fsmount, {-1, 0x10, 0}},
      {"fspick", SYS_fspick, {-100, Ptr("/"), 0x1000}},
      {"move_mount", SYS_move_mount, {-100, Ptr("/tmp"), -100, Ptr("/tmp"), 0x10000}},
#endif
  };
}

// Module and kexec calls, which check CAP_SYS_MODULE or CAP_SYS_BOOT first;
// with these arguments root without a filter gets ENOEXEC, EBADF, ENOENT or
// EINVAL (ENOSYS without modules or kexec) and changes nothing.
inline std::vector<RawCall> CapFirstModuleCalls() {
  return {
      {"init_module", SYS_init_module, {0, 0, Ptr("")}},
      {"finit_module", SYS_finit_module, {-1, Ptr(""), 0}},
      {"delete_module", SYS_delete_module, {Ptr("dsec_no_such_module"), O_NONBLOCK}},
      {"kexec_load", SYS_kexec_load, {0, 1000, 0, 0x100}},  // 1000 segments, a bad flag: never an unload
  };
}

// The seccomp filters `pid` runs under, oldest first, read while it is
// stopped for a moment (PTRACE_SECCOMP_GET_FILTER: CAP_SYS_ADMIN and
// CONFIG_CHECKPOINT_RESTORE). On failure *err is the errno of the step
// named in *what: EIO, the kernel cannot export filters; EINVAL, `pid` has
// none. Call on the thread that waits for nothing else of `pid`.
inline std::vector<std::vector<sock_filter>> SeccompFiltersOf(pid_t pid, int* err, std::string* what) {
  std::vector<std::vector<sock_filter>> newest_first;
  *err = 0;
  auto fail = [&](const char* step) {
    *err = errno;
    *what = std::string(step) + " of pid " + std::to_string(pid) + ": " + std::strerror(errno);
  };
  if (::ptrace(PTRACE_SEIZE, pid, nullptr, nullptr) < 0) {
    fail("PTRACE_SEIZE");
    return {};
  }
  int ws = 0;
  if (::ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr) < 0 || ::waitpid(pid, &ws, __WALL) != pid) {
    fail("stopping");
  } else {
    for (unsigned long i = 0;; ++i) {
      long n = ::ptrace(PTRACE_SECCOMP_GET_FILTER, pid, reinterpret_cast<void*>(i), nullptr);
      if (n < 0 && errno == ENOENT && i > 0) break;  // past the oldest
      std::vector<sock_filter> prog(n > 0 ? static_cast<size_t>(n) : 0);
      if (n <= 0 || ::ptrace(PTRACE_SECCOMP_GET_FILTER, pid, reinterpret_cast<void*>(i), prog.data()) != n) {
        fail("PTRACE_SECCOMP_GET_FILTER");
        break;
      }
      newest_first.push_back(std::move(prog));
    }
  }
  ::ptrace(PTRACE_DETACH, pid, nullptr, nullptr);
  return {newest_first.rbegin(), newest_first.rend()};
}

// Makes `calls` in a child of this process, which is root with every
// capability, under `filters` (none: as the kernel alone answers). Each
// call's errno, 0 if it succeeded, -1 if the child died before it. The
// calls must be harmless for root even unfiltered (arguments it refuses).
inline std::vector<int> ErrnosUnder(const std::vector<std::vector<sock_filter>>& filters,
                                    const std::vector<RawCall>& calls) {
  std::vector<int> out(calls.size(), -1);
  std::vector<sock_fprog> progs;
  for (const auto& f : filters)
    progs.push_back({static_cast<unsigned short>(f.size()), const_cast<sock_filter*>(f.data())});
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) < 0) return out;
  pid_t child = ::fork();
  if (child == 0) {
    // Async-signal-safe calls only: this process has threads.
    if (!progs.empty() && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) ::_exit(2);
    for (const auto& p : progs)
      if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p) < 0) ::_exit(3);
    for (const auto& c : calls) {
      long r = ::syscall(c.nr, c.a[0], c.a[1], c.a[2], c.a[3], c.a[4], c.a[5]);
      int e = r < 0 ? errno : 0;
      if (::write(fds[1], &e, sizeof e) != static_cast<ssize_t>(sizeof e)) ::_exit(4);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  for (size_t i = 0; child > 0 && i < calls.size(); ++i)
    if (::read(fds[0], &out[i], sizeof(int)) != static_cast<ssize_t>(sizeof(int))) break;
  ::close(fds[0]);
  if (child > 0) ::waitpid(child, nullptr, 0);
  return out;
}

// The filter `pid` runs under refuses each of `calls` with EPERM even to
// root with every capability, where the kernel alone answers otherwise: so
// the EPERM a sandboxed program gets for them is the filter's, not merely a
// missing capability's. Skips (the caller then goes on) on a host that
// cannot show the filter: no export of filters, or no ptrace at all.
inline void ExpectOnlyTheFilterDenies(pid_t pid, const std::vector<RawCall>& calls) {
  int err = 0;
  std::string what;
  auto filters = SeccompFiltersOf(pid, &err, &what);
  if (err == EIO) GTEST_SKIP() << "this kernel cannot export seccomp filters (CONFIG_CHECKPOINT_RESTORE): " << what;
  if (err == EPERM && ReadProcFile("/proc/sys/kernel/yama/ptrace_scope").rfind('3', 0) == 0)
    GTEST_SKIP() << "ptrace is off on this host (kernel.yama.ptrace_scope = 3): " << what;
  ASSERT_EQ(err, 0) << (err == EINVAL ? "the sandboxed process runs under no seccomp filter: " : "") << what;
  ASSERT_FALSE(filters.empty());
  auto without = ErrnosUnder({}, calls);
  auto with = ErrnosUnder(filters, calls);
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string& name = calls[i].name;
    ASSERT_NE(without[i], -1) << name << ": the unfiltered child died";
    if (without[i] == EPERM) {
      // Refused to root as well (kexec under lockdown): the probe cannot tell here.
      std::cerr << name << ": EPERM without the filter too on this host; not proven by this probe\n";
      continue;
    }
    auto said = [](int e) { return e > 0 ? std::strerror(e) : e == 0 ? "success" : "the child died"; };
    // A container's filter sends some calls to its listener (dsec-spawner's,
    // which answers EPERM: the sandbox's own probes show it); under the copy
    // installed here there is no listener, and the kernel says ENOSYS.
    if (with[i] == ENOSYS && without[i] != ENOSYS) continue;
    EXPECT_EQ(with[i], EPERM) << name << " is not refused by the sandbox's seccomp filter: " << said(with[i])
                              << " (without it: " << said(without[i]) << ")";
  }
}

}  // namespace dsec::testing
