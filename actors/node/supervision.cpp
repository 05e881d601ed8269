#include "actors/node/supervision.hpp"

namespace dsec {

int RestartIntensity::Recent(const std::string& child, Clock::time_point now) {
  auto it = history_.find(child);
  if (it == history_.end()) return 0;
  auto& h = it->second;
  while (!h.empty() && h.front() <= now - window_) h.pop_front();
  return static_cast<int>(h.size());
}

bool RestartIntensity::Allow(const std::string& child, Clock::time_point now) {
  int recent = Recent(child, now);
  if (recent >= max_) return false;
  history_[child].push_back(now);
  return true;
}

}  // namespace dsec
