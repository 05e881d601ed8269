// The parts of files.hpp that live in dsec_lowlevel (no spdlog): the
// static spawner and the drivers use them.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/files.hpp"

namespace dsec {

namespace {

// Names in dir but . and .., of directories only when `dirs_only`.
std::vector<std::string> List(const std::string& dir, bool dirs_only) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if ((dirs_only && e->d_type != DT_DIR) || std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0)
      continue;
    out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

}  // namespace

Result<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "read " + path);
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return Status::FromErrno(e, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::vector<std::string> ListSubdirs(const std::string& dir) { return List(dir, true); }

std::vector<std::string> ListEntries(const std::string& dir) {
  auto out = List(dir, false);
  std::sort(out.begin(), out.end());
  return out;
}

std::string SiblingExecutable(const char* env_var, const std::string& name) {
  if (const char* env = ::getenv(env_var); env && *env) return env;
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return name;
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + name;
}

std::set<uint64_t> MountIds(int pid) {
  std::set<uint64_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/mountinfo");
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    uint64_t id;
    if (f >> id) out.insert(id);
  }
  return out;
}

}  // namespace dsec
