#include "actors/node/sandbox.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>


#include "actors/node/sandbox_state.hpp"
#include "actors/crash.hpp"
#include "actors/node/lifetime.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/metrics.hpp"
#include "runtime/proto_json.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

using namespace sandbox_detail;  // NOLINT: the actor's other half

// A creation that failed: the node forgets the sandbox before anyone hears
// of the failure (a call right after it is NotFound, not a quitting
// actor's silence), and the actor quits after its answer.
v1::SandboxReply Unmade(Self self, const Status& why) {
  auto& st = self->state;
  st.rec.set_phase(v1::SANDBOX_PHASE_FAILED);
  st.rec.set_error(why.message());
  if (st.gone) st.gone("");
  self->quit();
  return Reply(why, st);
}

caf::result<v1::SandboxReply> Handle(Self self, v1::CreateRequest&) {
  auto& st = self->state;
  if (st.rec.phase() != v1::SANDBOX_PHASE_PENDING)
    return Reply(Status::FailedPrecondition("sandbox " + st.rec.id() + " already exists"), st);
  if (!st.driver) return Unmade(self, st.driver_status);
  // The sandbox-wide limits (memory, pids, cpu) are fixed at creation:
  // the record shows the values in force, defaults filled in.
  auto lim = drivers::EffectiveLimits(st.ctx->options.limits, st.driver->traits(), st.rec.spec(), v1::ExecRequest{});
  if (!lim.ok()) return Unmade(self, lim.status().Annotate("sandbox " + st.rec.id()));
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
        rp.deliver(Unmade(self, s));
        return;
      }
      metrics::SandboxesCreated().At(kind).Add();
      st.rec.set_phase(v1::SANDBOX_PHASE_RUNNING);
      st.driver_state = std::move(*created);
      st.rec.set_last_active_ms(WallClockMs());
      // Acknowledge only once the new phase is durable.
      Checkpoint(self, [self, rp](const Status& w) mutable {
        auto& st = self->state;
        if (w.ok()) {
          rp.deliver(Reply(w, st));
          return ArmExpiry(self);
        }
        // Not durable, so not made: what the driver made goes too (nobody
        // will ask for it by a record).
        st.driver->Destroy(st.rec, st.driver_state, [log = st.ctx->log, id = st.rec.id()](const Status& s) {
          if (!s.ok()) log->warn("sandbox {}: removing it after its checkpoint failed: {}", id, s.message());
        });
        rp.deliver(Unmade(self, w.Annotate("sandbox " + st.rec.id() + ": checkpoint")));
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
  bool interactive = req.interactive() || req.has_pty() || req.attach_pid();
  if (ok.ok() && interactive && !req.idempotency_key().empty())
    ok = Status::InvalidArgument("an interactive exec takes its input by pid, as it runs: it cannot have an "
                                 "idempotency_key (which may answer from a run that happened before)");
  if (ok.ok() && interactive && !st.driver->traits().stateful)
    ok = Status::Unimplemented(std::string(st.driver->name()) +
                               " sandboxes have no processes to reach by pid: each exec is one fresh run "
                               "(use a container sandbox for an interactive exec)");
  if (ok.ok() && req.stream() && !st.driver->traits().streaming)
    ok = Status::Unimplemented(std::string(st.driver->name()) +
                               " sandboxes cannot stream output: each exec is one fresh run whose output "
                               "comes back whole when it ends (call Exec, or use a container sandbox)");
  if (ok.ok()) ok = st.driver->CheckExecLimits(st.rec, req.limits());
  auto limits = ok.ok() ? drivers::EffectiveLimits(st.ctx->options.limits, st.driver->traits(), st.rec.spec(), req)
                        : Result<v1::Limits>(ok);
  if (!limits.ok()) {
    ToProto(limits.status().Annotate("sandbox " + st.rec.id()), reply.mutable_status());
    return reply;
  }
  if (req.attach_pid()) {  // its process has its limits; the caller's timeout ends the attachment only
    uint64_t ms = req.limits().timeout_ms();
    req.clear_limits();
    req.mutable_limits()->set_timeout_ms(ms);
  } else {
    bool capped = req.limits().output_bytes() != 0 || st.rec.spec().limits().output_bytes() != 0;
    *req.mutable_limits() = *limits;
    // Streamed output goes to its caller as it comes: no cap unless the exec
    // (or its sandbox's spec) asks for one.
    if (req.stream() && !capped) req.mutable_limits()->set_output_bytes(UINT64_MAX);
  }
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
      if (auto a = st.attachments.find(run_id); a != st.attachments.end()) {
        Unfollow(self, a->second);
        st.attachments.erase(a);
      }
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
  // An attachment ends when its caller goes away (the process runs on).
  if (req.attach_pid() && to) {
    st.attachments[run_id] = to.address();
    Follow(self, to);
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
  return SetPaused(self, true, req.memory());
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
  // The record's ttl: its whole lifetime, from its creation to the new end;
  // for one whose ttl pauses it (on_ttl), the period a resume starts again
  // (a whole lifetime there would grow past the node's maximum).
  int64_t ttl_s = st.rec.spec().on_ttl() == v1::IDLE_ACTION_PAUSE ? int64_t{req.timeout_s()}
                                                                  : (deadline - st.rec.created_ms() + 999) / 1000;
  st.rec.mutable_spec()->set_ttl_s(static_cast<uint32_t>(std::clamp<int64_t>(ttl_s, 1, UINT32_MAX)));
  auto rp = self->make_response_promise<v1::SandboxReply>();
  Checkpoint(self, [self, rp](const Status& w) mutable {
    rp.deliver(Reply(w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint"), self->state));
    ArmExpiry(self);
  });
  return rp;
}

caf::result<v1::SnapshotReply> Handle(Self self, v1::SnapshotRequest& req) { return TakeSnapshot(self, req); }
caf::result<v1::ForkReply> Handle(Self self, v1::ForkRequest& req) { return Fork(self, req); }
caf::result<v1::WatchReply> Handle(Self self, v1::WatchRequest& req) { return WatchDir(self, req); }
caf::result<v1::UsageReply> Handle(Self self, v1::UsageRequest& req) { return MeasureUsage(self, req); }

// A new network policy (the proto's SetNetworkRequest): the policy it
// makes is checked as a new spec's would be, applied by the driver, then
// written to the record before the answer.
caf::result<v1::SandboxReply> Handle(Self self, v1::SetNetworkRequest& req) {
  auto& st = self->state;
  const std::string what = "sandbox " + st.rec.id();
  if (Status no = NotServing(self, /*paused_ok=*/true); !no.ok()) return Reply(no, st);
  // One change at a time: an ADD merges with the list in force, which a
  // change still with the driver would make stale.
  if (st.network_changing)
    return Reply(Status::Unavailable(what + ": another network change is under way; try again when it answers"), st);
  const v1::NetworkPolicy& now = st.rec.spec().network();
  v1::NetworkPolicy next = req.policy();
  switch (req.change()) {
    case v1::NETWORK_CHANGE_REPLACE:
      break;
    case v1::NETWORK_CHANGE_ADD:
      if (now.mode() != v1::NETWORK_MODE_ALLOW)
        return Reply(Status::FailedPrecondition(what + ": entries are added to an allow-list; its mode is " +
                                                v1::NetworkMode_Name(now.mode()) + " (replace the policy instead)"),
                     st);
      if (next.mode() != v1::NETWORK_MODE_UNSPECIFIED && next.mode() != v1::NETWORK_MODE_ALLOW)
        return Reply(Status::InvalidArgument(what + ": an added policy has mode allow (or none given), not " +
                                             v1::NetworkMode_Name(next.mode())),
                     st);
      if (next.allow_size() == 0) return Reply(Status::InvalidArgument(what + ": no entries to add"), st);
      next.set_mode(v1::NETWORK_MODE_ALLOW);
      {
        v1::NetworkPolicy merged = now;
        for (const auto& e : next.allow()) merged.add_allow(e);
        next = std::move(merged);
      }
      break;
    default:
      return Reply(Status::InvalidArgument(what + ": say whether the policy replaces the one in force or adds to "
                                                  "it (change REPLACE or ADD)"),
                   st);
  }
  if (next.expose_size() == 0) *next.mutable_expose() = now.expose();
  if (next.expose().size() != now.expose().size() ||
      !std::equal(next.expose().begin(), next.expose().end(), now.expose().begin()))
    return Reply(Status::InvalidArgument(what + ": exposed ports stay those it was made with; leave expose empty"),
                 st);
  v1::SandboxSpec spec = st.rec.spec();
  *spec.mutable_network() = next;
  if (Status can = drivers::Admissible(st.ctx->options.limits, *st.driver, spec); !can.ok())
    return Reply(can.Annotate(what), st);
  auto rp = self->make_response_promise<v1::SandboxReply>();
  auto handle = caf::actor_cast<sandbox_actor>(self);
  st.network_changing = true;
  st.driver->SetNetwork(st.rec, next, [handle, self, rp, next](const Status& s) mutable {
    Post(handle, [self, rp, next, s]() mutable {
      self->state.network_changing = false;
      if (!s.ok()) {
        rp.deliver(Reply(s, self->state));
        return;
      }
      *self->state.rec.mutable_spec()->mutable_network() = next;
      Checkpoint(self, [self, rp](const Status& w) mutable {
        rp.deliver(Reply(w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint"), self->state));
      });
    });
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

// Its running execs by pid (ProcessRequest): answered from the driver, on this actor.
caf::result<v1::ProcessReply> Handle(Self self, v1::ProcessRequest& req) {
  auto& st = self->state;
  if (Status no = NotServing(self, false); !no.ok()) {
    v1::ProcessReply r;
    ToProto(no, r.mutable_status());
    return r;
  }
  auto rp = self->make_response_promise<v1::ProcessReply>();
  auto handle = caf::actor_cast<sandbox_actor>(self);
  Touch(self);
  st.driver->Process(st.rec, req, [handle, self, rp](Result<v1::ProcessReply> r) mutable {
    Post(handle, [self, rp, r = std::move(r)]() mutable {
      v1::ProcessReply reply;
      if (r.ok()) reply = std::move(*r);
      else ToProto(r.status().Annotate("sandbox " + self->state.rec.id()), reply.mutable_status());
      rp.deliver(std::move(reply));
    });
  });
  return rp;
}

caf::result<v1::FileReply> Handle(Self self, v1::PathOpRequest& req) {
  if (req.op() == v1::PATH_OP_MOVE) {
    Status dest = drivers::CheckSandboxPath(req.destination()).Annotate("sandbox " + self->state.rec.id() + ": destination");
    if (!dest.ok()) {
      v1::FileReply r;
      ToProto(dest, r.mutable_status());
      return r;
    }
  }
  return FileOp(self, req.path(), [req](Self s, drivers::FileCallback cb) {
    s->state.driver->PathOp(s->state.rec, req, std::move(cb));
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
    EndWatches(self, Status::Unavailable("sandbox " + st.rec.id() + " crashed (" + what + "); watch again"));
    EndUsageCalls(self, Status::Unavailable("sandbox " + st.rec.id() + " crashed (" + what + "); ask again"));
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
    // The calls a paused sandbox refuses: with resume_on_call, they wake it.
    if constexpr (std::is_same_v<Req, v1::ExecRequest> || std::is_same_v<Req, v1::ReadFileRequest> ||
                  std::is_same_v<Req, v1::WriteFileRequest> || std::is_same_v<Req, v1::ListFilesRequest> ||
                  std::is_same_v<Req, v1::PathOpRequest>)
      if (WantsWake(self)) return ResumeThen<calls::ReplyOf<Req>>(self, req);
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
        EndWatches(self, Status::Unavailable("sandbox " + st.rec.id() + " failed: " + st.rec.error()));
        // A run that ended meanwhile is NotFound: its answer is on its way.
        for (const auto& id : st.running) (void)st.driver->Kill(id, "sandbox " + st.rec.id() + " failed (" + why + ")");
        Checkpoint(self, [self](const Status& w) {
          if (!w.ok()) self->state.ctx->log->error("sandbox {}: checkpoint: {}", self->state.rec.id(), w.message());
        });
        auto remove = [self] {
          auto& st = self->state;
          st.driver->Destroy(st.rec, st.driver_state, [log = st.ctx->log, id = st.rec.id()](const Status& s) {
            if (!s.ok()) log->warn("sandbox {}: removing what is left after it failed: {}", id, s.message());
          });
        };
        // Not beside a pause or resume the driver is doing (a resume would
        // make again what the removal takes away): after it answers.
        if (st.pausing) st.after_pause_lost = std::move(remove);
        else remove();
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
                                          bool owner_present, std::function<void()> readopted, caf::actor node) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.node = std::move(node);
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
                                       owner_present, std::move(readopted), caf::actor_cast<caf::actor>(parent));
}

}  // namespace dsec
