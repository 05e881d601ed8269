// What the tests share: a python probe that connects to addresses and
// reports each outcome, the parser for "name result" lines such probes
// print, a host listener the test owns and checks nothing reached; what
// this host offers (only a host that lacks something skips a test: a
// product that fails on a host that has all it needs fails it); and the
// seccomp filter a sandboxed process runs under, read from the kernel and
// tried by a process with every capability, so that a test proves the
// filter and not a missing capability refused a call.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dsec/v1/types.pb.h"
#include "runtime/unique_fd.hpp"

namespace dsec::testing {

// Tries each "family host port" target from argv (TCP, 3 s timeout) and prints
// "host connected" or "host ERRNO".
inline constexpr const char* kConnectProbe =
    "import errno, socket, sys\n"
    "args = sys.argv[1:]\n"
    "for i in range(0, len(args), 3):\n"
    "    fam = {'4': socket.AF_INET, '6': socket.AF_INET6}[args[i]]\n"
    "    host, port = args[i + 1], int(args[i + 2])\n"
    "    s = socket.socket(fam, socket.SOCK_STREAM)\n"
    "    s.settimeout(3)\n"
    "    try:\n"
    "        s.connect((host, port))\n"
    "        print(host, 'connected')\n"
    "    except socket.timeout:\n"
    "        print(host, 'timeout')\n"
    "    except OSError as e:\n"
    "        print(host, errno.errorcode.get(e.errno, e.errno))\n"
    "    s.close()\n";

// "name result" lines -> {name: result}; the result is the rest of the line.
inline std::map<std::string, std::string> ParseResults(const std::string& out) {
  std::map<std::string, std::string> m;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t sp = line.find(' ');
    if (sp != std::string::npos) m[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return m;
}

// A listener the test owns; the UniqueFd closes it whatever happens.
inline UniqueFd NonBlockingListener(int family, const sockaddr* addr, socklen_t len) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  if (::bind(fd.get(), addr, len) < 0 || ::listen(fd.get(), 16) < 0) fd.Reset();
  return fd;
}

// Nothing reached the listener: a non-blocking accept finds no connection.
inline void ExpectNothingAccepted(const UniqueFd& listener) {
  int c = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  int err = errno;
  if (c >= 0) ::close(c);
  EXPECT_LT(c, 0) << "the host listener accepted a connection from the sandbox";
  EXPECT_TRUE(err == EAGAIN || err == EWOULDBLOCK) << std::strerror(err);
}

// Syscall probes: name -> a python call of sc() or sc_fork() (both return
// (result, errno)), run after kPrelude; report() prints "name result errno".
using Probes = std::vector<std::pair<std::string, std::string>>;

// Python: attempt(name, f) prints "name done", or "name ERRNO" when f raises
// OSError (ENOENT, EPERM, ...).
inline constexpr const char* kAttempt =
    "import errno\n"
    "def attempt(name, f):\n"
    "    try:\n"
    "        f()\n"
    "        print(name, 'done')\n"
    "    except OSError as e:\n"
    "        print(name, errno.errorcode.get(e.errno, e.errno))\n";

inline constexpr const char* kPrelude =
    "import ctypes, errno, os, subprocess\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def arg(a):\n"
    "    return ctypes.c_long(a) if isinstance(a, int) else a\n"
    "def sc(nr, *args):\n"
    "    ctypes.set_errno(0)\n"
    "    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])\n"
    "    return r, ctypes.get_errno()\n"
    "def sc_fork(nr, *args):\n"  // a clone that succeeds must not run on here
    "    r, e = sc(nr, *args)\n"
    "    if r == 0:\n"
    "        os._exit(0)\n"
    "    if r > 0:\n"
    "        os.waitpid(r, 0)\n"
    "    return r, e\n"
    "def zeros(n):\n"
    "    return ctypes.create_string_buffer(n)\n"
    "def report(name, res):\n"
    "    r, e = res\n"
    "    print(name, r, errno.errorcode.get(e, e) if r == -1 else '-', flush=True)\n";

inline std::string N(long nr) { return std::to_string(nr); }

// Each probe printed "<name> -1 <expected errno>".
inline void ExpectAllFail(const v1::ExecResult& r, const Probes& probes, const std::string& expected) {
  ASSERT_EQ(r.verdict(), v1::VERDICT_OK) << r.error() << "\n" << r.stderr();
  auto got = ParseResults(r.stdout());
  for (const auto& [name, call] : probes) {
    ASSERT_EQ(got.count(name), 1u) << name << " printed nothing:\n" << r.stdout() << r.stderr();
    EXPECT_EQ(got[name], "-1 " + expected) << name << " = " << call << " was not denied";
  }
}

// "Key:\tvalue" lines of /proc/<pid>/status, values with tabs as spaces.
inline std::map<std::string, std::string> ParseStatus(const std::string& text) {
  std::map<std::string, std::string> m;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    for (char& c : v)
      if (c == '\t') c = ' ';
    size_t b = v.find_first_not_of(' '), e = v.find_last_not_of(' ');
    m[line.substr(0, colon)] = b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
  }
  return m;
}


