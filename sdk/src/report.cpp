#include "dsec/report.hpp"

#include "sdk/src/client_impl.hpp"

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

namespace dsec {

void GradeAsync(const Session& session, uint64_t index, Done<v1::StepReply> done) {
  v1::GradeRequest req;
  req.set_session(session.name());
  req.set_index(index);
  const v1::SessionRecord& rec = session.record();
  uint32_t t = rec.grade().timeout_s() ? rec.grade().timeout_s() : 600;
  // Its sandbox is made (the agent's changes copied) before the command runs.
  auto timeout = std::chrono::seconds(t) + std::chrono::seconds(120);
  session.client_->impl_->CallVia<v1::StepReply>(rec.node_address(), std::move(req), timeout, std::move(done));
}

Result<v1::StepReply> Grade(const Session& session, uint64_t index) {
  return Wait<v1::StepReply>([&](Done<v1::StepReply> d) { GradeAsync(session, index, std::move(d)); });
}

}  // namespace dsec
