// What cluster tests ask of a controller, and how they wait for another
// process's state to change.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "harness/daemon.hpp"

namespace dsec::testing {

// Polls `pred` (an admin query, a file) every 50 ms until it holds or
// `timeout` passes: the condition is another process's state.
template <class Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

// Node `id`'s state as controller `c` sees it ("" when unknown).
inline std::string StateOf(const TestDaemon& c, const std::string& id) {
  for (const auto& node : c.Admin("nodes").value("nodes", nlohmann::json::array()))
    if (node.value("id", "") == id) return node.value("state", "");
  return "";
}

}  // namespace dsec::testing
