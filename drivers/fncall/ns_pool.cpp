#include "drivers/fncall/ns_pool.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>

namespace dsec::fncall {

int NamespacePool::Acquire(std::string* error) {
  if (!free_.empty()) {
    int n = free_.back();
    free_.pop_back();
    return n;
  }
  if (::unshare(flag_) < 0) {
    *error = std::string("unshare a new ") + name_ + " namespace: " + std::strerror(errno);
    return -1;
  }
  UniqueFd fd(::open((std::string("/proc/self/ns/") + name_).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    *error = std::string("open /proc/self/ns/") + name_ + ": " + std::strerror(errno);
    return -1;
  }
  // Reuse a slot of a dropped namespace before growing.
  for (size_t i = 0; i < fds_.size(); ++i)
    if (!fds_[i]) {
      fds_[i] = std::move(fd);
      return static_cast<int>(i);
    }
  fds_.push_back(std::move(fd));
  return static_cast<int>(fds_.size() - 1);
}

size_t NamespacePool::dropped() const {
  size_t n = 0;
  for (const auto& f : fds_) n += !f;
  return n;
}

namespace {
// Each /proc/sysvipc file is a header line plus one line per object.
bool HeaderOnly(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n <= 0) return false;
  const char* nl = static_cast<const char*>(std::memchr(buf, '\n', static_cast<size_t>(n)));
  return nl && nl == buf + n - 1;
}
}  // namespace

bool IpcNamespaceEmpty(int fd) {
  if (::setns(fd, CLONE_NEWIPC) < 0) return false;
  return HeaderOnly("/proc/sysvipc/msg") && HeaderOnly("/proc/sysvipc/sem") && HeaderOnly("/proc/sysvipc/shm");
}

}  // namespace dsec::fncall
