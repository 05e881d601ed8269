#include "drivers/spawner/sandbox_root.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace dsec::fncall {

namespace {

const char* const kEtcAllow[] = {
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "host.conf", "gai.conf",
    "localtime", "timezone", "alternatives", "debian_version", "os-release", "lsb-release",
    "bash.bashrc", "profile", "inputrc", "mime.types", "protocols", "services", "shells",
    "magic", "magic.mime", "python3", "python3.11", "python3.12", "perl", "vim", nullptr};

// Where the root is staged inside the private namespace before pivot_root.
constexpr const char* kStage = "/tmp";

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

bool WriteFile(const std::string& path, const std::string& content, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  bool ok = ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  ::close(fd);
  return ok;
}

// Copies a host /etc entry (file, symlink or small directory tree) into dst.
// Only regular files up to 1 MiB, symlinks and directories; depth-limited.
void CopyEntry(const std::string& src, const std::string& dst, int depth) {
  struct stat st;
  if (::lstat(src.c_str(), &st) < 0 || depth > 4) return;
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = ::readlink(src.c_str(), target, sizeof target - 1);
    if (n > 0) {
      target[n] = 0;
      (void)::symlink(target, dst.c_str());
    }
  } else if (S_ISREG(st.st_mode) && st.st_size <= (1 << 20)) {
    int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return;
    std::string data(static_cast<size_t>(st.st_size), '\0');
    ssize_t n = ::read(in, data.data(), data.size());
    ::close(in);
    if (n >= 0) {
      data.resize(static_cast<size_t>(n));
      WriteFile(dst, data, st.st_mode & 0755);
    }
  } else if (S_ISDIR(st.st_mode)) {
    if (::mkdir(dst.c_str(), 0755) < 0 && errno != EEXIST) return;
    DIR* d = ::opendir(src.c_str());
    if (!d) return;
    while (dirent* e = ::readdir(d)) {
      if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
      CopyEntry(src + "/" + e->d_name, dst + "/" + e->d_name, depth + 1);
    }
    ::closedir(d);
  }
}

std::string BuildEtc(const std::string& etc, const RootOptions& o) {
  if (::mkdir(etc.c_str(), 0755) < 0) return Errno("mkdir " + etc);
  for (const char* const* p = kEtcAllow; *p; ++p)
    CopyEntry(std::string("/etc/") + *p, etc + "/" + *p, 0);
  std::string uid = std::to_string(o.uid), gid = std::to_string(o.gid);
  bool ok = WriteFile(etc + "/passwd",
                      "root:x:0:0:root:/root:/bin/sh\n" + o.user + ":x:" + uid + ":" + gid +
                          ":sandbox:/work:/bin/sh\n",
                      0644) &&
            WriteFile(etc + "/group", "root:x:0:\n" + o.user + ":x:" + gid + ":\n", 0644) &&
            WriteFile(etc + "/hosts", "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n", 0644) &&
            WriteFile(etc + "/hostname", "sandbox\n", 0644) &&
            WriteFile(etc + "/resolv.conf", "", 0644);
  if (!ok) return Errno("write generated /etc files");
  (void)::symlink("../proc/self/mounts", (etc + "/mtab").c_str());
  return {};
}

std::string BuildDev(const std::string& dev) {
  if (::mkdir(dev.c_str(), 0755) < 0) return Errno("mkdir " + dev);
  struct Node {
    const char* name;
    unsigned major, minor;
  };
  for (const Node& n : {Node{"null", 1, 3}, Node{"zero", 1, 5}, Node{"full", 1, 7},
                        Node{"random", 1, 8}, Node{"urandom", 1, 9}}) {
    std::string path = dev + "/" + n.name;
    if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(n.major, n.minor)) < 0)
      return Errno("mknod " + path);
    ::chmod(path.c_str(), 0666);  // mknod honours the umask
  }
  (void)::symlink("/proc/self/fd", (dev + "/fd").c_str());
  (void)::symlink("/proc/self/fd/0", (dev + "/stdin").c_str());
  (void)::symlink("/proc/self/fd/1", (dev + "/stdout").c_str());
  (void)::symlink("/proc/self/fd/2", (dev + "/stderr").c_str());
  (void)::symlink("/tmp", (dev + "/shm").c_str());
  return {};
}

// Mirrors a host top-level entry: a symlink stays a symlink (merged /usr), a
// directory becomes a read-only bind mount.
std::string MirrorTop(const std::string& root, const char* name) {
  std::string host = std::string("/") + name, dst = root + "/" + name;
  struct stat st;
  if (::lstat(host.c_str(), &st) < 0) return {};  // absent on this host: fine
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = ::readlink(host.c_str(), target, sizeof target - 1);
    if (n <= 0) return Errno("readlink " + host);
    target[n] = 0;
    if (::symlink(target, dst.c_str()) < 0) return Errno("symlink " + dst);
    return {};
  }
  if (!S_ISDIR(st.st_mode)) return {};
  if (::mkdir(dst.c_str(), 0755) < 0) return Errno("mkdir " + dst);
  if (::mount(host.c_str(), dst.c_str(), nullptr, MS_BIND, nullptr) < 0)
    return Errno("bind " + host);
  if (::mount(nullptr, dst.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
              nullptr) < 0)
    return Errno("remount read-only " + dst);
  return {};
}

