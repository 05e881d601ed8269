// Internal to the sandbox actor (sandbox.cpp: its calls; sandbox_life.cpp:
// its checkpoints, pause and destroy, and when it ends): its state and what
// the two halves share.
#pragma once

#include <caf/all.hpp>

#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/node/context.hpp"
#include "actors/node/lifetime.hpp"
#include "actors/node/sandbox.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/metrics.hpp"
#include "state/store.hpp"

namespace dsec::sandbox_detail {

struct SandboxState {
  std::shared_ptr<NodeContext> ctx;
  caf::actor node;  // its parent: a fork's sandboxes are made there
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
  bool network_changing = false;   // a SetNetwork is with the driver (one at a time)
  std::function<void()> after_pause;  // a destroy waiting for it
  std::function<void()> after_pause_lost;  // the removal of a sandbox lost meanwhile, waiting for it
  int snapshotting = 0;             // snapshots with the driver (a destroy waits for them)
  std::function<void()> after_snapshots;  // a destroy waiting for them
  bool waking = false;              // a resume for calls (resume_on_call) is under way
  std::vector<std::function<void(const Status&)>> wakers;  // the calls waiting for it
  int64_t idle_retry_ms = 0;       // a failed automatic pause is tried again then, not before
  int64_t end_retry_ms = 0;        // a failed destroy: tried again then (its only end)
  // After a restart, until the driver has re-adopted the sandbox: requests
  // wait here (see Defer) and no end is armed.
  bool readopting = false;
  std::vector<std::function<void()>> after_readopt;
  // Directory watches (WatchRequest), by a number of this actor's: what
  // stops each, who asked (stopped when it goes away) and its answer.
  struct Watching {
    std::function<void()> stop;
    caf::actor_addr who;
    uint64_t stream_id = 0;
    uint64_t events = 0;
    caf::typed_response_promise<v1::WatchReply> rp;
  };
  std::unordered_map<uint64_t, Watching> watches;
  uint64_t next_watch = 0;
  // Callers of watches and attachments (ExecRequest.attach_pid), monitored
  // while they have any: one that goes away has them stopped.
  std::map<caf::actor_addr, int> followers;
  std::unordered_map<std::string, caf::actor_addr> attachments;  // run id -> caller
  bool monitors_set = false;  // the down handler is in place
  // The last usage reading (UsageRequest), for the CPU share since it:
  // when (steady clock; 0: none) and its CPU time.
  int64_t usage_at_ms = 0;
  uint64_t usage_cpu_ns = 0;
  // Usage calls being measured, answered Unavailable if the actor ends first.
  std::unordered_map<uint64_t, caf::typed_response_promise<v1::UsageReply>> usage_callers;
  uint64_t next_usage_call = 0;
  // This sandbox in dsec_sandboxes{kind,phase} while its actor lives.
  metrics::PhaseGauge phase_gauge;
  metrics::Histogram* exec_seconds = nullptr;  // dsec_exec_seconds{kind}, looked up once
  static constexpr const char* name = "sandbox";
};

using Self = sandbox_actor::stateful_pointer<SandboxState>;

// Its phase in dsec_sandboxes{kind,phase}.
void CountPhase(SandboxState& st);
// The record as shown: with its next end filled in.
v1::SandboxRecord Shown(const SandboxState& st);
v1::SandboxReply Reply(const Status& status, const SandboxState& st);
// The record as a get shows it: with its disk use.
v1::SandboxReply Looked(const SandboxState& st);
// Checkpoints the record, then runs `then` on the actor with the outcome.
void Checkpoint(Self self, std::function<void(const Status&)> then);
// Why the sandbox cannot take an operation now, or Ok.
Status NotServing(Self self, bool paused_ok);
// A file call: checks the path and the phase, runs `call` on the driver and
// answers on this actor.
caf::result<v1::FileReply> FileOp(Self self, const std::string& path,
                                  std::function<void(Self, drivers::FileCallback)> call);
// Pause (freeze; `memory`: its memory freed too) or resume; the phase
// change is checkpointed before `done`.
caf::result<v1::SandboxReply> SetPaused(Self self, bool paused, bool memory = false);
// A call came while it is PAUSED with spec.resume_on_call (or being woken
// for another): it waits for Wake.
bool WantsWake(Self self);
// Resumes it for the calls waiting (one resume for all); `then` on the
// actor with the outcome.
void Wake(Self self, std::function<void(const Status&)> then);
// Destroys the sandbox (execs in flight stopped and answered first); the
// actor quits after `done`.
void StartDestroy(Self self, std::string why, std::function<void(const Status&)> done);
// Arms the timer for the next end (one at a time: a newer one supersedes).
void ArmExpiry(Self self);
// An exec or file call starts or ends: a new idle period.
void Touch(Self self);

// Directory watches (sandbox_watch.cpp): started, stopped by their caller
// (or when it goes away, or at their timeout); EndWatches answers every one
// (the sandbox is ending).
caf::result<v1::WatchReply> WatchDir(Self self, v1::WatchRequest& req);
void EndWatches(Self self, const Status& why);
// What it uses now (sandbox_usage.cpp); EndUsageCalls answers those still
// being measured (the actor ends).
caf::result<v1::UsageReply> MeasureUsage(Self self, v1::UsageRequest& req);
void EndUsageCalls(Self self, const Status& why);
// A caller with a watch or an attachment: monitored while it has one
// (Follow counts one more, Unfollow one less).
void Follow(Self self, const caf::actor& caller);
void Unfollow(Self self, const caf::actor_addr& caller);

// Sandbox.Snapshot and Sandbox.Fork (sandbox_snapshot.cpp).
caf::result<v1::SnapshotReply> TakeSnapshot(Self self, v1::SnapshotRequest& req);
caf::result<v1::ForkReply> Fork(Self self, v1::ForkRequest& req);

// While the driver re-adopts the sandbox, a request waits; once that is
// done it is sent to this actor again, for its caller.
template <class Reply, class Request>
caf::result<Reply> Defer(Self self, const Request& req) {
  auto rp = self->make_response_promise<Reply>();
  // Counted while it waits: the count drops when the request is sent on,
  // or dropped with the actor.
  auto waiting = self->state.ctx->waiting_for_readopt;
  ++*waiting;
  std::shared_ptr<void> counted(nullptr, [waiting](void*) { --*waiting; });
  self->state.after_readopt.push_back([self, rp, req, counted]() mutable {
    rp.delegate(caf::actor_cast<sandbox_actor>(self), std::move(req));
  });
  return rp;
}

// A call to a sandbox paused with resume_on_call: it is resumed, then the
// call is sent to this actor again, for its caller (streamed output still
// goes to the caller: delegation keeps the sender).
template <class Reply, class Request>
caf::result<Reply> ResumeThen(Self self, const Request& req) {
  auto rp = self->make_response_promise<Reply>();
  Wake(self, [self, rp, req](const Status& s) mutable {
    if (!s.ok()) {
      Reply r;
      ToProto(s.Annotate("resume on call"), r.mutable_status());
      rp.deliver(std::move(r));
      return;
    }
    rp.delegate(caf::actor_cast<sandbox_actor>(self), std::move(req));
  });
  return rp;
}

}  // namespace dsec::sandbox_detail
