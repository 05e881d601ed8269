// What dsec-lazyfs and dsecd's LazyImages say over their Unix socket
// (<data>/run/lazy.sock): one request, one reply, both fixed headers in
// host order (one host, one build), each followed by its bytes. No CAF, no
// protobuf: dsec-lazyfs is a small process of its own.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace dsec::images::lazywire {

enum Op : uint8_t {
  kStat = 'S',  // name -> size (ENOENT: no such image)
  kRead = 'R',  // name, offset, length -> bytes (fewer only at the end)
  kList = 'L',  // -> names, '\n'-separated
};
inline constexpr uint32_t kMaxName = 255;
inline constexpr uint32_t kMaxRead = 4 << 20;
inline constexpr uint32_t kMaxList = 1 << 20;

struct __attribute__((packed)) Request {
  uint8_t op = 0;
  uint32_t name_len = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};
struct __attribute__((packed)) Reply {
  int32_t err = 0;  // 0, or an errno the FUSE call returns
  uint64_t size = 0;
  uint32_t data_len = 0;
};

// Whole reads and writes on the socket; false when it closed or failed.
inline bool ReadFull(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
inline bool WriteFull(int fd, const void* p, size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace dsec::images::lazywire
