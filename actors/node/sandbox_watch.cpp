// Directory watches for the sandbox actor (WatchRequest): the driver
// watches (inotify in the sandbox, by its agent); the events go to the
// caller as ExecOutput pieces of its stream id, from this actor, so they
// arrive before the reply. A watch ends when its caller stops it, when the
// caller goes away (monitored: a client that vanished leaves no watch
// behind), at its timeout, or with the sandbox.
#include <algorithm>
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
  Unfollow(self, w.who);
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

void Follow(Self self, const caf::actor& caller) {
  auto& st = self->state;
  if (!st.monitors_set) {
    st.monitors_set = true;
    self->set_down_handler([self](caf::down_msg& dm) {
      auto& st = self->state;
      st.followers.erase(dm.source);
      StopWhere(self, [&](const SandboxState::Watching& w) { return w.who == dm.source; });
      // Its attachments end; the processes run on (a Kill of an attachment detaches it).
      for (const auto& [run_id, who] : st.attachments)
        if (who == dm.source) (void)st.driver->Kill(run_id, "its caller went away");
    });
  }
  if (st.followers[caller.address()]++ == 0) self->monitor(caller);
}

void Unfollow(Self self, const caf::actor_addr& caller) {
  auto& f = self->state.followers;
  auto it = f.find(caller);
  if (it == f.end() || --it->second > 0) return;
  f.erase(it);
  self->demonitor(caller);
}

caf::result<v1::WatchReply> WatchDir(Self self, v1::WatchRequest& req) {
  auto& st = self->state;
  auto sender = self->current_sender();
  auto who = caf::actor_cast<caf::actor_addr>(sender);
  if (req.stop()) {
    uint64_t id = req.stream_id();
    bool found = false;
    for (const auto& [n, w] : st.watches) found = found || (w.who == who && w.stream_id == id);
    if (!found)
      return Answer(Status::NotFound("sandbox " + st.rec.id() + ": no watch of this caller with stream id " +
                                     std::to_string(id) + " (it ended, or another client made it)"),
                    0);
    StopWhere(self, [&](const SandboxState::Watching& w) { return w.who == who && w.stream_id == id; });
    return Answer(Status::Ok(), 0);
  }
  if (!st.driver) return Answer(st.driver_status.Annotate("sandbox " + st.rec.id()), 0);
  if (Status no = NotServing(self, false); !no.ok()) return Answer(no, 0);
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
  Follow(self, to);
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
    if (req.timeout_ms())  // at most 30 days
      self->delayed_send(handle, std::chrono::milliseconds(std::min<uint64_t>(req.timeout_ms(), 30ull * 86400'000)),
                         Continuation{[self, n] {
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
    Unfollow(self, w.who);
    w.rp.deliver(Answer(why, w.events));
  }
}

}  // namespace dsec::sandbox_detail
