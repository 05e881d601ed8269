#include "dsec/report.hpp"

namespace dsec {

Result<std::vector<StepFlag>> Report(const Session& session) {
  std::vector<StepFlag> out;
  constexpr uint32_t kPage = 1000;
  for (uint64_t from = 0;;) {
    auto page = session.Steps(from, kPage);
    if (!page.ok()) return page.status();
    for (const auto& step : page->steps())
      for (const auto& f : step.flags()) out.push_back({step.index(), f});
    if (page->steps_size() < static_cast<int>(kPage)) break;
    from = page->steps(page->steps_size() - 1).index() + 1;
  }
  return out;
}

}  // namespace dsec
