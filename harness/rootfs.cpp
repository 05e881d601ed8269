#include "harness/rootfs.hpp"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "runtime/files.hpp"
#include "harness/daemon.hpp"

namespace dsec::testing {

namespace {

std::string Which(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(std::string(path ? path : "") + ":/usr/sbin:/usr/bin:/sbin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');) {
    if (dir.empty()) continue;
    std::string p = dir + "/" + prog;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string Real(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

std::string Parent(const std::string& p) { return p.substr(0, p.rfind('/')); }

Status CopyFile(const std::string& from, const std::string& to, mode_t mode) {
  DSEC_RETURN_IF_ERROR(MakeDirs(Parent(to), 0755));
  std::ifstream in(from, std::ios::binary);
  if (!in) return Status::FailedPrecondition("cannot read " + from);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  if (!out) return Status::Internal("cannot write " + to);
  out.close();
  ::chmod(to.c_str(), mode);
  return Status::Ok();
}

// The libraries `ldd` lists for `binary`, by the path the loader uses.
Result<std::vector<std::string>> Libraries(const std::string& binary) {
  auto r = RunProcess({"/usr/bin/ldd", binary});
  std::vector<std::string> libs;
  if (r.exit_code != 0) {
    if (r.out.find("not a dynamic executable") != std::string::npos ||
        r.err.find("not a dynamic executable") != std::string::npos)
      return libs;
    return Status::FailedPrecondition("ldd " + binary + " failed: " + r.err);
  }
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
    std::istringstream words(line);
    for (std::string w; words >> w;)
      if (!w.empty() && w[0] == '/') {
        libs.push_back(w);
        break;
      }
  }
  return libs;
}

// A binary without its debug info (a tenth of a RelWithDebInfo build's size).
Status CopyStripped(const std::string& from, const std::string& to) {
  if (::access("/usr/bin/strip", X_OK) != 0) return CopyFile(from, to, 0755);
  DSEC_RETURN_IF_ERROR(MakeDirs(Parent(to), 0755));
  auto r = RunProcess({"/usr/bin/strip", "--strip-debug", "-o", to, from});
  if (r.exit_code != 0) return CopyFile(from, to, 0755);  // not an object strip knows (a script)
  ::chmod(to.c_str(), 0755);
  return Status::Ok();
}

Status CopyWithLibraries(const std::string& root, const std::string& from, const std::string& to,
                         std::set<std::string>* copied, bool strip = false) {
  DSEC_RETURN_IF_ERROR(strip ? CopyStripped(Real(from), root + to) : CopyFile(Real(from), root + to, 0755));
  auto libs = Libraries(from);
  if (!libs.ok()) return libs.status();
  for (const auto& lib : *libs) {
    if (!copied->insert(lib).second) continue;
    DSEC_RETURN_IF_ERROR(CopyFile(Real(lib), root + lib, 0755));
  }
  return Status::Ok();
}

}  // namespace

Status MakeRootfs(const std::string& dir, const RootfsOptions& o) {
  if (::access("/usr/bin/ldd", X_OK) != 0) return Status::FailedPrecondition("ldd is missing (libc-bin)");
  for (const char* d : {"", "/bin", "/etc", "/tmp", "/root", "/usr", "/usr/bin", "/usr/lib", "/var", "/work"})
    DSEC_RETURN_IF_ERROR(MakeDirs(dir + d, 0755));
  ::chmod((dir + "/tmp").c_str(), 01777);
  std::set<std::string> copied;
  for (const auto& prog : o.programs) {
    std::string path = Which(prog);
    if (path.empty()) return Status::FailedPrecondition("program '" + prog + "' is not on this host's PATH");
    DSEC_RETURN_IF_ERROR(CopyWithLibraries(dir, path, "/bin/" + prog, &copied));
  }
  for (const auto& [from, to] : o.files) {
    if (::access(from.c_str(), R_OK) != 0) return Status::FailedPrecondition("no " + from + " on this host");
    DSEC_RETURN_IF_ERROR(CopyWithLibraries(dir, from, to, &copied, /*strip=*/true));
  }
  // A user `user` (uid 1000, home /home/user, also in group staff) as E2B's
  // templates have one.
  DSEC_RETURN_IF_ERROR(WriteFileAtomic(dir + "/etc/passwd",
                                       "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
                                       "user:x:1000:1000:user:/home/user:/bin/bash\n"));
  DSEC_RETURN_IF_ERROR(
      WriteFileAtomic(dir + "/etc/group", "root:x:0:\nstaff:x:50:user\nnogroup:x:65534:\nuser:x:1000:\n"));
  DSEC_RETURN_IF_ERROR(MakeDirs(dir + "/home/user", 0755));
  if (::geteuid() == 0 && ::chown((dir + "/home/user").c_str(), 1000, 1000) < 0)
    return Status::FromErrno(errno, "chown " + dir + "/home/user");
  DSEC_RETURN_IF_ERROR(WriteFileAtomic(dir + "/etc/hosts", "127.0.0.1 localhost\n"));
  if (!o.python) return Status::Ok();

  std::string py = Real("/usr/bin/python3");
  if (py.empty()) return Status::FailedPrecondition("/usr/bin/python3 is missing (apt-get install python3)");
  std::string version = py.substr(py.rfind('/') + 1);  // python3.11
  DSEC_RETURN_IF_ERROR(CopyWithLibraries(dir, py, "/usr/bin/" + version, &copied));
  ::symlink(version.c_str(), (dir + "/usr/bin/python3").c_str());
  ::symlink(("/usr/bin/" + version).c_str(), (dir + "/bin/python3").c_str());
  // The standard library without its tests, caches and GUI parts.
  auto tar = RunProcess({"/bin/sh", "-c",
                         "cd /usr/lib && tar cf - --exclude=test --exclude=tests --exclude=__pycache__ "
                         "--exclude=site-packages --exclude=dist-packages --exclude=idlelib --exclude=tkinter "
                         "--exclude=ensurepip --exclude=turtledemo " +
                             version + " | tar xf - -C '" + dir + "/usr/lib'"});
  if (tar.exit_code != 0) return Status::Internal("copy the python standard library: " + tar.err);
  // Extension modules pull in more libraries (libffi, libssl, ...).
  std::string dynload = "/usr/lib/" + version + "/lib-dynload";
  std::vector<std::string> modules;
  if (DIR* d = ::opendir(dynload.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).find(".so") != std::string::npos) modules.push_back(dynload + "/" + e->d_name);
    ::closedir(d);
  }
  for (const auto& mod : modules) {
    auto libs = Libraries(mod);
    if (!libs.ok()) continue;
    for (const auto& l : *libs)
      if (copied.insert(l).second) DSEC_RETURN_IF_ERROR(CopyFile(Real(l), dir + l, 0755));
  }
  return Status::Ok();
}

}  // namespace dsec::testing
