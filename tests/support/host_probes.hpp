// What this host offers, read from /proc and the file system: only a host
// that lacks something skips a test (a product that fails on a host that
// has all it needs fails it). Also small /proc readers the tests share.
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
#include <sys/statfs.h>
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
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dsec/v1/types.pb.h"
#include "runtime/unique_fd.hpp"

namespace dsec::testing {

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

// Why the cgroup v2 hierarchy at /sys/fs/cgroup cannot hold sandboxes'
// groups (cgroup_v2.cpp), "" when it can: cgroup2 mounted there, writable,
// offering the memory, pids and cpu controllers.
inline std::string CgroupV2Gap() {
  constexpr long kCgroup2Magic = 0x63677270;
  struct statfs fs{};
  if (::statfs("/sys/fs/cgroup", &fs) < 0 || static_cast<long>(fs.f_type) != kCgroup2Magic)
    return "no cgroup v2 hierarchy at /sys/fs/cgroup";
  if (::access("/sys/fs/cgroup/cgroup.subtree_control", W_OK) != 0) return "/sys/fs/cgroup (cgroup v2) is read-only";
  std::ifstream in("/sys/fs/cgroup/cgroup.controllers");
  std::set<std::string> have;
  for (std::string c; in >> c;) have.insert(c);
  std::string missing;
  for (const char* c : {"memory", "pids", "cpu"})
    if (!have.count(c)) missing += std::string(" ") + c;
  return missing.empty() ? "" : "the cgroup v2 hierarchy at /sys/fs/cgroup lacks the controllers:" + missing;
}

// Why this host cannot run fncall sandboxes, "" when it has all they need
// (dsec-spawner's Init, sandbox_root.cpp, cgroups): root with the
// capabilities for namespaces, mounts, /dev nodes and the sandbox user; the
// mnt, pid, uts, ipc and net namespaces; seccomp filters; cgroup v1 memory,
// pids, cpu and cpuacct, mounted writable, or else a cgroup v2 hierarchy
// that can hold the groups (CgroupV2Gap).
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
  if (missing.empty() && read_only.empty()) return "";
  // Else the unified hierarchy alone, as a stock Debian 12 host mounts it.
  std::string v2 = CgroupV2Gap();
  if (v2.empty()) return "";
  if (!missing.empty()) return "cgroup v1 controllers not mounted:" + missing + "; and " + v2;
  return "cgroup v1 controllers mounted read-only:" + read_only + "; and " + v2;
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

}  // namespace dsec::testing
