#include "drivers/spawner/ns_pool.hpp"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace dsec::fncall {

int NamespacePool::Acquire(std::string* error) {
  if (!free_.empty()) {
    int n = free_.back();
    free_.pop_back();
    return n;
  }
  return Make(error);
}

int NamespacePool::Make(std::string* error) {
  if (::unshare(flag_) < 0) {
    *error = std::string("unshare a new ") + name_ + " namespace: " + std::strerror(errno);
    return -1;
  }
  UniqueFd fd(::open((std::string("/proc/self/ns/") + name_).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    *error = std::string("open /proc/self/ns/") + name_ + ": " + std::strerror(errno);
    return -1;
  }
  if (flag_ == CLONE_NEWNET && loopback_up_) {
    // We are in it now: the socket and the ioctl act on its `lo`.
    UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, "lo");
    if (!sock || ::ioctl(sock.get(), SIOCGIFFLAGS, &ifr) < 0 ||
        (ifr.ifr_flags |= IFF_UP, ::ioctl(sock.get(), SIOCSIFFLAGS, &ifr) < 0)) {
      *error = std::string("bring up the loopback of a new net namespace: ") + std::strerror(errno);
      return -1;
    }
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

namespace {

// /proc/sysvipc/*: a header line plus one line per object.
bool HeaderOnly(int fd) {
  char buf[4096];
  ssize_t n = fd >= 0 ? ::pread(fd, buf, sizeof buf, 0) : -1;
  if (n <= 0) return false;
  const char* nl = static_cast<const char*>(std::memchr(buf, '\n', static_cast<size_t>(n)));
  return nl && nl == buf + n - 1;
}

}  // namespace

bool NamespacePool::IpcEmpty(int index) const {
  const auto& probes = probes_[static_cast<size_t>(index)];
  if (probes.size() != 3) return false;
  for (const auto& p : probes)
    if (!HeaderOnly(p.get())) return false;
  return true;
}

bool NamespacePool::NetEmpty(int index) const {
  // /proc/self/net/* shows the namespace the reader is in: enter it (keeping
  // files open per namespace in use would cost thousands of descriptors on
  // a dense node). sockstat's counters are per namespace and cheap to read;
  // /proc/net/tcp would walk the host-wide TCP hash table on every read.
  const UniqueFd& ns = fds_[static_cast<size_t>(index)];
  if (!ns || ::setns(ns.get(), CLONE_NEWNET) < 0) return false;
  char buf[1024];
  auto read_file = [&buf](const char* path) -> bool {
    UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
    ssize_t n = fd ? ::read(fd.get(), buf, sizeof buf - 1) : -1;
    if (n <= 0) return false;
    buf[n] = 0;
    return true;
  };
  // The number after `key` is 0.
  auto zero_after = [&buf](const char* key) {
    const char* p = std::strstr(buf, key);
    if (!p) return false;
    p += std::strlen(key);
    return p[0] == '0' && (p[1] < '0' || p[1] > '9');
  };
  // "sockets: used N" counts every socket of the namespace (a unix socket
  // kept alive by a descriptor-passing cycle, a UDP port, netlink); TIME_WAIT
  // ones are not sockets there, "tw" counts them (IPv6 ones too).
  if (!read_file("/proc/self/net/sockstat") || !zero_after("sockets: used ") || !zero_after("TCP: inuse ") ||
      !zero_after(" tw "))
    return false;
  // No sockstat6: IPv6 is off in this kernel, nothing to check there.
  if (read_file("/proc/self/net/sockstat6")) return zero_after("TCP6: inuse ");
  return errno == ENOENT;
}

}  // namespace dsec::fncall
