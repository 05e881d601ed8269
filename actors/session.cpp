#include "actors/session.hpp"

#include <google/protobuf/util/message_differencer.h>

#include <deque>
#include <map>

#include "actors/context.hpp"
#include "actors/crash.hpp"
#include "dsec/status_proto.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

using StepPromise = caf::typed_response_promise<v1::StepReply>;

struct SessionState {
  std::shared_ptr<NodeContext> ctx;
  v1::SessionRecord rec;
  drivers::Driver* driver = nullptr;
  Status driver_status;
  bool opening = false;                       // open not yet durable
  std::deque<std::function<void()>> deferred;  // requests that arrived while opening
  // The step being executed (index == rec.step_count()), and everyone
  // waiting for it (a trainer that timed out and asked again).
  bool running = false;
  v1::ExecRequest running_req;
  std::vector<StepPromise> waiters;
  std::deque<std::function<void()>> after_step;  // requests waiting for the running step (close)
  static constexpr const char* name = "session";
};

using Self = session_actor::stateful_pointer<SessionState>;

v1::SessionReply Reply(const Status& st, const v1::SessionRecord& rec) {
  v1::SessionReply r;
  ToProto(st, r.mutable_status());
  *r.mutable_session() = rec;
  return r;
}

v1::StepReply StepError(const Status& st) {
  v1::StepReply r;
  ToProto(st, r.mutable_status());
  return r;
}

std::string Quote(const google::protobuf::RepeatedPtrField<std::string>& argv) {
  std::string out = "[";
  for (int i = 0; i < argv.size(); ++i) out += (i ? ", '" : "'") + argv[i] + "'";
  return out + "]";
}

// Whether a replayed request is the one in the log: what the program sees
// (argv, env, cwd, stdin) must match; limits may differ (they are policy).
Status SameRequest(const std::string& session, uint64_t index, const v1::ExecRequest& logged,
                   const v1::ExecRequest& got) {
  std::string what;
  bool same_argv = logged.argv_size() == got.argv_size();
  for (int i = 0; same_argv && i < got.argv_size(); ++i) same_argv = logged.argv(i) == got.argv(i);
  std::map<std::string, std::string> env_a(logged.env().begin(), logged.env().end()),
      env_b(got.env().begin(), got.env().end());
  if (!same_argv)
    what = "argv " + Quote(got.argv()) + " vs logged " + Quote(logged.argv());
  else if (env_a != env_b)
    what = "env differs";
  else if (logged.cwd() != got.cwd())
    what = "cwd '" + got.cwd() + "' vs logged '" + logged.cwd() + "'";
  else if (logged.stdin() != got.stdin())
    what = "stdin differs";
  if (what.empty()) return Status::Ok();
  return Status::FailedPrecondition("session " + session + " step " + std::to_string(index) +
                                    ": the request differs from the logged one (" + what +
                                    "); a replayed rollout must resend the same requests");
}

void Persist(Self self, state::WriteBatch batch, std::function<void(const Status&)> then) {
  auto handle = caf::actor_cast<session_actor>(self);
  self->state.ctx->committer->Submit(std::move(batch), [handle, then](const Status& s) {
    Post(handle, [then, s] { then(s); });
  });
}

void PutRecord(Self self, state::WriteBatch* b) {
  auto& st = self->state;
  st.rec.set_updated_ms(NowMs());
  state::TypedTable<v1::SessionRecord>(st.ctx->store, state::Table::kSessions).Put(b, st.rec.name(), st.rec);
}

void FastForward(Self self, const v1::StepRequest& req, StepPromise rp) {
  auto& st = self->state;
  auto step = state::TypedTable<v1::StepRecord>(st.ctx->store, state::Table::kSteps)
                  .Get(state::StepKey(st.rec.name(), req.index()));
  if (!step.ok()) {
    rp.deliver(StepError(step.status().Annotate("session " + st.rec.name() + " step " +
                                                std::to_string(req.index()))));
    return;
  }
  Status same = SameRequest(st.rec.name(), req.index(), step->request(), req.exec());
  if (!same.ok()) {
    rp.deliver(StepError(same));
    return;
  }
  v1::StepReply r;
  *r.mutable_step() = std::move(*step);
  r.set_fast_forwarded(true);
  rp.deliver(std::move(r));
}

