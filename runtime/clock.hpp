// Clocks, each named for what it reads. Records, deadlines kept across
// restarts and what users see read the wall clock; durations and deadlines
// within one process read the steady one (it never jumps).
#pragma once

#include <chrono>
#include <cstdint>

namespace dsec {

// Milliseconds since the unix epoch (system_clock).
inline int64_t WallClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Milliseconds of steady_clock: only differences mean anything.
inline int64_t SteadyClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace dsec
