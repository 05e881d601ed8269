// What a sandbox uses (UsageRequest): the driver's reading (CPU time,
// memory), its disk, and its CPU share since the previous reading, which
// this actor keeps (not checkpointed). With no previous reading, two are
// taken kUsageWindow apart, so the first answer has a share too.
#include <algorithm>
#include <chrono>

#include "actors/continuation.hpp"
#include "actors/node/sandbox_state.hpp"
#include "drivers/driver.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/clock.hpp"

namespace dsec::sandbox_detail {

namespace {

constexpr std::chrono::milliseconds kUsageWindow{250};

v1::UsageReply Failed(const Status& s) {
  v1::UsageReply r;
  ToProto(s, r.mutable_status());
  return r;
}

// One reading from the driver; `then` on this actor.
void Read(Self self, std::function<void(Result<v1::SandboxUsage>)> then) {
  auto handle = caf::actor_cast<sandbox_actor>(self);
  self->state.driver->Usage(self->state.rec, [handle, then = std::move(then)](Result<v1::SandboxUsage> u) mutable {
    Post(handle, [then = std::move(then), u = std::move(u)]() mutable { then(std::move(u)); });
  });
}

}  // namespace

caf::result<v1::UsageReply> MeasureUsage(Self self, v1::UsageRequest&) {
  auto& st = self->state;
  if (Status no = NotServing(self, /*paused_ok=*/false); !no.ok()) return Failed(no);
  auto rp = self->make_response_promise<v1::UsageReply>();
  uint64_t call = ++st.next_usage_call;
  st.usage_callers.emplace(call, rp);
  auto answer = [self, call](Result<v1::SandboxUsage> u) mutable -> void {
    auto& st = self->state;
    auto waiting = st.usage_callers.find(call);
    if (waiting == st.usage_callers.end()) return;  // answered already (EndUsageCalls)
    auto rp = std::move(waiting->second);
    st.usage_callers.erase(waiting);
    if (!u.ok()) {
      rp.deliver(Failed(u.status().Annotate("sandbox " + st.rec.id())));
      return;
    }
    v1::UsageReply reply;
    v1::SandboxUsage& out = *reply.mutable_usage();
    out = std::move(*u);
    int64_t now = SteadyClockMs();
    // A counter that went back (a VM restored from a snapshot) gives no share.
    if (st.usage_at_ms && now > st.usage_at_ms && out.cpu_ns() >= st.usage_cpu_ns && out.cpu_count()) {
      double busy_ms = static_cast<double>(out.cpu_ns() - st.usage_cpu_ns) / 1e6;
      double pct = 100.0 * busy_ms / (static_cast<double>(now - st.usage_at_ms) * out.cpu_count());
      out.set_cpu_used_pct(std::min(100.0, pct));
    }
    st.usage_at_ms = now;
    st.usage_cpu_ns = out.cpu_ns();
    out.set_at_ms(WallClockMs());
    if (auto disk = st.driver->DiskUsage(st.rec); disk.ok()) out.set_disk_used_bytes(*disk);
    out.set_disk_total_bytes(st.rec.spec().limits().disk_bytes());
    rp.deliver(std::move(reply));
  };
  if (st.usage_at_ms) {
    Read(self, std::move(answer));
    return rp;
  }
  Read(self, [self, answer](Result<v1::SandboxUsage> first) mutable -> void {
    if (!first.ok()) return answer(std::move(first));
    self->state.usage_at_ms = SteadyClockMs();
    self->state.usage_cpu_ns = first->cpu_ns();
    self->delayed_send(caf::actor_cast<sandbox_actor>(self), kUsageWindow, Continuation{[self, answer]() mutable -> void {
                         if (Status no = NotServing(self, false); !no.ok()) return answer(no);
                         Read(self, std::move(answer));
                       }});
  });
  return rp;
}

void EndUsageCalls(Self self, const Status& why) {
  auto callers = std::move(self->state.usage_callers);
  self->state.usage_callers.clear();
  for (auto& [call, rp] : callers) rp.deliver(Failed(why));
}

}  // namespace dsec::sandbox_detail