void Execute(Self self, const v1::StepRequest& req, StepPromise rp) {
  auto& st = self->state;
  v1::ExecRequest exec = req.exec();
  Status ok = drivers::CheckExecRequest(st.ctx->options.limits, exec);
  auto limits = ok.ok() ? drivers::EffectiveLimits(st.ctx->options.limits, st.rec.spec(), exec)
                        : Result<v1::Limits>(ok);
  if (!limits.ok()) {
    rp.deliver(StepError(limits.status().Annotate("session " + st.rec.name() + " step " +
                                                  std::to_string(req.index()))));
    return;
  }
  *exec.mutable_limits() = *limits;
  st.running = true;
  st.running_req = exec;
  st.waiters.push_back(std::move(rp));
  uint64_t index = req.index();
  int64_t started = NowMs();
  v1::SandboxRecord sandbox;
  sandbox.set_id(st.rec.name());
  *sandbox.mutable_spec() = st.rec.spec();
  auto handle = caf::actor_cast<session_actor>(self);
  std::string run_id = st.rec.name() + "#" + std::to_string(index);
  st.driver->Exec(sandbox, run_id, exec, [handle, self, index, started, exec](Result<v1::ExecResult> r) {
    Post(handle, [self, index, started, exec, r = std::move(r)]() mutable {
      auto& st = self->state;
      auto finish = [self](const v1::StepReply& reply) {
        auto& st = self->state;
        auto waiters = std::move(st.waiters);
        st.waiters.clear();
        st.running = false;
        for (auto& w : waiters) w.deliver(reply);
        auto after = std::move(st.after_step);
        st.after_step.clear();
        for (auto& f : after) f();
      };
      if (!r.ok()) {
        finish(StepError(r.status().Annotate("session " + st.rec.name() + " step " + std::to_string(index))));
        return;
      }
      v1::StepRecord step;
      step.set_session(st.rec.name());
      step.set_index(index);
      *step.mutable_request() = exec;
      *step.mutable_result() = std::move(*r);
      step.set_started_ms(started);
      step.set_finished_ms(NowMs());
      // Step and the new log length in one atomic, durable batch; the
      // trainer hears of the step only after it is on disk.
      state::WriteBatch b;
      state::TypedTable<v1::StepRecord>(st.ctx->store, state::Table::kSteps)
          .Put(&b, state::StepKey(st.rec.name(), index), step);
      v1::SessionRecord next = st.rec;
      next.set_step_count(index + 1);
      next.set_updated_ms(NowMs());
      state::TypedTable<v1::SessionRecord>(st.ctx->store, state::Table::kSessions).Put(&b, next.name(), next);
      Persist(self, std::move(b), [self, step, next, finish](const Status& w) {
        if (!w.ok()) {
          finish(StepError(w.Annotate("session " + next.name() + " step " + std::to_string(step.index()) +
                                      " ran but could not be logged")));
          return;
        }
        // Only the log length changed; a close that waited for this step
        // runs after it (finish), never in between.
        self->state.rec.set_step_count(step.index() + 1);
        self->state.rec.set_updated_ms(next.updated_ms());
        v1::StepReply reply;
        *reply.mutable_step() = step;
        finish(reply);
      });
    });
  });
}

void HandleStep(Self self, const v1::StepRequest& req, StepPromise rp) {
  auto& st = self->state;
  const std::string& name = st.rec.name();
  if (st.rec.phase() == v1::SESSION_PHASE_FAILED) {
    rp.deliver(StepError(Status::FailedPrecondition("session " + name + " failed (see the dsecd log); open a new session")));
    return;
  }
  if (st.rec.phase() != v1::SESSION_PHASE_OPEN) {
    rp.deliver(StepError(Status::FailedPrecondition("session " + name + " is closed; open a new session")));
    return;
  }
  uint64_t len = st.rec.step_count();
  if (req.index() < len) return FastForward(self, req, std::move(rp));
  if (req.index() == len && st.running) {
    Status same = SameRequest(name, req.index(), st.running_req, req.exec());
    if (!same.ok()) {
      rp.deliver(StepError(same));
      return;
    }
    st.waiters.push_back(std::move(rp));  // the same step, asked again: wait for it
    return;
  }
  if (req.index() == len) return Execute(self, req, std::move(rp));
  rp.deliver(StepError(Status::FailedPrecondition(
      "session " + name + ": step " + std::to_string(req.index()) + " is ahead of the log (" +
      std::to_string(len) + " step(s) logged" + (st.running ? ", step " + std::to_string(len) + " running" : "") +
      "; the next step is " + std::to_string(len) + "); send steps in order")));
}

// Closes once nothing is in between: after the open is durable and after a
// running step is logged, so the closed record always carries the full log
// length.
void CloseSession(Self self, caf::typed_response_promise<v1::SessionReply> rp) {
  auto& st = self->state;
  if (st.opening) {
    st.deferred.push_back([self, rp]() mutable { CloseSession(self, rp); });
    return;
  }
  if (st.running) {
    st.after_step.push_back([self, rp]() mutable { CloseSession(self, rp); });
    return;
  }
  if (st.rec.phase() != v1::SESSION_PHASE_OPEN) {
    rp.deliver(Reply(Status::Ok(), st.rec));
    return;
  }
  st.rec.set_phase(v1::SESSION_PHASE_CLOSED);
  state::WriteBatch b;
  PutRecord(self, &b);
  Persist(self, std::move(b), [self, rp](const Status& w) mutable {
    rp.deliver(Reply(w.Annotate("session " + self->state.rec.name() + ": close"), self->state.rec));
  });
}

