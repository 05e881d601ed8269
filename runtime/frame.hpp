// Length-prefixed framing (4-byte little-endian length, then the payload) for
// the unix-socket protocols between dsecd and its helpers. Dependency-free
// (errno results, no Status) so the static dsec-spawner links it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsec {

// Largest frame any dsec protocol accepts (64 MiB); a bigger length prefix is
// treated as a corrupt or hostile peer.
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

// Appends one frame holding `payload` to `out`.
void AppendFrame(std::string* out, std::string_view payload);

// Incremental decoder for non-blocking readers: Feed bytes, then take frames.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame = kMaxFrameBytes) : max_(max_frame) {}
  void Feed(const char* data, size_t n) { buf_.append(data, n); }
  // 1: a frame was moved into *frame; 0: need more bytes; -1: the peer sent a
  // length above the maximum (the stream is unusable).
  int Next(std::string* frame);
  size_t buffered() const { return buf_.size() - pos_; }
  // True when the bytes not yet taken start with `prefix`.
  bool StartsWith(std::string_view prefix) const {
    return buffered() >= prefix.size() && std::string_view(buf_).substr(pos_, prefix.size()) == prefix;
  }
  // The bytes not yet taken, left in place.
  std::string_view Pending() const { return std::string_view(buf_).substr(pos_); }
  // The bytes not yet taken; the decoder is empty after.
  std::string TakeRest() {
    std::string rest = buf_.substr(pos_);
    buf_.clear();
    pos_ = 0;
    return rest;
  }

 private:
  std::string buf_;
  size_t pos_ = 0;
  uint32_t max_;
};

// Blocking helpers. Return 0 on success, else an errno value; ReadFrame
// returns ENODATA on a clean EOF before the first byte of a frame and
// EMSGSIZE on an oversized length.
int WriteFull(int fd, const void* data, size_t n);
int WriteFrame(int fd, std::string_view payload);
int ReadFull(int fd, void* data, size_t n);
int ReadFrame(int fd, std::string* payload, uint32_t max_frame = kMaxFrameBytes);

}  // namespace dsec
