#include "actors/sandbox.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>


#include "actors/context.hpp"
#include "actors/crash.hpp"
#include "actors/lifetime.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/metrics.hpp"
#include "runtime/proto_json.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

struct SandboxState {
  std::shared_ptr<NodeContext> ctx;
  v1::SandboxRecord rec;
  std::string driver_state;  // the driver's own (SandboxRow.driver_state)
  drivers::Driver* driver = nullptr;
  Status driver_status;  // why driver is null
  uint64_t next_exec = 0;
  bool destroying = false;
  std::unordered_set<std::string> running;  // run ids of execs in flight
  // Their callers, so a crash can answer them (see Behavior).
  std::unordered_map<std::string, caf::typed_response_promise<v1::ExecReply>> exec_callers;
  std::unordered_map<uint64_t, caf::typed_response_promise<v1::FileReply>> file_callers;
  uint64_t next_file_call = 0;
  std::function<void()> after_runs;         // a destroy waiting for them to end
  std::function<void(const std::string&)> gone;  // see SpawnSandbox
  // Lifetime (see SpawnSandbox): the armed expiry timer's generation, and
  // how far rec.last_active_ms was written ahead of the last activity.
  // The armed timer's time (0: none). CAF 0.17 cannot cancel a delayed
  // message, so a new one is sent only for an earlier end; one that fires
  // before the (moved) end re-arms. Each waits at most kMaxTimerWait, so an
  // ended actor is not held long by its timers.
  int64_t armed_at_ms = 0;
  int64_t active_written_until = 0;
  bool busy_written = false;       // rec.busy as stored
  bool pausing = false;            // a pause or resume is with the driver
  std::function<void()> after_pause;  // a destroy waiting for it
  int64_t idle_retry_ms = 0;       // a failed automatic pause is tried again then, not before
  int64_t end_retry_ms = 0;        // a failed destroy: tried again then (its only end)
  // After a restart, until the driver has re-adopted the sandbox: requests
  // wait here (see Defer) and no end is armed.
  bool readopting = false;
  std::vector<std::function<void()>> after_readopt;
  // This sandbox in dsec_sandboxes{kind,phase} while its actor lives.
  metrics::PhaseGauge phase_gauge;
  metrics::Histogram* exec_seconds = nullptr;  // dsec_exec_seconds{kind}, looked up once
  static constexpr const char* name = "sandbox";
};

void CountPhase(SandboxState& st) { st.phase_gauge.Set(KindName(st.rec.spec().kind()), PhaseName(st.rec.phase())); }

using Self = sandbox_actor::stateful_pointer<SandboxState>;

