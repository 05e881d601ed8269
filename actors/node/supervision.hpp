// Restart intensity (Erlang's MaxR in MaxT): a child may be restarted at most
// `max_restarts` times within `window`; one more failure and it stays down.
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <unordered_map>

namespace dsec {

class RestartIntensity {
 public:
  using Clock = std::chrono::steady_clock;
  RestartIntensity(int max_restarts, Clock::duration window)
      : max_(max_restarts), window_(window) {}

  // Records a failure of `child` at `now`; true when it may be restarted.
  bool Allow(const std::string& child, Clock::time_point now = Clock::now());
  // Restarts of `child` within the current window.
  int Recent(const std::string& child, Clock::time_point now = Clock::now());
  void Forget(const std::string& child) { history_.erase(child); }
  int max_restarts() const { return max_; }
  Clock::duration window() const { return window_; }

 private:
  int max_;
  Clock::duration window_;
  std::unordered_map<std::string, std::deque<Clock::time_point>> history_;
};

}  // namespace dsec
