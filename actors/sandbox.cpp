#include "actors/sandbox.hpp"

#include <unordered_map>
#include <unordered_set>


#include "actors/context.hpp"
#include "actors/crash.hpp"
#include "dsec/status_proto.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

struct SandboxState {
  std::shared_ptr<NodeContext> ctx;
  v1::SandboxRecord rec;
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
  std::function<void()> gone;               // see SpawnSandbox
  static constexpr const char* name = "sandbox";
};

using Self = sandbox_actor::stateful_pointer<SandboxState>;

v1::SandboxReply Reply(const Status& st, const v1::SandboxRecord& rec) {
  v1::SandboxReply r;
  ToProto(st, r.mutable_status());
  *r.mutable_sandbox() = rec;
  return r;
}

// Checkpoints the record, then runs `then` on the actor with the outcome.
void Checkpoint(Self self, std::function<void(const Status&)> then) {
  auto& st = self->state;
  st.rec.set_updated_ms(NowMs());
  state::WriteBatch b;
  state::TypedTable<v1::SandboxRecord>(st.ctx->store, state::Table::kSandboxes)
      .Put(&b, st.rec.id(), st.rec);
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
  if (ok && !st.destroying) return Status::Ok();
  std::string hint = st.rec.phase() == v1::SANDBOX_PHASE_PAUSED ? " (resume it first)" : "";
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
  call(self, [handle, self, rp, path, fail, call_id](Result<v1::FileReply> r) mutable {
    Post(handle, [self, rp, path, fail, call_id, r = std::move(r)]() mutable {
      self->state.file_callers.erase(call_id);
      if (r.ok()) rp.deliver(std::move(*r));
      else rp.deliver(fail(r.status().Annotate("sandbox " + self->state.rec.id())));
    });
  });
  return rp;
}