// Runs in the forked child: returns "" on success or what failed.
std::string BuildInChild(const RootOptions& o) {
  if (::unshare(CLONE_NEWNS) < 0) return Errno("unshare(CLONE_NEWNS)");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
    return Errno("make / private");
  const std::string r = kStage;
  if (::mount("dsec-host-root", r.c_str(), "tmpfs", MS_NOSUID, "mode=0755,size=16m") < 0)
    return Errno("mount tmpfs on " + r);
  ::umask(022);
  for (const char* d : {"proc", "tmp", "work", "root", "run", "var", ".old"})
    if (::mkdir((r + "/" + d).c_str(), 0755) < 0) return Errno(std::string("mkdir ") + d);
  ::chmod((r + "/tmp").c_str(), 01777);
  (void)::symlink("../tmp", (r + "/var/tmp").c_str());
  for (const char* top : {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}) {
    std::string err = MirrorTop(r, top);
    if (!err.empty()) return err;
  }
  if (auto err = BuildEtc(r + "/etc", o); !err.empty()) return err;
  if (auto err = BuildDev(r + "/dev"); !err.empty()) return err;
  if (::chdir(r.c_str()) < 0) return Errno("chdir " + r);
  if (::syscall(SYS_pivot_root, ".", ".old") < 0) return Errno("pivot_root");
  if (::chdir("/") < 0) return Errno("chdir /");
  if (::umount2("/.old", MNT_DETACH) < 0) return Errno("detach old root");
  ::rmdir("/.old");
  if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, nullptr) < 0)
    return Errno("remount root read-only");
  return {};
}

}  // namespace

const char* const* HostEtcAllowList() { return kEtcAllow; }

namespace {

// Runs `build` in a forked child with a private mount namespace and returns
// an fd for that namespace once `build` reports success ("" = success).
template <typename Build>
Result<UniqueFd> BuildNamespace(const char* what, Build build) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) < 0) return Status::FromErrno(errno, "pipe");
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, std::string("fork to ") + what);
  if (pid == 0) {
    ::close(pipefd[0]);
    std::string err = build();
    std::string msg = err.empty() ? std::string("ok") : err;
    (void)!::write(pipefd[1], msg.data(), msg.size());
    ::close(pipefd[1]);
    if (!err.empty()) ::_exit(1);
    for (;;) ::pause();  // hold the namespace until the parent has opened it
  }
  ::close(pipefd[1]);
  char buf[1024];
  ssize_t n = ::read(pipefd[0], buf, sizeof buf);
  ::close(pipefd[0]);
  std::string msg = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("child died");
  UniqueFd ns;
  if (msg == "ok") ns.Reset(::open(("/proc/" + std::to_string(pid) + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC));
  int saved = errno;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  if (msg != "ok") return Status::FailedPrecondition(std::string(what) + ": " + msg);
  if (!ns) return Status::FromErrno(saved, std::string("open the mount namespace of ") + what);
  return ns;
}

std::string BuildEmptyBaseInChild() {
  if (::unshare(CLONE_NEWNS) < 0) return Errno("unshare(CLONE_NEWNS)");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) return Errno("make / private");
  const std::string r = kStage;
  if (::mount("dsec-container-base", r.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=4k") < 0)
    return Errno("mount tmpfs on " + r);
  for (const char* d : {"mnt", ".old"})
    if (::mkdir((r + "/" + d).c_str(), 0755) < 0) return Errno(std::string("mkdir ") + d);
  if (::chdir(r.c_str()) < 0) return Errno("chdir " + r);
  if (::syscall(SYS_pivot_root, ".", ".old") < 0) return Errno("pivot_root");
  if (::chdir("/") < 0) return Errno("chdir /");
  if (::umount2("/.old", MNT_DETACH) < 0) return Errno("detach old root");
  ::rmdir("/.old");
  if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    return Errno("remount the base read-only");
  return {};
}

}  // namespace

Result<UniqueFd> BuildHostRootNamespace(const RootOptions& opts) {
  return BuildNamespace("build the host image root", [&opts] { return BuildInChild(opts); });
}

Result<UniqueFd> BuildContainerBaseNamespace() {
  return BuildNamespace("build the container base namespace", [] { return BuildEmptyBaseInChild(); });
}

}  // namespace dsec::fncall
