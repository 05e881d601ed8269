#include "actors/node/lifetime.hpp"

namespace dsec {

SandboxEnd NextEnd(const v1::SandboxRecord& r, bool busy) {
  SandboxEnd e;
  auto consider = [&e](int64_t at, const char* because, const char* action) {
    if (at > 0 && (e.at_ms == 0 || at < e.at_ms)) e = SandboxEnd{at, because, action};
  };
  if (r.phase() == v1::SANDBOX_PHASE_PENDING || r.phase() == v1::SANDBOX_PHASE_STARTING ||
      r.phase() == v1::SANDBOX_PHASE_STOPPING || r.phase() == v1::SANDBOX_PHASE_STOPPED)
    return e;
  // A ttl that pauses (on_ttl) does nothing to a paused sandbox.
  bool ttl_pauses = r.spec().on_ttl() == v1::IDLE_ACTION_PAUSE;
  if (!(ttl_pauses && r.phase() == v1::SANDBOX_PHASE_PAUSED))
    consider(r.ttl_deadline_ms(), "ttl", ttl_pauses ? "pause" : "destroy");
  if (!r.owner().empty() && r.owner_gone_ms() > 0 && r.lease_s() > 0)
    consider(r.owner_gone_ms() + int64_t{r.lease_s()} * 1000, "owner gone", "destroy");
  // Idle: running, with nothing in flight (a paused sandbox is paused, not idle).
  if (r.phase() == v1::SANDBOX_PHASE_RUNNING && r.spec().idle_timeout_s() > 0 && !busy)
    consider(r.last_active_ms() + int64_t{r.spec().idle_timeout_s()} * 1000, "idle timeout",
             r.spec().on_idle() == v1::IDLE_ACTION_DESTROY ? "destroy" : "pause");
  return e;
}

void ShowEnd(v1::SandboxRecord* r, const std::unordered_map<std::string, int64_t>& gone_since) {
  auto g = gone_since.find(r->owner());
  r->set_owner_gone_ms(!r->owner().empty() && g != gone_since.end() ? g->second : 0);
  auto end = NextEnd(*r, false);
  r->set_expires_ms(end.at_ms);
  r->set_expires_because(end.because);
  r->set_expiry_action(end.action);
}

}  // namespace dsec