// Pause (freeze) or resume; the phase change is checkpointed before the reply.
caf::result<v1::SandboxReply> SetPaused(Self self, bool paused) {
  auto& st = self->state;
  auto want = paused ? v1::SANDBOX_PHASE_PAUSED : v1::SANDBOX_PHASE_RUNNING;
  // Pausing a paused sandbox is a no-op; resuming a running one still asks
  // the driver, so a kind without pause says so.
  if (paused && st.rec.phase() == want && !st.destroying) return Reply(Status::Ok(), st.rec);
  Status ok = NotServing(self, true);
  if (!ok.ok()) return Reply(ok, st.rec);
  if (paused && !st.running.empty())
    return Reply(Status::FailedPrecondition("sandbox " + st.rec.id() + " has " + std::to_string(st.running.size()) +
                                            " exec(s) running; pause it between execs"),
                 st.rec);
  auto rp = self->make_response_promise<v1::SandboxReply>();
  auto handle = caf::actor_cast<sandbox_actor>(self);
  st.driver->Pause(st.rec, paused, [handle, self, rp, want](const Status& s) mutable {
    Post(handle, [self, rp, want, s]() mutable {
      auto& st = self->state;
      if (!s.ok()) {
        rp.deliver(Reply(s.Annotate("sandbox " + st.rec.id()), st.rec));
        return;
      }
      st.rec.set_phase(want);
      Checkpoint(self, [self, rp](const Status& w) mutable {
        rp.deliver(Reply(w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint"), self->state.rec));
      });
    });
  });
  return rp;
}

sandbox_actor::behavior_type Behavior(Self self) {
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
  return {
      [self](const v1::CreateRequest&) -> caf::result<v1::SandboxReply> {
        auto& st = self->state;
        if (st.rec.phase() != v1::SANDBOX_PHASE_PENDING)
          return Reply(Status::FailedPrecondition("sandbox " + st.rec.id() + " already exists"), st.rec);
        if (!st.driver) return Reply(st.driver_status, st.rec);
        // The sandbox-wide limits (memory, pids, cpu) are fixed at creation:
        // the record shows the values in force, defaults filled in.
        auto lim = drivers::EffectiveLimits(st.ctx->options.limits, st.rec.spec(), v1::ExecRequest{});
        if (!lim.ok()) {
          self->quit();
          return Reply(lim.status().Annotate("sandbox " + st.rec.id()), st.rec);
        }
        auto* sl = st.rec.mutable_spec()->mutable_limits();
        if (!sl->memory_bytes()) sl->set_memory_bytes(lim->memory_bytes());
        if (!sl->pids()) sl->set_pids(lim->pids());
        if (!sl->cpu_millis()) sl->set_cpu_millis(lim->cpu_millis());
        auto rp = self->make_response_promise<v1::SandboxReply>();
        st.rec.set_phase(v1::SANDBOX_PHASE_STARTING);
        auto handle = caf::actor_cast<sandbox_actor>(self);
        st.driver->Create(st.rec, [handle, self, rp](Result<std::string> created) mutable {
          Post(handle, [self, rp, created = std::move(created)]() mutable {
            auto& st = self->state;
            Status s = created.status();
            if (!s.ok()) {
              // Nothing was written: the sandbox never existed.
              st.rec.set_phase(v1::SANDBOX_PHASE_FAILED);
              st.rec.set_error(s.message());
              rp.deliver(Reply(s, st.rec));
              self->quit();
              return;
            }
            st.rec.set_phase(v1::SANDBOX_PHASE_RUNNING);
            st.rec.set_driver_state(*created);
            // Acknowledge only once the new phase is durable.
            Checkpoint(self, [self, rp](const Status& w) mutable {
              Status out = w.Annotate("sandbox " + self->state.rec.id() + ": checkpoint");
              rp.deliver(Reply(out, self->state.rec));
              if (!out.ok()) self->quit();
            });
          });
        });
        return rp;
      },
      [self](v1::ExecRequest& req) -> caf::result<v1::ExecReply> {
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
        if (ok.ok() && !req.idempotency_key().empty() && st.driver->kind() == v1::KIND_FNCALL)
          ok = Status::InvalidArgument("an idempotency_key needs a sandbox with state; every fncall exec is a fresh run");
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
        auto handle = caf::actor_cast<sandbox_actor>(self);
        auto finished = [handle, self, rp, run_id](Result<v1::ExecResult> r) mutable {
          Post(handle, [self, rp, run_id, r = std::move(r)]() mutable {
            v1::ExecReply reply;
            auto& st = self->state;
            st.running.erase(run_id);
            st.exec_callers.erase(run_id);
            st.rec.set_exec_count(st.rec.exec_count() + 1);
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
      },
      [self](const v1::PauseRequest&) -> caf::result<v1::SandboxReply> { return SetPaused(self, true); },
      [self](const v1::ResumeRequest&) -> caf::result<v1::SandboxReply> { return SetPaused(self, false); },
      [self](const v1::ReadFileRequest& req) -> caf::result<v1::FileReply> {
        return FileOp(self, req.path(), [req](Self s, drivers::FileCallback cb) {
          s->state.driver->ReadFile(s->state.rec, req, std::move(cb));
        });
      },
      [self](const v1::WriteFileRequest& req) -> caf::result<v1::FileReply> {
        return FileOp(self, req.path(), [req](Self s, drivers::FileCallback cb) {
          s->state.driver->WriteFile(s->state.rec, req, std::move(cb));
        });
      },
      [self](const v1::ListFilesRequest& req) -> caf::result<v1::FileReply> {
        return FileOp(self, req.path(), [req](Self s, drivers::FileCallback cb) {
          s->state.driver->ListFiles(s->state.rec, req, std::move(cb));
        });
      },
      [self](const v1::DestroyRequest&) -> caf::result<v1::SandboxReply> {
        auto& st = self->state;
        auto rp = self->make_response_promise<v1::SandboxReply>();
        if (!st.driver) {
          rp.deliver(Reply(st.driver_status, st.rec));
          return rp;
        }
        if (st.destroying) {
          rp.deliver(Reply(Status::FailedPrecondition("sandbox " + st.rec.id() + " is already being destroyed"),
                           st.rec));
          return rp;
        }
        st.destroying = true;
        st.rec.set_phase(v1::SANDBOX_PHASE_STOPPING);
        auto handle = caf::actor_cast<sandbox_actor>(self);
        // Execs in flight are stopped and answered (as killed) before the
        // sandbox goes; nobody is left waiting on a reply that never comes.
        st.after_runs = [self, handle, rp]() mutable {
        self->state.driver->Destroy(self->state.rec, [handle, self, rp](const Status& s) mutable {
          Post(handle, [self, rp, s]() mutable {
            auto& st = self->state;
            st.rec.set_phase(s.ok() ? v1::SANDBOX_PHASE_STOPPED : v1::SANDBOX_PHASE_FAILED);
            if (!s.ok()) st.rec.set_error(s.message());
            // A stopped sandbox leaves no row behind.
            state::WriteBatch b;
            b.Delete(state::Table::kSandboxes, st.rec.id());
            st.ctx->committer->Submit(std::move(b), [handle = caf::actor_cast<sandbox_actor>(self), self,
                                                     rp, s](const Status& w) mutable {
              Post(handle, [self, rp, s, w]() mutable {
                if (self->state.gone) self->state.gone();
                rp.deliver(Reply(s.ok() ? w : s, self->state.rec));
                self->quit();
              });
            });
          });
        });
        };
        for (const auto& id : st.running) (void)st.driver->Kill(id, "sandbox " + st.rec.id() + " was destroyed");
        if (st.running.empty()) {
          auto next = std::move(st.after_runs);
          st.after_runs = nullptr;
          next();
        }
        return rp;
      },
      [self](const v1::GetSandboxRequest&) { return Reply(Status::Ok(), self->state.rec); },
      [self](Continuation& c) { c.fn(); },
      [self](crash_atom) { InjectCrash(self->state.ctx->options.test_hooks); },
  };
}

sandbox_actor::behavior_type SandboxActor(Self self, std::shared_ptr<NodeContext> ctx,
                                          v1::SandboxRecord record, std::function<void()> gone) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.rec = std::move(record);
  st.gone = std::move(gone);
  auto d = st.ctx->DriverFor(st.rec.spec());
  if (d.ok()) {
    st.driver = *d;
  } else {
    // The record stays (a later start with the kind available re-adopts
    // it); until then every operation says why it cannot be served.
    st.driver_status = d.status();
    st.ctx->log->warn("sandbox {}: {}", st.rec.id(), d.status().message());
  }
  return Behavior(self);
}

}  // namespace

sandbox_actor SpawnSandbox(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx,
                           v1::SandboxRecord record, std::function<void()> gone) {
  return parent->spawn<caf::monitored>(SandboxActor, std::move(ctx), std::move(record), std::move(gone));
}

}  // namespace dsec
