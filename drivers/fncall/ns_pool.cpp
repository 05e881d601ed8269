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
  std::vector<UniqueFd> probes;
  if (flag_ == CLONE_NEWIPC)
    for (const char* f : {"/proc/sysvipc/msg", "/proc/sysvipc/sem", "/proc/sysvipc/shm"})
      probes.emplace_back(::open(f, O_RDONLY | O_CLOEXEC));  // bound to the ns we are in now
  // Reuse a slot of a dropped namespace before growing.
  for (size_t i = 0; i < fds_.size(); ++i)
    if (!fds_[i]) {
      fds_[i] = std::move(fd);
      probes_[i] = std::move(probes);
      return static_cast<int>(i);
    }
  fds_.push_back(std::move(fd));
  probes_.push_back(std::move(probes));
  return static_cast<int>(fds_.size() - 1);
}

size_t NamespacePool::dropped() const {
  size_t n = 0;
  for (const auto& f : fds_) n += !f;
  return n;
}

bool NamespacePool::IpcEmpty(int index) const {
  const auto& probes = probes_[static_cast<size_t>(index)];
  if (probes.size() != 3) return false;
  for (const auto& p : probes) {
    // Each file is a header line plus one line per object.
    char buf[4096];
    ssize_t n = p ? ::pread(p.get(), buf, sizeof buf, 0) : -1;
    if (n <= 0) return false;
    const char* nl = static_cast<const char*>(std::memchr(buf, '\n', static_cast<size_t>(n)));
    if (!nl || nl != buf + n - 1) return false;
  }
  return true;
}

}  // namespace dsec::fncall
