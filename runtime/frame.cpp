#include "runtime/frame.hpp"

#include <errno.h>
#include <unistd.h>

#include <cstring>

namespace dsec {

namespace {
void PutLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
}  // namespace

void AppendFrame(std::string* out, std::string_view payload) {
  char hdr[4];
  PutLe32(hdr, static_cast<uint32_t>(payload.size()));
  out->append(hdr, 4);
  out->append(payload.data(), payload.size());
}

int FrameDecoder::Next(std::string* frame) {
  if (buf_.size() - pos_ < 4) return 0;
  uint32_t len = GetLe32(buf_.data() + pos_);
  if (len > max_) return -1;
  if (buf_.size() - pos_ - 4 < len) return 0;
  frame->assign(buf_.data() + pos_ + 4, len);
  pos_ += 4 + len;
  // Compact once the consumed prefix dominates, so the buffer stays bounded.
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (1u << 16) && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return 1;
}

int WriteFull(int fd, const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

int WriteFrame(int fd, std::string_view payload) {
  std::string buf;
  buf.reserve(payload.size() + 4);
  AppendFrame(&buf, payload);
  return WriteFull(fd, buf.data(), buf.size());
}

int ReadFull(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return got == 0 ? ENODATA : EPIPE;
    got += static_cast<size_t>(r);
  }
  return 0;
}

int ReadFrame(int fd, std::string* payload, uint32_t max_frame) {
  char hdr[4];
  if (int err = ReadFull(fd, hdr, 4)) return err;
  uint32_t len = GetLe32(hdr);
  if (len > max_frame) return EMSGSIZE;
  payload->resize(len);
  if (len == 0) return 0;
  int err = ReadFull(fd, payload->data(), len);
  return err == ENODATA ? EPIPE : err;
}

}  // namespace dsec
