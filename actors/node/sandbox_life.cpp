// The sandbox actor's life (see sandbox_state.hpp): checkpoints, pause and
// resume, destroy, and when it ends by itself (its ttl, its idle timeout,
// its owner gone), the timer that acts on it and the activity that moves
// it.
#include <algorithm>
#include <chrono>

#include "actors/node/sandbox_state.hpp"
#include "dsec/status_proto.hpp"
#include "dsec/store/v1/records.pb.h"
#include "state/group_commit.hpp"
#include "state/table.hpp"

namespace dsec::sandbox_detail {

void CountPhase(SandboxState& st) { st.phase_gauge.Set(KindName(st.rec.spec().kind()), PhaseName(st.rec.phase())); }

using End = SandboxEnd;

// The next end of the sandbox as its record and its calls in flight stand.
End NextEnd(const SandboxState& st) {
  if (st.destroying || st.pausing) return End{};
  bool busy = !st.running.empty() || !st.file_callers.empty();
  End e = ::dsec::NextEnd(st.rec, busy);
  if (st.idle_retry_ms && std::string(e.because) == "idle timeout" && e.at_ms < st.idle_retry_ms) {
    // After a failed automatic pause: the other ends, or the retry.
    End other = ::dsec::NextEnd(st.rec, true);
    e = other.at_ms && other.at_ms < st.idle_retry_ms ? other : End{st.idle_retry_ms, e.because, e.action};
  }
  // A destroy that failed: the sandbox's only end is trying it again.
  if (st.end_retry_ms) return End{st.end_retry_ms, "destroy retry", "destroy"};
  return e;
}

constexpr int64_t kMaxTimerWait = 300'000;

void ArmExpiry(Self self);
void Touch(Self self);

std::string paused_reason(v1::SandboxPhase phase, const std::string& why) {
  return phase == v1::SANDBOX_PHASE_PAUSED ? why : std::string();
}

// The record as shown: with its next end filled in.
v1::SandboxRecord Shown(const SandboxState& st) {
  v1::SandboxRecord r = st.rec;
  End e = NextEnd(st);
  r.set_expires_ms(e.at_ms);
  r.set_expires_because(e.because);
  r.set_expiry_action(e.action);
  return r;
}

v1::SandboxReply Reply(const Status& status, const SandboxState& st) {
  v1::SandboxReply r;
  ToProto(status, r.mutable_status());
  *r.mutable_sandbox() = Shown(st);
  return r;
}

// The sandbox's row in the store, from `rec` (the record as it stands, or
// a variant of it).
void PutRow(const SandboxState& st, const v1::SandboxRecord& rec, state::WriteBatch* b) {
  store::v1::SandboxRow row;
  *row.mutable_record() = rec;
  row.set_driver_state(st.driver_state);
  state::TypedTable<store::v1::SandboxRow>(st.ctx->store, state::Table::kSandboxes).Put(b, rec.id(), row);
}

// The record as a get shows it: with its disk use (one ioctl on the quota
// tree: cheap enough to read on every look) and its network (one nft
// list of its counter).
v1::SandboxReply Looked(const SandboxState& st) {
  auto reply = Reply(Status::Ok(), st);
  bool up = st.rec.phase() == v1::SANDBOX_PHASE_RUNNING || st.rec.phase() == v1::SANDBOX_PHASE_PAUSED;
  if (st.driver && up) {
    if (auto used = st.driver->DiskUsage(st.rec); used.ok()) reply.mutable_sandbox()->set_disk_used_bytes(*used);
    if (auto net = st.driver->Network(st.rec); net.ok()) *reply.mutable_sandbox()->mutable_network() = std::move(*net);
  }
  return reply;
}

// Checkpoints the record, then runs `then` on the actor with the outcome.
void Checkpoint(Self self, std::function<void(const Status&)> then) {
  auto& st = self->state;
  st.rec.set_updated_ms(WallClockMs());
  CountPhase(st);
  state::WriteBatch b;
  PutRow(st, st.rec, &b);
  auto handle = caf::actor_cast<sandbox_actor>(self);
  st.ctx->committer->Submit(std::move(b), [handle, then](const Status& s) {
    Post(handle, [then, s] { then(s); });
  });
}

// Why the sandbox cannot take an operation now, or Ok.
Status NotServing(Self self, bool paused_ok) {
  auto& st = self->state;
  if (!st.driver) return st.driver_status.Annotate("sandbox " + st.rec.id());
  bool ok = st.rec.phase() == v1::SANDBOX_PHASE_RUNNING || (paused_ok && st.rec.phase() == v1::SANDBOX_PHASE_PAUSED);
  if (ok && st.pausing)
    return Status::Unavailable("sandbox " + st.rec.id() + " is being paused or resumed; try again in a moment");
  if (ok && !st.destroying) return Status::Ok();
  std::string hint = st.rec.phase() != v1::SANDBOX_PHASE_PAUSED ? ""
                     : st.rec.pause_reason().empty()        ? " (resume it first)"
                                                            : " (" + st.rec.pause_reason() + "; resume it first)";
  return Status::FailedPrecondition("sandbox " + st.rec.id() + " is " + PhaseName(st.rec.phase()) + ", not running" +
                                    hint);
}

// A file call: checks the path and the phase, runs `call` on the driver and
// answers on this actor.
caf::result<v1::FileReply> FileOp(Self self, const std::string& path,
                                  std::function<void(Self, drivers::FileCallback)> call) {
  auto fail = [](const Status& s) {
    v1::FileReply r;
    ToProto(s, r.mutable_status());
    return r;
  };
  Status ok = NotServing(self, false);
  if (ok.ok()) ok = drivers::CheckSandboxPath(path).Annotate("sandbox " + self->state.rec.id());
  if (!ok.ok()) return fail(ok);
  auto rp = self->make_response_promise<v1::FileReply>();
  auto handle = caf::actor_cast<sandbox_actor>(self);
  uint64_t call_id = ++self->state.next_file_call;
  self->state.file_callers.emplace(call_id, rp);
  Touch(self);
  call(self, [handle, self, rp, path, fail, call_id](Result<v1::FileReply> r) mutable {
    Post(handle, [self, rp, path, fail, call_id, r = std::move(r)]() mutable {
      self->state.file_callers.erase(call_id);
      Touch(self);
      if (r.ok()) rp.deliver(std::move(*r));
      else rp.deliver(fail(r.status().Annotate("sandbox " + self->state.rec.id())));
    });
  });
  return rp;
}

// Pause (freeze; with `memory`, its memory freed too) or resume; the phase
// change is checkpointed before `done` gets the outcome. `why`: the pause
// reason for the record ("" for a user's).
void DoPause(Self self, bool paused, std::string why, bool memory, std::function<void(const Status&)> done) {
  auto& st = self->state;
  auto want = paused ? v1::SANDBOX_PHASE_PAUSED : v1::SANDBOX_PHASE_RUNNING;
  auto handle = caf::actor_cast<sandbox_actor>(self);
  st.pausing = true;
  auto answered = [handle, self, want, why, memory, done](const Status& s) mutable {
    Post(handle, [self, want, why, memory, done, s]() mutable {
      auto& st = self->state;
      st.pausing = false;
      // A destroy came meanwhile: it goes on now; the phase is its.
      if (st.destroying) {
        st.after_pause_lost = nullptr;  // the destroy removes what is left
        done(Status::FailedPrecondition("sandbox " + st.rec.id() + " was destroyed meanwhile"));
        if (auto next = std::move(st.after_pause)) {
          st.after_pause = nullptr;
          next();
        }
        return;
      }
      // It ended by itself meanwhile: failed (the lost report said why),
      // not paused or running; what is left of it goes now.
      if (auto remove = std::move(st.after_pause_lost)) {
        st.after_pause_lost = nullptr;
        done(Status::Unavailable("sandbox " + st.rec.id() + " failed meanwhile: " + st.rec.error()));
        return remove();
      }
      if (!s.ok()) {
        done(s.Annotate("sandbox " + st.rec.id()));
        return ArmExpiry(self);
      }
      st.rec.set_phase(want);
      st.rec.set_pause_reason(paused_reason(want, why));
      st.rec.set_paused_memory(want == v1::SANDBOX_PHASE_PAUSED && (memory || st.rec.paused_memory()));
      // A resumed sandbox starts a new idle period; one whose ttl pauses
      // it (on_ttl) and ran out, a new ttl. Paused by it, it has none.
      const int64_t now = WallClockMs();
      const bool ttl_pauses = st.rec.spec().on_ttl() == v1::IDLE_ACTION_PAUSE;
      const bool ttl_over = st.rec.ttl_deadline_ms() > 0 && st.rec.ttl_deadline_ms() <= now;
      if (want == v1::SANDBOX_PHASE_RUNNING) {
        st.rec.set_last_active_ms(now);
        if (ttl_pauses && (st.rec.ttl_deadline_ms() == 0 || ttl_over) && st.rec.spec().ttl_s() > 0)
          st.rec.set_ttl_deadline_ms(now + int64_t{st.rec.spec().ttl_s()} * 1000);
      } else if (ttl_pauses && ttl_over) {
        st.rec.set_ttl_deadline_ms(0);
      }
      Checkpoint(self, [self, done](const Status& w) mutable {
        done(w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint"));
        ArmExpiry(self);
      });
    });
  };
  if (paused && memory) st.driver->PauseMemory(st.rec, std::move(answered));
  else st.driver->Pause(st.rec, paused, std::move(answered));
}

bool WantsWake(Self self) {
  auto& st = self->state;
  if (!st.driver || st.destroying || !st.rec.spec().resume_on_call()) return false;
  return st.waking || (st.rec.phase() == v1::SANDBOX_PHASE_PAUSED && !st.pausing);
}

void Wake(Self self, std::function<void(const Status&)> then) {
  auto& st = self->state;
  st.wakers.push_back(std::move(then));
  if (st.waking) return;
  st.waking = true;
  st.ctx->log->info("sandbox {}: a call resumes it (resume_on_call){}", st.rec.id(),
                    st.rec.paused_memory() ? ", from its memory on disk" : "");
  DoPause(self, false, "", false, [self](const Status& s) {
    auto& st = self->state;
    st.waking = false;
    if (!s.ok()) st.ctx->log->warn("sandbox {}: resume for a call: {}", st.rec.id(), s.message());
    auto waiting = std::move(st.wakers);
    st.wakers.clear();
    for (auto& w : waiting) w(s);
  });
}

caf::result<v1::SandboxReply> SetPaused(Self self, bool paused, bool memory) {
  auto& st = self->state;
  auto want = paused ? v1::SANDBOX_PHASE_PAUSED : v1::SANDBOX_PHASE_RUNNING;
  // Pausing a paused sandbox is a no-op (unless its memory is to go now);
  // resuming a running one still asks the driver, so a kind without pause
  // says so.
  if (paused && st.rec.phase() == want && (!memory || st.rec.paused_memory()) && !st.destroying)
    return Reply(Status::Ok(), st);
  Status ok = NotServing(self, true);
  if (!ok.ok()) return Reply(ok, st);
  // Execs running are paused with it (E2B's pause freezes running
  // commands too): a frozen one's output waits; a VM paused with memory
  // loses its agent's connection, so their calls end (Unavailable) while
  // their processes run on after the resume, to attach to by pid.
  auto rp = self->make_response_promise<v1::SandboxReply>();
  DoPause(self, paused, "", memory, [self, rp](const Status& s) mutable { rp.deliver(Reply(s, self->state)); });
  return rp;
}

// Destroys the sandbox: execs in flight are stopped and answered (as
// killed) first, so nobody is left waiting on a reply that never comes;
// the row goes; `why` goes to the node; the actor quits after `done`.
// When the driver cannot remove it, the row stays (failed, saying why) and
// so does the actor, for a destroy again.
void StartDestroy(Self self, std::string why, std::function<void(const Status&)> done) {
  auto& st = self->state;
  st.destroying = true;
  const bool paused = st.rec.phase() == v1::SANDBOX_PHASE_PAUSED || st.pausing;  // its execs may be frozen
  st.rec.set_phase(v1::SANDBOX_PHASE_STOPPING);
  EndWatches(self, Status::Unavailable("sandbox " + st.rec.id() + " is being destroyed; its watches end"));
  auto handle = caf::actor_cast<sandbox_actor>(self);
  st.after_runs = [self, handle, why, done]() mutable {
    self->state.driver->Destroy(self->state.rec, self->state.driver_state, [handle, self, why, done](const Status& s) mutable {
      Post(handle, [self, why, done, s]() mutable {
        auto& st = self->state;
        if (!s.ok()) {
          // What the driver could not remove is still there: the record
          // stays (failed, saying so) for a destroy again, and an automatic
          // end tries again in a minute.
          st.destroying = false;
          st.rec.set_phase(v1::SANDBOX_PHASE_FAILED);
          st.rec.set_error("destroy failed: " + s.message() + "; destroy it again");
          st.end_retry_ms = WallClockMs() + 60'000;
          st.ctx->log->warn("sandbox {}: {}", st.rec.id(), st.rec.error());
          Checkpoint(self, [self, done, s](const Status& w) mutable {
            if (!w.ok()) self->state.ctx->log->error("sandbox {}: checkpoint: {}", self->state.rec.id(), w.message());
            done(s.Annotate("sandbox " + self->state.rec.id() + ": destroy"));
            ArmExpiry(self);
          });
          return;
        }
        st.rec.set_phase(v1::SANDBOX_PHASE_STOPPED);
        // A stopped sandbox leaves no row behind.
        state::WriteBatch b;
        b.Delete(state::Table::kSandboxes, st.rec.id());
        st.ctx->committer->Submit(std::move(b), [handle = caf::actor_cast<sandbox_actor>(self), self, why,
                                                 done](const Status& w) mutable {
          Post(handle, [self, why, done, w]() mutable {
            if (self->state.gone) self->state.gone(why);
            EndUsageCalls(self, Status::FailedPrecondition("sandbox " + self->state.rec.id() + " was destroyed"));
            done(w);
            self->quit();
          });
        });
      });
    });
  };
  auto go = [self, why, paused] {
    auto& st = self->state;
    // A run that ended meanwhile is NotFound: its answer is on its way.
    for (const auto& id : st.running) (void)st.driver->Kill(id, "sandbox " + st.rec.id() + " was destroyed (" + why + ")");
    // A paused sandbox's execs cannot end (frozen): the driver's destroy
    // ends them, and their calls are answered.
    if (st.running.empty() || paused) {
      auto next = std::move(st.after_runs);
      st.after_runs = nullptr;
      next();
    }
  };
  // A pause with the driver finishes first (its freeze must not land on
  // the container being removed), and so do snapshots being taken (whole
  // before the destroy, and answered).
  auto after_pause = [self, go] {
    if (self->state.snapshotting > 0) self->state.after_snapshots = go;
    else go();
  };
  if (st.pausing) st.after_pause = after_pause;
  else after_pause();
}

// The sandbox ends as its deadline says (NextEnd), now.
void Expire(Self self) {
  auto& st = self->state;
  End e = NextEnd(st);
  int64_t now = WallClockMs();
  if (e.at_ms == 0) return;
  if (e.at_ms > now) return ArmExpiry(self);
  std::string why;
  if (std::string(e.because) == "destroy retry") why = "a destroy that failed, tried again";
  else if (std::string(e.because) == "ttl") why = "its ttl of " + std::to_string(st.rec.spec().ttl_s()) + " s ran out";
  else if (std::string(e.because) == "owner gone")
    why = "its owner (SDK client " + st.rec.owner() + ") was gone for its lease of " + std::to_string(st.rec.lease_s()) + " s";
  else why = "idle for " + std::to_string(st.rec.spec().idle_timeout_s()) + " s (its idle timeout)";
  bool pause = std::string(e.action) == "pause";
  st.ctx->log->info("sandbox {}: {}; {}", st.rec.id(), why, pause ? "pausing it" : "destroying it");
  if (!st.driver) return;  // its kind is not here: nothing to stop (the record stays for a later start)
  if (pause && std::string(e.because) == "ttl") {
    // Paused with memory where the kind can (it may stay paused long),
    // else frozen; when neither works, it runs on and is tried again in a
    // minute (never destroyed for it).
    bool memory = drivers::Require(*st.driver, drivers::Capability::kPauseMemory).ok();
    auto again = [self](const Status& s) {
      if (s.ok() || self->state.destroying) return;
      auto& st = self->state;
      st.ctx->log->warn("sandbox {}: pause at its ttl's end: {}; trying again in a minute", st.rec.id(), s.message());
      st.rec.set_ttl_deadline_ms(WallClockMs() + 60'000);
      ArmExpiry(self);
    };
    DoPause(self, true, "paused: " + why, memory, [self, why, memory, again](const Status& s) {
      if (s.ok() || !memory || self->state.destroying) return again(s);
      self->state.ctx->log->warn("sandbox {}: pause with memory at its ttl's end: {}; frozen instead",
                                 self->state.rec.id(), s.message());
      DoPause(self, true, "paused: " + why, false, again);
    });
    return;
  }
  if (pause) {
    DoPause(self, true, "paused: " + why, false, [self](const Status& s) {
      if (s.ok()) return;
      auto& st = self->state;
      st.ctx->log->warn("sandbox {}: pause after idling: {}; trying again in a minute", st.rec.id(), s.message());
      st.idle_retry_ms = WallClockMs() + 60'000;
    });
    return;
  }
  StartDestroy(self, "destroyed: " + why, [self](const Status& s) {
    if (!s.ok()) self->state.ctx->log->warn("sandbox {}: destroy at its end: {}", self->state.rec.id(), s.message());
  });
}

// Arms the timer for the next end (one at a time: a newer one supersedes).
void ArmExpiry(Self self) {
  auto& st = self->state;
  if (st.readopting) return;  // armed once it is done
  End e = NextEnd(st);
  if (e.at_ms == 0) return;
  int64_t now = WallClockMs();
  int64_t at = std::min(e.at_ms, now + kMaxTimerWait);
  // One armed timer that fires no later than needed is enough.
  if (st.armed_at_ms && st.armed_at_ms <= at) return;
  st.armed_at_ms = at;
  self->delayed_send(caf::actor_cast<sandbox_actor>(self), std::chrono::milliseconds(std::max<int64_t>(0, at - now)),
                     Continuation{[self, at] {
                       auto& st = self->state;
                       if (st.armed_at_ms != at) return;  // a later-sent, earlier timer is the armed one
                       st.armed_at_ms = 0;
                       Expire(self);
                     }});
}

// Stores the last activity a second ahead (so a restart after a crash
// never ends an idle period early) and whether a call runs (`busy`: then a
// restart counts the sandbox as active from the restart on, since the call
// may still be running in the sandbox).
void WriteActivity(Self self, bool busy) {
  auto& st = self->state;
  int64_t now = WallClockMs();
  st.active_written_until = now + 1000;
  st.busy_written = busy;
  v1::SandboxRecord ahead = st.rec;
  ahead.set_last_active_ms(st.active_written_until);
  ahead.set_busy(busy);
  ahead.set_updated_ms(now);
  state::WriteBatch b;
  PutRow(st, ahead, &b);
  st.ctx->committer->Submit(std::move(b), [](const Status&) {});
}

// An exec or file call starts or ends: a new idle period. At most one
// write a second, plus one when a call that ran longer than a second ends.
void Touch(Self self) {
  auto& st = self->state;
  int64_t now = WallClockMs();
  st.rec.set_last_active_ms(now);
  st.idle_retry_ms = 0;
  bool busy = !st.running.empty() || !st.file_callers.empty();
  if (st.rec.spec().idle_timeout_s() > 0 && st.rec.phase() == v1::SANDBOX_PHASE_RUNNING) {
    if (now >= st.active_written_until || (!busy && st.busy_written)) WriteActivity(self, busy);
    if (busy && !st.busy_written) {
      // Still running in a second: say so in the record.
      self->delayed_send(caf::actor_cast<sandbox_actor>(self), std::chrono::seconds(1), Continuation{[self] {
                           auto& st = self->state;
                           bool busy = !st.running.empty() || !st.file_callers.empty();
                           if (busy && !st.busy_written && !st.destroying) WriteActivity(self, true);
                         }});
    }
  }
  ArmExpiry(self);
}

}  // namespace dsec::sandbox_detail