// Occurrences of `what` in `text`.
inline int Occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// A file of /proc as it reads, "" when its process is gone (also while it
// is read: no stream, which would throw then).
inline std::string ReadProcFile(const std::string& path) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// Whether `pid` has capability `cap` (CAP_SYS_RESOURCE is 24) in its
// effective set, from /proc/<pid>/status; false when it is gone.
inline bool HasCapability(pid_t pid, int cap) {
  std::string eff = ParseStatus(ReadProcFile("/proc/" + std::to_string(pid) + "/status"))["CapEff"];
  return !eff.empty() && (std::stoull(eff, nullptr, 16) >> cap & 1);
}

// Host processes (pids) with `arg` as one of their arguments.
inline std::vector<pid_t> HostProcessesWithArg(const std::string& arg) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::istringstream args(ReadProcFile(std::string("/proc/") + e->d_name + "/cmdline"));
    for (std::string a; std::getline(args, a, '\0');)
      if (a == arg) out.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
  }
  ::closedir(d);
  return out;
}

// --- what this host offers --------------------------------------------------

// The path of `tool` in the usual bin dirs, or "".
inline std::string HostTool(const std::string& tool) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"})
    if (::access((std::string(dir) + "/" + tool).c_str(), X_OK) == 0) return std::string(dir) + "/" + tool;
  return "";
}

// The kernel mounts `fs`: built in or loaded (/proc/filesystems), or a
// module of this kernel that mount(2) loads on demand.
inline bool KernelHasFilesystem(const std::string& fs) {
  std::ifstream in("/proc/filesystems");
  for (std::string line; std::getline(in, line);)
    if (line.size() > fs.size() && line.compare(line.size() - fs.size() - 1, std::string::npos, "\t" + fs) == 0)
      return true;
  utsname u{};
  if (::uname(&u) < 0) return false;
  std::ifstream dep(std::string("/lib/modules/") + u.release + "/modules.dep");
  for (std::string line; std::getline(dep, line);)
    if (line.find("/" + fs + ".ko") != std::string::npos) return true;
  return false;
}

