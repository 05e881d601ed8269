// Directory watches for the sandbox actor (WatchRequest): the driver
// watches (inotify in the sandbox, by its agent); the events go to the
// caller as ExecOutput pieces of its stream id, from this actor, so they
// arrive before the reply. A watch ends when its caller stops it, when the
// caller goes away (monitored: a client that vanished leaves no watch
// behind), at its timeout, or with the sandbox.
#include <chrono>

#include "actors/continuation.hpp"
#include "actors/node/sandbox_state.hpp"
#include "drivers/driver.hpp"
#include "dsec/status_proto.hpp"
#include "wire/wire.hpp"

namespace dsec::sandbox_detail {

namespace {

v1::WatchReply Answer(const Status& s, uint64_t events) {
  v1::WatchReply r;
  ToProto(s, r.mutable_status());
  r.set_events(events);
  return r;
}

// The watch `n` ended (its driver said how): answered, forgotten.
void Ended(Self self, uint64_t n, const Status& s) {
  auto& st = self->state;
  auto it = st.watches.find(n);
  if (it == st.watches.end()) return;  // answered already (stopped with the sandbox)
  auto w = std::move(it->second);
  st.watches.erase(it);
  w.rp.deliver(Answer(s.Annotate("sandbox " + st.rec.id() + ": watch"), w.events));
}

// Stops the watches `which` selects; their answers come when the driver ends them.
template <class Which>
void StopWhere(Self self, Which which) {
  for (auto& [n, w] : self->state.watches)
    if (which(w) && w.stop) {
      auto stop = std::move(w.stop);
      w.stop = nullptr;
      stop();
    }
}

}  // namespace

caf::result<v1::WatchReply> WatchDir(Self self, v1::WatchRequest& req) {
  auto& st = self->state;
  auto sender = self->current_sender();
  auto who = caf::actor_cast<caf::actor_addr>(sender);
  if (req.stop()) {
    uint64_t id = req.stream_id();
    StopWhere(self, [&](const SandboxState::Watching& w) { return w.who == who && w.stream_id == id; });
    return Answer(Status::Ok(), 0);
  }
  if (!st.driver) return Answer(st.driver_status.Annotate("sandbox " + st.rec.id()), 0);
  if (Status no = NotServing(self, true); !no.ok()) return Answer(no, 0);
  if (Status p = drivers::CheckSandboxPath(req.path()); !p.ok())
    return Answer(p.Annotate("sandbox " + st.rec.id() + ": watch"), 0);
  if (!who) return Answer(Status::InvalidArgument("a watch needs a caller to send its events to"), 0);
  auto to = caf::actor_cast<caf::actor>(sender);
  auto rp = self->make_response_promise<v1::WatchReply>();
  uint64_t n = ++st.next_watch;
  uint64_t stream_id = req.stream_id();
  auto& w = st.watches[n];
  w.who = who;
  w.stream_id = stream_id;
  w.rp = rp;
  if (!st.monitors_set) {
    st.monitors_set = true;
    self->set_down_handler([self](caf::down_msg& dm) {
      StopWhere(self, [&](const SandboxState::Watching& w) { return w.who == dm.source; });
    });
  }
  self->monitor(to);
  Touch(self);
  auto handle = caf::actor_cast<sandbox_actor>(self);
  auto stop = st.driver->Watch(
      st.rec, req,
      [handle, self, n, to, stream_id](const v1::ExecOutput& piece) {
        Post(handle, [self, n, to, stream_id, piece = v1::ExecOutput(piece)]() mutable {
          auto it = self->state.watches.find(n);
          if (it == self->state.watches.end()) return;
          it->second.events += static_cast<uint64_t>(piece.events_size());
          piece.set_stream_id(stream_id);
          caf::anon_send(to, std::move(piece));
        });
      },
      [handle, self, n](const Status& s) { Post(handle, [self, n, s] { Ended(self, n, s); }); });
  // The driver may have answered already (then `n` is gone).
  if (auto it = st.watches.find(n); it != st.watches.end()) {
    it->second.stop = std::move(stop);
    if (req.timeout_ms())
      self->delayed_send(handle, std::chrono::milliseconds(req.timeout_ms()), Continuation{[self, n] {
                           auto it = self->state.watches.find(n);
                           if (it == self->state.watches.end() || !it->second.stop) return;
                           auto stop = std::move(it->second.stop);
                           it->second.stop = nullptr;
                           stop();
                         }});
  }
  return rp;
}

void EndWatches(Self self, const Status& why) {
  auto& st = self->state;
  auto watches = std::move(st.watches);
  st.watches.clear();
  for (auto& [n, w] : watches) {
    if (w.stop) w.stop();
    w.rp.deliver(Answer(why, w.events));
  }
}

}  // namespace dsec::sandbox_detail
