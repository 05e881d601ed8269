// Work spread over threads, for tests that load a daemon with many calls.
#pragma once

#include <atomic>
#include <thread>
#include <vector>

namespace dsec::testing {

// Runs fn(i) for i in [0, n) on `threads` threads.
template <class F>
inline void Parallel(int n, int threads, F fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& t : ts) t.join();
}

}  // namespace dsec::testing