session_actor::behavior_type Behavior(Self self) {
  ExitOnException(self, self->state.ctx->log, "session " + self->state.rec.name());
  return {
      [self](const v1::OpenSessionRequest& req) -> caf::result<v1::SessionReply> {
        auto& st = self->state;
        if (st.opening) {
          auto rp = self->make_response_promise<v1::SessionReply>();
          st.deferred.push_back([self, rp]() mutable {
            auto& rec = self->state.rec;
            rp.deliver(Reply(rec.phase() == v1::SESSION_PHASE_FAILED
                                 ? Status::Unavailable("session " + rec.name() + " could not be opened")
                                 : Status::Ok(),
                             rec));
          });
          return rp;
        }
        if (st.rec.phase() == v1::SESSION_PHASE_UNSPECIFIED) {
          // A new session: durable before it is acknowledged.
          // A refused open leaves nothing behind: not even this actor.
          auto d = st.ctx->DriverFor(req.spec());
          Status can = d.ok() ? (*d)->CanHandle(req.spec()) : d.status();
          if (can.ok() && (*d)->kind() != v1::KIND_FNCALL)
            can = Status::Unimplemented(std::string("sessions run on fncall sandboxes so far, not ") + (*d)->name() +
                                        "; create a " + (*d)->name() + " sandbox and exec in it instead");
          if (!can.ok()) {
            self->quit();
            return Reply(can.Annotate("session " + req.name()), st.rec);
          }
          st.driver = *d;
          st.driver_status = Status::Ok();
          st.rec.set_name(req.name());
          *st.rec.mutable_spec() = req.spec();
          st.rec.set_phase(v1::SESSION_PHASE_OPEN);
          st.rec.set_created_ms(NowMs());
          st.opening = true;
          auto rp = self->make_response_promise<v1::SessionReply>();
          state::WriteBatch b;
          PutRecord(self, &b);
          Persist(self, std::move(b), [self, rp](const Status& w) mutable {
            auto& st = self->state;
            st.opening = false;
            if (!w.ok()) st.rec.set_phase(v1::SESSION_PHASE_FAILED);
            rp.deliver(Reply(w.Annotate("session " + st.rec.name() + ": open"), st.rec));
            // Everyone who waited gets an answer, an error if the open failed.
            auto deferred = std::move(st.deferred);
            st.deferred.clear();
            for (auto& f : deferred) f();
            if (!w.ok()) self->quit();
          });
          return rp;
        }
        if (st.rec.phase() == v1::SESSION_PHASE_CLOSED)
          return Reply(Status::FailedPrecondition("session " + st.rec.name() +
                                                  " is closed (its log is kept); open a new session name"),
                       st.rec);
        // Re-open: idempotent, as long as the spec is the same one.
        if (!google::protobuf::util::MessageDifferencer::Equals(req.spec(), st.rec.spec()))
          return Reply(Status::FailedPrecondition("session " + st.rec.name() +
                                                  " already exists with a different spec; re-open it with "
                                                  "the same spec or use a new name"),
                       st.rec);
        return Reply(Status::Ok(), st.rec);
      },
      [self](const v1::StepRequest& req) -> caf::result<v1::StepReply> {
        auto& st = self->state;
        auto rp = self->make_response_promise<v1::StepReply>();
        if (!st.driver) {
          rp.deliver(StepError(st.driver_status));
        } else if (st.opening) {
          st.deferred.push_back([self, req, rp]() mutable { HandleStep(self, req, rp); });
        } else {
          HandleStep(self, req, rp);
        }
        return rp;
      },
      [self](const v1::CloseSessionRequest& req) -> caf::result<v1::SessionReply> {
        auto rp = self->make_response_promise<v1::SessionReply>();
        CloseSession(self, rp);
        return rp;
      },
      [self](const v1::GetSessionRequest&) { return Reply(Status::Ok(), self->state.rec); },
      [self](Continuation& c) { c.fn(); },
      [self](crash_atom) { InjectCrash(self->state.ctx->options.test_hooks); },
  };
}

session_actor::behavior_type SessionActor(Self self, std::shared_ptr<NodeContext> ctx,
                                          v1::SessionRecord record) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.rec = std::move(record);
  auto d = st.ctx->DriverFor(st.rec.spec());
  if (d.ok()) st.driver = *d;
  else st.driver_status = d.status();
  return Behavior(self);
}

}  // namespace

session_actor SpawnSession(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx,
                           v1::SessionRecord record) {
  return parent->spawn<caf::monitored>(SessionActor, std::move(ctx), std::move(record));
}

}  // namespace dsec