// ---- lifetime ---------------------------------------------------------------

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
// tree: cheap enough to read on every look).
v1::SandboxReply Looked(const SandboxState& st) {
  auto reply = Reply(Status::Ok(), st);
  bool up = st.rec.phase() == v1::SANDBOX_PHASE_RUNNING || st.rec.phase() == v1::SANDBOX_PHASE_PAUSED;
  if (st.driver && up)
    if (auto used = st.driver->DiskUsage(st.rec); used.ok()) reply.mutable_sandbox()->set_disk_used_bytes(*used);
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

// While the driver re-adopts the sandbox, a request waits; once that is
// done it is sent to this actor again, for its caller.
template <class Reply, class Request>
caf::result<Reply> Defer(Self self, const Request& req) {
  auto rp = self->make_response_promise<Reply>();
  self->state.after_readopt.push_back(
      [self, rp, req]() mutable { rp.delegate(caf::actor_cast<sandbox_actor>(self), std::move(req)); });
  return rp;
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

// Pause (freeze) or resume; the phase change is checkpointed before `done`
// gets the outcome. `why`: the pause reason for the record ("" for a user's).
void DoPause(Self self, bool paused, std::string why, std::function<void(const Status&)> done) {
  auto& st = self->state;
  auto want = paused ? v1::SANDBOX_PHASE_PAUSED : v1::SANDBOX_PHASE_RUNNING;
  auto handle = caf::actor_cast<sandbox_actor>(self);
  st.pausing = true;
  st.driver->Pause(st.rec, paused, [handle, self, want, why, done](const Status& s) mutable {
    Post(handle, [self, want, why, done, s]() mutable {
      auto& st = self->state;
      st.pausing = false;
      // A destroy came meanwhile: it goes on now; the phase is its.
      if (st.destroying) {
        done(Status::FailedPrecondition("sandbox " + st.rec.id() + " was destroyed meanwhile"));
        if (auto next = std::move(st.after_pause)) {
          st.after_pause = nullptr;
          next();
        }
        return;
      }
      if (!s.ok()) {
        done(s.Annotate("sandbox " + st.rec.id()));
        return ArmExpiry(self);
      }
      st.rec.set_phase(want);
      st.rec.set_pause_reason(paused_reason(want, why));
      // A resumed sandbox starts a new idle period.
      if (want == v1::SANDBOX_PHASE_RUNNING) st.rec.set_last_active_ms(WallClockMs());
      Checkpoint(self, [self, done](const Status& w) mutable {
        done(w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint"));
        ArmExpiry(self);
      });
    });
  });
}

caf::result<v1::SandboxReply> SetPaused(Self self, bool paused) {
  auto& st = self->state;
  auto want = paused ? v1::SANDBOX_PHASE_PAUSED : v1::SANDBOX_PHASE_RUNNING;
  // Pausing a paused sandbox is a no-op; resuming a running one still asks
  // the driver, so a kind without pause says so.
  if (paused && st.rec.phase() == want && !st.destroying) return Reply(Status::Ok(), st);
  Status ok = NotServing(self, true);
  if (!ok.ok()) return Reply(ok, st);
  if (paused && !st.running.empty())
    return Reply(Status::FailedPrecondition("sandbox " + st.rec.id() + " has " + std::to_string(st.running.size()) +
                                            " exec(s) running; pause it between execs"),
                 st);
  auto rp = self->make_response_promise<v1::SandboxReply>();
  DoPause(self, paused, "", [self, rp](const Status& s) mutable { rp.deliver(Reply(s, self->state)); });
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
  st.rec.set_phase(v1::SANDBOX_PHASE_STOPPING);
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
            done(w);
            self->quit();
          });
        });
      });
    });
  };
  auto go = [self, why] {
    auto& st = self->state;
    for (const auto& id : st.running) (void)st.driver->Kill(id, "sandbox " + st.rec.id() + " was destroyed (" + why + ")");
    if (st.running.empty()) {
      auto next = std::move(st.after_runs);
      st.after_runs = nullptr;
      next();
    }
  };
  // A pause with the driver finishes first (its freeze must not land on
  // the container being removed).
  if (st.pausing) st.after_pause = go;
  else go();
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
  if (pause) {
    DoPause(self, true, "paused: " + why, [self](const Status& s) {
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

caf::result<v1::SandboxReply> Handle(Self self, v1::CreateRequest&) {
  auto& st = self->state;
  if (st.rec.phase() != v1::SANDBOX_PHASE_PENDING)
    return Reply(Status::FailedPrecondition("sandbox " + st.rec.id() + " already exists"), st);
  if (!st.driver) return Reply(st.driver_status, st);
  // The sandbox-wide limits (memory, pids, cpu) are fixed at creation:
  // the record shows the values in force, defaults filled in.
  auto lim = drivers::EffectiveLimits(st.ctx->options.limits, st.rec.spec(), v1::ExecRequest{});
  if (!lim.ok()) {
    self->quit();
    return Reply(lim.status().Annotate("sandbox " + st.rec.id()), st);
  }
  auto* sl = st.rec.mutable_spec()->mutable_limits();
  if (!sl->memory_bytes()) sl->set_memory_bytes(lim->memory_bytes());
  if (!sl->pids()) sl->set_pids(lim->pids());
  if (!sl->cpu_millis()) sl->set_cpu_millis(lim->cpu_millis());
  if (!sl->disk_bytes()) sl->set_disk_bytes(lim->disk_bytes());
  auto rp = self->make_response_promise<v1::SandboxReply>();
  st.rec.set_phase(v1::SANDBOX_PHASE_STARTING);
  CountPhase(st);
  auto handle = caf::actor_cast<sandbox_actor>(self);
  st.driver->Create(st.rec, [handle, self, rp](Result<std::string> created) mutable {
    Post(handle, [self, rp, created = std::move(created)]() mutable {
      auto& st = self->state;
      Status s = created.status();
      const std::string kind = metrics::Labels({{"kind", KindName(st.rec.spec().kind())}});
      if (!s.ok()) {
        // Nothing was written: the sandbox never existed.
        metrics::SandboxCreateFailures().At(kind).Add();
        st.rec.set_phase(v1::SANDBOX_PHASE_FAILED);
        st.rec.set_error(s.message());
        rp.deliver(Reply(s, st));
        self->quit();
        return;
      }
      metrics::SandboxesCreated().At(kind).Add();
      st.rec.set_phase(v1::SANDBOX_PHASE_RUNNING);
      st.driver_state = std::move(*created);
      st.rec.set_last_active_ms(WallClockMs());
      // Acknowledge only once the new phase is durable.
      Checkpoint(self, [self, rp](const Status& w) mutable {
        Status out = w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint");
        rp.deliver(Reply(out, self->state));
        if (!out.ok()) return self->quit();
        ArmExpiry(self);
      });
    });
  });
  return rp;
}

caf::result<v1::ExecReply> Handle(Self self, v1::ExecRequest& req) {
  auto& st = self->state;
  v1::ExecReply reply;
  if (!st.driver) {
    ToProto(st.driver_status.Annotate("sandbox " + st.rec.id()), reply.mutable_status());
    return reply;
  }
  if (Status serving = NotServing(self, false); !serving.ok()) {
    ToProto(serving, reply.mutable_status());
    return reply;
  }
  Status ok = drivers::CheckExecRequest(st.ctx->options.limits, req);
  if (ok.ok() && !req.idempotency_key().empty() && !st.driver->traits().stateful)
    ok = Status::InvalidArgument(std::string("an idempotency_key needs a sandbox with state; every ") +
                                 st.driver->name() + " exec is a fresh run");
  if (ok.ok() && req.stream() && !st.driver->traits().streaming)
    ok = Status::Unimplemented(std::string(st.driver->name()) +
                               " sandboxes cannot stream output: each exec is one fresh run whose output "
                               "comes back whole when it ends (call Exec, or use a container sandbox)");
  if (ok.ok()) ok = st.driver->CheckExecLimits(st.rec, req.limits());
  auto limits = ok.ok() ? drivers::EffectiveLimits(st.ctx->options.limits, st.rec.spec(), req)
                        : Result<v1::Limits>(ok);
  if (!limits.ok()) {
    ToProto(limits.status().Annotate("sandbox " + st.rec.id()), reply.mutable_status());
    return reply;
  }
  *req.mutable_limits() = *limits;
  // Streamed pieces go to the sender; read it first, for the response
  // promise takes it over (current_sender() is null after this).
  auto to = req.stream() ? caf::actor_cast<caf::actor>(self->current_sender()) : caf::actor{};
  auto rp = self->make_response_promise<v1::ExecReply>();
  // Unique across restarts of this actor (restarts() grows with each).
  std::string run_id = st.rec.id() + "/" + std::to_string(st.rec.restarts()) + "." +
                       std::to_string(++st.next_exec);
  st.running.insert(run_id);
  st.exec_callers.emplace(run_id, rp);
  Touch(self);
  auto handle = caf::actor_cast<sandbox_actor>(self);
  auto started = std::chrono::steady_clock::now();
  auto finished = [handle, self, rp, run_id, started](Result<v1::ExecResult> r) mutable {
    Post(handle, [self, rp, run_id, started, r = std::move(r)]() mutable {
      v1::ExecReply reply;
      auto& st = self->state;
      if (!st.exec_seconds)
        st.exec_seconds = &metrics::ExecSeconds().At(metrics::Labels({{"kind", KindName(st.rec.spec().kind())}}));
      st.exec_seconds->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      st.running.erase(run_id);
      st.exec_callers.erase(run_id);
      st.rec.set_exec_count(st.rec.exec_count() + 1);
      if (!st.destroying) Touch(self);
      if (r.ok()) {
        *reply.mutable_result() = std::move(*r);
        reply.mutable_result()->set_sandbox_id(st.rec.id());
      } else {
        ToProto(r.status().Annotate("sandbox " + st.rec.id()), reply.mutable_status());
      }
      rp.deliver(std::move(reply));
      if (st.running.empty() && st.after_runs) {
        auto next = std::move(st.after_runs);
        st.after_runs = nullptr;
        next();
      }
    });
  };
  if (!req.stream()) {
    st.driver->Exec(st.rec, run_id, req, std::move(finished));
    return rp;
  }
  // Pieces go to whoever asked, from this actor, so they arrive before
  // the reply (one sender, one receiver: CAF keeps the order).
  uint64_t stream_id = req.stream_id();
  st.driver->ExecStreaming(
      st.rec, run_id, req,
      [handle, to, stream_id](const v1::ExecOutput& out) {
        Post(handle, [to, stream_id, piece = v1::ExecOutput(out)]() mutable {
          piece.set_stream_id(stream_id);
          if (to) caf::anon_send(to, std::move(piece));
        });
      },
      std::move(finished));
  return rp;
}

caf::result<v1::SandboxReply> Handle(Self self, v1::PauseRequest& req) {
  return SetPaused(self, true);
}

caf::result<v1::SandboxReply> Handle(Self self, v1::ResumeRequest& req) {
  return SetPaused(self, false);
}

// Its lifetime from now: destroyed timeout_s from now, within the node's
// maximum ttl (from now), written before the answer.
caf::result<v1::SandboxReply> Handle(Self self, v1::SetTimeoutRequest& req) {
  auto& st = self->state;
  const auto& o = st.ctx->options;
  const std::string what = "sandbox " + st.rec.id();
  if (!st.rec.session().empty())
    return Reply(Status::FailedPrecondition(what + " belongs to session " + st.rec.session() +
                                            " and ends with it (close the session to end it sooner)"),
                 st);
  if (st.destroying) return Reply(Status::FailedPrecondition(what + " is being destroyed"), st);
  if (req.timeout_s() == 0)
    return Reply(Status::InvalidArgument(what + ": a timeout of 0 s; give 1 or more (Destroy ends it now)"), st);
  if (o.sandbox_max_ttl_s && req.timeout_s() > o.sandbox_max_ttl_s)
    return Reply(Status::InvalidArgument(what + ": a timeout of " + std::to_string(req.timeout_s()) +
                                         " s is above this node's maximum of " + std::to_string(o.sandbox_max_ttl_s) +
                                         " s (dsecd --sandbox-max-ttl)"),
                 st);
  int64_t deadline = WallClockMs() + int64_t{req.timeout_s()} * 1000;
  st.rec.set_ttl_deadline_ms(deadline);
  // The record's ttl: its whole lifetime, from its creation to the new end.
  int64_t ttl_s = (deadline - st.rec.created_ms() + 999) / 1000;
  st.rec.mutable_spec()->set_ttl_s(static_cast<uint32_t>(std::clamp<int64_t>(ttl_s, 1, UINT32_MAX)));
  auto rp = self->make_response_promise<v1::SandboxReply>();
  Checkpoint(self, [self, rp](const Status& w) mutable {
    rp.deliver(Reply(w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint"), self->state));
    ArmExpiry(self);
  });
  return rp;
}

caf::result<v1::FileReply> Handle(Self self, v1::ReadFileRequest& req) {
  return FileOp(self, req.path(), [req](Self s, drivers::FileCallback cb) {
    s->state.driver->ReadFile(s->state.rec, req, std::move(cb));
  });
}

caf::result<v1::FileReply> Handle(Self self, v1::WriteFileRequest& req) {
  return FileOp(self, req.path(), [req](Self s, drivers::FileCallback cb) {
    s->state.driver->WriteFile(s->state.rec, req, std::move(cb));
  });
}

caf::result<v1::FileReply> Handle(Self self, v1::ListFilesRequest& req) {
  return FileOp(self, req.path(), [req](Self s, drivers::FileCallback cb) {
    s->state.driver->ListFiles(s->state.rec, req, std::move(cb));
  });
}

caf::result<v1::SandboxReply> Handle(Self self, v1::DestroyRequest& req) {
  auto& st = self->state;
  if (!st.driver) return Reply(st.driver_status, st);
  if (st.destroying)
    return Reply(Status::FailedPrecondition("sandbox " + st.rec.id() + " is already being destroyed"), st);
  auto rp = self->make_response_promise<v1::SandboxReply>();
  std::string why = req.reason().empty() ? "destroyed on request" : req.reason().substr(0, 256);
  StartDestroy(self, why, [self, rp](const Status& s) mutable { rp.deliver(Reply(s, self->state)); });
  return rp;
}

caf::result<v1::SandboxReply> Handle(Self self, v1::GetSandboxRequest& req) {
  return Looked(self->state);
}

sandbox_actor::behavior_type Behavior(Self self) {
  CountPhase(self->state);
  // A crash answers the execs and file calls in flight at once (CAF 0.17
  // would drop their promises and leave callers to their timeouts). A
  // command may still run in the sandbox: an exec with an idempotency_key,
  // sent again, gets that run's result instead of a second run.
  ExitOnException(self, self->state.ctx->log, "sandbox " + self->state.rec.id(), [self](const std::string& what) {
    auto& st = self->state;
    auto callers = std::move(st.exec_callers);
    st.exec_callers.clear();
    for (auto& [run_id, rp] : callers) {
      v1::ExecReply reply;
      ToProto(Status::Unavailable("sandbox " + st.rec.id() + " crashed (" + what +
                                  ") and is restarted from its checkpoint; the command may still be running there: "
                                  "resend it with an idempotency_key to have it run once"),
              reply.mutable_status());
      rp.deliver(std::move(reply));
    }
    auto files = std::move(st.file_callers);
    st.file_callers.clear();
    for (auto& [id, rp] : files) {
      v1::FileReply reply;
      ToProto(Status::Unavailable("sandbox " + st.rec.id() + " crashed (" + what +
                                  ") and is restarted from its checkpoint; retry the file call"),
              reply.mutable_status());
      rp.deliver(std::move(reply));
    }
  });
  // The table's calls for a sandbox (wire/calls.hpp): each to its Handle;
  // while the driver re-adopts the sandbox after a restart, they wait.
  auto table = calls::Handlers(SandboxCalls{}, [self](auto& req) -> caf::result<calls::ReplyOf<std::decay_t<decltype(req)>>> {
    using Req = std::decay_t<decltype(req)>;
    if constexpr (calls::CallOf<Req>::type::route == calls::Route::kSandbox)
      if (self->state.readopting) return Defer<calls::ReplyOf<Req>>(self, req);
    return Handle(self, req);
  });
  return calls::MakeBehavior<sandbox_actor::behavior_type>(
      std::move(table),
      [self](lost_atom, const std::string& why) {
        // The sandbox ended by itself: failed, saying why (the record
        // stays for its owner to see), and what is left of it is removed.
        auto& st = self->state;
        bool up = st.rec.phase() == v1::SANDBOX_PHASE_RUNNING || st.rec.phase() == v1::SANDBOX_PHASE_PAUSED;
        if (!st.driver || st.destroying || st.readopting || !up) return;
        st.rec.set_phase(v1::SANDBOX_PHASE_FAILED);
        st.rec.set_error(why.substr(0, 4096));
        st.ctx->log->warn("sandbox {}: {}", st.rec.id(), st.rec.error());
        for (const auto& id : st.running) (void)st.driver->Kill(id, "sandbox " + st.rec.id() + " failed (" + why + ")");
        Checkpoint(self, [self](const Status& w) {
          if (!w.ok()) self->state.ctx->log->error("sandbox {}: checkpoint: {}", self->state.rec.id(), w.message());
        });
        auto log = st.ctx->log;
        std::string id = st.rec.id();
        st.driver->Destroy(st.rec, st.driver_state, [log, id](const Status& s) {
          if (!s.ok()) log->warn("sandbox {}: removing what is left after it failed: {}", id, s.message());
        });
      },
      [self](owner_atom, bool present) {
        auto& st = self->state;
        st.rec.set_owner_gone_ms(present ? 0 : WallClockMs());
        ArmExpiry(self);
      },
      [self](describe_atom) {
        auto& st = self->state;
        auto j = ProtoJson(Looked(st).sandbox());
        std::string state = st.driver ? st.driver->DescribeState(st.driver_state) : std::string();
        j["driver_state"] = state.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(state, nullptr, false);
        if (st.readopting) j["readopting"] = true;
        return DumpJson(j);
      },
      [self](Continuation& c) { c.fn(); },
      [self](crash_atom) { InjectCrash(self->state.ctx->options.test_hooks); }
  );
}

// The driver's answer to Readopt: a sandbox it could not take back is
// failed (and says why); then the requests that waited run.
void Readopted(Self self, const Status& s) {
  auto& st = self->state;
  st.readopting = false;
  if (!s.ok()) {
    st.rec.set_phase(v1::SANDBOX_PHASE_FAILED);
    st.rec.set_error("not re-adopted after restart: " + s.message());
    st.ctx->log->warn("sandbox {}: {}", st.rec.id(), st.rec.error());
    Checkpoint(self, [self](const Status& w) {
      if (!w.ok()) self->state.ctx->log->error("sandbox {}: checkpoint: {}", self->state.rec.id(), w.message());
    });
  }
  ArmExpiry(self);
  auto waiting = std::move(st.after_readopt);
  st.after_readopt.clear();
  for (auto& fn : waiting) fn();
}

sandbox_actor::behavior_type SandboxActor(Self self, std::shared_ptr<NodeContext> ctx,
                                          store::v1::SandboxRow row, std::function<void(const std::string&)> gone,
                                          bool owner_present, std::function<void()> readopted) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.rec = std::move(*row.mutable_record());
  st.driver_state = std::move(*row.mutable_driver_state());
  st.gone = std::move(gone);
  // An owner not connected now is gone from now on (after a restart: from
  // the restart, so it has the whole lease to come back).
  st.rec.set_owner_gone_ms(owner_present || st.rec.owner().empty() ? 0 : WallClockMs());
  // A call was running when the last one stopped (it may still run in the
  // sandbox, which outlives dsecd): active from now.
  if (st.rec.busy()) st.rec.set_last_active_ms(std::max(st.rec.last_active_ms(), WallClockMs()));
  st.rec.set_busy(false);
  st.active_written_until = st.rec.last_active_ms();
  auto d = st.ctx->kinds->DriverFor(st.rec.spec());
  if (d.ok()) {
    st.driver = *d;
  } else {
    // The record stays (a later start with the kind available re-adopts
    // it); until then every operation says why it cannot be served.
    st.driver_status = d.status();
    st.ctx->log->warn("sandbox {}: {}", st.rec.id(), d.status().message());
  }
  bool up = st.rec.phase() == v1::SANDBOX_PHASE_RUNNING || st.rec.phase() == v1::SANDBOX_PHASE_PAUSED;
  if (readopted && up) {
    // After a daemon restart: the driver takes the sandbox back on its own
    // thread (agents answer pings there); requests wait until it has.
    st.readopting = true;
    auto handle = caf::actor_cast<sandbox_actor>(self);
    auto answer = [handle, self, readopted](const Status& s) {
      Post(handle, [self, s] { Readopted(self, s); });
      readopted();
    };
    if (st.driver) st.driver->Readopt(st.rec, st.driver_state, std::move(answer));
    else answer(st.driver_status);
  } else if (readopted) {
    readopted();
  }
  // Restored: its ends come from its record (one already past acts now).
  if (st.rec.phase() != v1::SANDBOX_PHASE_PENDING) ArmExpiry(self);
  return Behavior(self);
}

}  // namespace

sandbox_actor SpawnSandbox(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx,
                           store::v1::SandboxRow row, std::function<void(const std::string&)> gone,
                           bool owner_present, std::function<void()> readopted) {
  return parent->spawn<caf::monitored>(SandboxActor, std::move(ctx), std::move(row), std::move(gone),
                                       owner_present, std::move(readopted));
}

}  // namespace dsec
