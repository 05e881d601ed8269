// The start of a conversation on a channel that outlives its host side: a
// virtio-serial port, whose guest end (the agent's fd) stays open while
// dsecd restarts. Bytes of the last conversation may still be in flight on
// either side (a frame cut short when dsecd died), so a new host first
// sends kSyncAsk and an 8-byte nonce; the agent drops whatever it holds,
// skips input up to that marker and answers kSyncAnswer with the same
// nonce; the host skips input up to that answer. Both then speak frames.
// A kSyncAsk where a frame would start starts a new conversation too. The
// length prefix a marker would be read as (1.1 GB) is above any frame's.
// Dependency-free: the static agent includes it.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

namespace dsec::agent {

inline constexpr char kSyncAsk[8] = {'D', 'S', 'E', 'C', 'S', 'Y', 'N', 'C'};
inline constexpr char kSyncAnswer[8] = {'D', 'S', 'E', 'C', 'S', 'Y', 'N', 'A'};
inline constexpr size_t kSyncBytes = 16;  // marker + nonce

// Where `marker` followed by 8 bytes (any, or `nonce` when given) starts in
// `buf`, or npos; buf's tail that could still start one is kept by callers.
inline size_t FindSync(const std::string& buf, const char (&marker)[8], const char* nonce = nullptr) {
  size_t from = 0;
  for (;;) {
    size_t at = buf.find(std::string(marker, 8), from);
    if (at == std::string::npos || buf.size() - at < kSyncBytes) return at == std::string::npos ? at : std::string::npos;
    if (!nonce || std::memcmp(buf.data() + at + 8, nonce, 8) == 0) return at;
    from = at + 1;
  }
}

}  // namespace dsec::agent
