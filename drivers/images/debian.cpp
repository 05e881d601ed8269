#include "drivers/images/debian.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "drivers/images/image_store.hpp"
#include "runtime/files.hpp"

namespace dsec::images {

namespace {

std::string Arch() {
  utsname u{};
  ::uname(&u);
  std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64") return "arm64";
  return m;
}


std::string Find(const char* name) {
  for (const char* d : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string p = std::string(d) + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string Tail(const std::string& path, size_t lines) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return "";
  const std::string& s = *text;
  size_t pos = s.size();
  for (size_t n = 0; n <= lines && pos > 0; ++n) {
    pos = s.rfind('\n', pos - 1);
    if (pos == std::string::npos) return s;
  }
  return s.substr(pos + 1);
}

bool IsValidPackage(const std::string& p) {
  if (p.empty() || p.size() > 128) return false;
  for (char c : p)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '+' && c != '-' && c != ':') return false;
  return std::isalnum(static_cast<unsigned char>(p[0]));
}

}  // namespace

std::string DebianCacheName(const DebianOptions& o) {
  auto packages = o.packages;
  std::sort(packages.begin(), packages.end());
  packages.erase(std::unique(packages.begin(), packages.end()), packages.end());
  std::string key = o.suite + "\n" + Arch() + "\n" + o.variant;
  for (const auto& p : packages) key += "\n" + p;
  for (const auto& u : o.users) key += "\nuser=" + u;  // in order: the first is uid 1000
  return o.suite + "-" + Arch() + "-" + o.variant + "-" + Sha256Hex(key).substr(0, 16);
}

Result<std::string> DebianRootfs(const DebianOptions& o) {
  for (const std::string& word : {o.suite, o.variant})
    if (word.empty() || word.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos)
      return Status::InvalidArgument("'" + word + "' is not a Debian suite or debootstrap variant name");
  for (const auto& p : o.packages)
    if (!IsValidPackage(p)) return Status::InvalidArgument("'" + p + "' is not a Debian package name");
  for (const auto& u : o.users)
    if (u.empty() || u.size() > 32 || u.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos ||
        !(std::islower(static_cast<unsigned char>(u[0])) || u[0] == '_') || u == "root")
      return Status::InvalidArgument("'" + u + "' is not a user name to make ([a-z_][a-z0-9_-]*, not root)");
  std::string cache = o.cache_dir;
  if (cache.empty()) {
    const char* env = std::getenv("DSEC_DEBIAN_CACHE");
    cache = env && *env ? env : "/var/cache/dsec/debian";
  }
  std::string tree = cache + "/" + DebianCacheName(o);
  struct stat st;
  if (::stat((tree + "/etc/debian_version").c_str(), &st) == 0) {
    if (o.progress) o.progress("using the cached tree " + tree);
    return tree;
  }
  std::string debootstrap = Find("debootstrap");
  if (debootstrap.empty())
    return Status::Unavailable("debootstrap is missing (apt-get install debootstrap)");
  if (::geteuid() != 0) return Status::FailedPrecondition("debootstrap needs root");
  DSEC_RETURN_IF_ERROR(MakeDirs(cache, 0755));
  // Made aside and renamed into place: a tree in the cache is whole.
  std::string tmp = tree + ".tmp." + std::to_string(::getpid());
  std::string log = tmp + ".log";
  std::vector<std::string> argv = {debootstrap, "--variant=" + o.variant};
  if (!o.packages.empty()) {
    std::string inc = "--include=";
    for (size_t i = 0; i < o.packages.size(); ++i) inc += (i ? "," : "") + o.packages[i];
    argv.push_back(inc);
  }
  argv.insert(argv.end(), {o.suite, tmp, o.mirror});
  if (o.progress)
    o.progress("debootstrap " + o.suite + " (" + o.variant + ") from " + o.mirror + " into " + tmp +
               " (a few minutes; its log: " + log + ")");
  int rc = RunToFile(argv, log);
  if (rc != 0) {
    std::string tail = Tail(log, 5);
    RunToFile({"/bin/rm", "-rf", "--one-file-system", tmp}, "/dev/null");
    return Status::Internal("debootstrap " + o.suite + " exited " + std::to_string(rc) + " (log " + log + "):\n" + tail);
  }
  // The users, by the tree's own useradd (chrooted: its passwd, group,
  // shadow and skeleton), and sudo without a password where sudo is.
  for (size_t i = 0; i < o.users.size(); ++i) {
    const std::string& u = o.users[i];
    std::string uid = std::to_string(1000 + i);
    rc = RunToFile({Find("chroot"), tmp, "/usr/sbin/useradd", "--create-home", "--shell", "/bin/bash", "--uid", uid,
                    "--user-group", u},
                   log);
    if (rc == 0 && ::access((tmp + "/etc/sudoers.d").c_str(), F_OK) == 0)
      rc = WriteFileAtomic(tmp + "/etc/sudoers.d/" + u, u + " ALL=(ALL:ALL) NOPASSWD: ALL\n", 0440).ok() ? 0 : 1;
    if (rc != 0) {
      std::string tail = Tail(log, 5);
      RunToFile({"/bin/rm", "-rf", "--one-file-system", tmp}, "/dev/null");
      return Status::Internal("making user " + u + " in the tree failed (log " + log + "):\n" + tail);
    }
  }
  // What an image does not need: the downloaded packages and the lists.
  // (No shell: the cache dir comes from the user.)
  for (const char* sub : {"/var/cache/apt/archives", "/var/lib/apt/lists", "/var/log"})
    RunToFile({"/usr/bin/find", tmp + sub, "-mindepth", "1", "-maxdepth", "1", "-type", "f", "(", "-name", "*.deb",
               "-o", "-name", "*_Packages", "-o", "-name", "*_Release*", "-o", "-name", "*.log", ")", "-delete"},
              "/dev/null");
  RunToFile({"/bin/rm", "-rf", "--one-file-system", tmp + "/debootstrap"}, "/dev/null");
  if (::rename(tmp.c_str(), tree.c_str()) < 0) {
    int err = errno;
    RunToFile({"/bin/rm", "-rf", "--one-file-system", tmp}, "/dev/null");
    // Another build made the same tree meanwhile: that one is as good.
    if (::stat((tree + "/etc/debian_version").c_str(), &st) == 0) return tree;
    return Status::FromErrno(err, "rename " + tmp + " to " + tree);
  }
  ::unlink(log.c_str());
  return tree;
}

}  // namespace dsec::images