// Why this host cannot run fncall sandboxes, "" when it has all they need
// (dsec-spawner's Init, sandbox_root.cpp, cgroup_v1.cpp): root with the
// capabilities for namespaces, mounts, /dev nodes and the sandbox user; the
// mnt, pid, uts, ipc and net namespaces; seccomp filters; cgroup v1 memory,
// pids, cpu and cpuacct, mounted writable.
inline std::string FncallHostGap() {
  if (::geteuid() != 0) return "not root (fncall sandboxes need namespaces and cgroups)";
  const std::pair<int, const char*> caps[] = {{6, "CAP_SETGID"}, {7, "CAP_SETUID"}, {21, "CAP_SYS_ADMIN"},
                                              {27, "CAP_MKNOD"}};
  for (const auto& [cap, name] : caps)
    if (!HasCapability(::getpid(), cap)) return std::string("root without ") + name + " (a container withholds it)";
  for (const char* ns : {"mnt", "pid", "uts", "ipc", "net"})
    if (::access((std::string("/proc/self/ns/") + ns).c_str(), F_OK) != 0)
      return std::string("the kernel has no ") + ns + " namespaces";
  // A NULL program: EFAULT where filters exist, EINVAL where they do not.
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, 0ul, 0ul, 0ul) < 0 && errno == EINVAL)
    return "the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)";
  std::map<std::string, bool> writable;  // controller -> on a read-write mount
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // <id> <parent> <maj:min> <root> <mountpoint> <options> ... - <fstype> <source> <superoptions>
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream pre(line.substr(0, dash)), post(line.substr(dash + 3));
    std::string id, parent, dev, root, mnt, mnt_opts, fstype, source, opts;
    pre >> id >> parent >> dev >> root >> mnt >> mnt_opts;
    post >> fstype >> source >> opts;
    if (fstype != "cgroup") continue;
    std::istringstream o(opts);
    for (std::string opt; std::getline(o, opt, ',');) writable[opt] = writable[opt] || mnt_opts.rfind("rw", 0) == 0;
  }
  std::string missing, read_only;
  for (const char* c : {"memory", "pids", "cpu", "cpuacct"}) {
    if (!writable.count(c)) missing += std::string(" ") + c;
    else if (!writable[c]) read_only += std::string(" ") + c;
  }
  if (!missing.empty()) return "cgroup v1 controllers not mounted:" + missing;
  if (!read_only.empty()) return "cgroup v1 controllers mounted read-only:" + read_only;
  return "";
}

// Why this host cannot run containers, "" when it has all they need: what
// fncall needs (the same spawner), mkfs.erofs, EROFS and overlayfs.
inline std::string ContainerHostGap() {
  if (auto gap = FncallHostGap(); !gap.empty()) return gap;
  if (HostTool("mkfs.erofs").empty()) return "mkfs.erofs is missing (apt-get install erofs-utils)";
  for (const char* fs : {"erofs", "overlay"})
    if (!KernelHasFilesystem(fs)) return std::string("the kernel has no ") + fs + " file system";
  return "";
}

// Why this host cannot give containers a disk with limits (sandbox_disk.cpp),
// "" when it has all it needs: loop devices, btrfs, mkfs.btrfs, and room in
// /tmp (test daemons' data dirs) for an image of 1 GiB at least.
inline std::string SandboxDiskHostGap() {
  if (::access("/dev/loop-control", F_OK) != 0) return "no /dev/loop-control (loop devices)";
  if (HostTool("mkfs.btrfs").empty()) return "mkfs.btrfs is missing (apt-get install btrfs-progs)";
  if (!KernelHasFilesystem("btrfs")) return "the kernel has no btrfs file system";
  struct statvfs fs{};
  if (::statvfs("/tmp", &fs) == 0 && static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize / 10 * 9 < (1ull << 30))
    return "less than 1 GiB (of 90% of the free space) in /tmp for the sandboxes' disk image";
  return "";
}

// Whether the kernel refuses to open a running program's file for writing
// (ETXTBSY; kernels differ): tried on this test's own binary, never written.
inline bool RunningProgramsRefuseWriters() {
  int fd = ::open("/proc/self/exe", O_WRONLY | O_CLOEXEC);
  int err = errno;
  if (fd >= 0) ::close(fd);
  return fd < 0 && err == ETXTBSY;
}

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
    EXPECT_EQ(with[i], EPERM) << name << " is not refused by the sandbox's seccomp filter: " << said(with[i])
                              << " (without it: " << said(without[i]) << ")";
  }
}

}  // namespace dsec::testing
