#include "actors/session.hpp"

#include <cctype>

#include <google/protobuf/util/message_differencer.h>

#include <deque>
#include <map>
#include <unordered_set>

#include "actors/context.hpp"
#include "actors/crash.hpp"
#include "actors/step_cache.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

using StepPromise = caf::typed_response_promise<v1::StepReply>;
using SessionPromise = caf::typed_response_promise<v1::SessionReply>;

constexpr const char* kAgentRole = "agent";
constexpr int kMaxSandboxes = 8;
// How long the session waits for the node to create, run in or destroy a
// sandbox, beyond an exec's own time limit.
constexpr auto kNodeMargin = std::chrono::seconds(60);

struct SessionState {
  std::shared_ptr<NodeContext> ctx;
  entry_actor node;
  v1::SessionRecord rec;
  std::function<void()> gone;
  // Open (or the creation of its sandboxes) not finished: requests wait.
  bool opening = false;
  std::deque<std::function<void()>> deferred;
  // The step being executed (index == rec.step_count()), and everyone
  // waiting for it (a trainer that timed out and asked again).
  bool running = false;
  v1::StepRequest running_req;
  std::vector<StepPromise> waiters;
  std::deque<std::function<void()>> after_step;  // requests waiting for the running step
  bool closing = false;
  std::vector<SessionPromise> close_waiters;
  // Annotations whose write is in flight: later reads see them.
  std::map<uint64_t, std::pair<StepCache::Ptr, int>> annotated;
  // Steps logged, annotated or read lately: what is on disk, plus the
  // annotations in flight above (merged into the same records; dropped
  // again if their write fails).
  StepCache steps;
  // Trainers (their SDK actors) that opened or stepped, monitored.
  std::unordered_set<caf::actor_addr> trainers;
  uint64_t lease_gen = 0;
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

std::string StepName(const std::string& session, uint64_t index) {
  return "session " + session + " step " + std::to_string(index);
}

std::string Quote(const google::protobuf::RepeatedPtrField<std::string>& argv) {
  std::string out = "[";
  for (int i = 0; i < argv.size(); ++i) out += (i ? ", '" : "'") + argv[i] + "'";
  return out + "]";
}

// Whether a replayed request is the one in the log: the sandbox it runs in
// and what the program sees (argv, env, cwd, stdin) must match; limits may
// differ (they are policy), and so may the metadata.
Status SameRequest(const std::string& session, uint64_t index, const std::string& logged_role,
                   const v1::ExecRequest& logged, const std::string& got_role, const v1::ExecRequest& got) {
  std::string what;
  bool same_argv = logged.argv_size() == got.argv_size();
  for (int i = 0; same_argv && i < got.argv_size(); ++i) same_argv = logged.argv(i) == got.argv(i);
  std::map<std::string, std::string> env_a(logged.env().begin(), logged.env().end()),
      env_b(got.env().begin(), got.env().end());
  if (logged_role != got_role)
    what = "sandbox '" + got_role + "' vs logged '" + logged_role + "'";
  else if (!same_argv)
    what = "argv " + Quote(got.argv()) + " vs logged " + Quote(logged.argv());
  else if (env_a != env_b)
    what = "env differs";
  else if (logged.cwd() != got.cwd())
    what = "cwd '" + got.cwd() + "' vs logged '" + logged.cwd() + "'";
  else if (logged.stdin() != got.stdin())
    what = "stdin differs";
  if (what.empty()) return Status::Ok();
  return Status::FailedPrecondition(StepName(session, index) + ": the request differs from the logged one (" + what +
                                    "); a replayed rollout must resend the same requests");
}

std::string RoleOf(const v1::StepRequest& req) { return req.sandbox().empty() ? kAgentRole : req.sandbox(); }

const v1::SessionSandbox* FindRole(const v1::SessionRecord& rec, const std::string& role) {
  for (const auto& s : rec.sandboxes())
    if (s.role() == role) return &s;
  return nullptr;
}

void Persist(Self self, state::WriteBatch batch, std::function<void(const Status&)> then) {
  auto handle = caf::actor_cast<session_actor>(self);
  // Moved, not copied, on the way: `then` often holds a whole step record.
  self->state.ctx->committer->Submit(std::move(batch), [handle, then = std::move(then)](const Status& s) mutable {
    Post(handle, [then = std::move(then), s] { then(s); });
  });
}

void PutRecord(Self self, state::WriteBatch* b) {
  auto& st = self->state;
  st.rec.set_updated_ms(NowMs());
  state::TypedTable<v1::SessionRecord>(st.ctx->store, state::Table::kSessions).Put(b, st.rec.name(), st.rec);
}

void PersistRecord(Self self, std::function<void(const Status&)> then) {
  state::WriteBatch b;
  PutRecord(self, &b);
  Persist(self, std::move(b), std::move(then));
}

// Quits, after telling the node to forget this session (so nothing more is
// delegated to a quitting actor).
void Quit(Self self) {
  if (self->state.gone) self->state.gone();
  self->quit();
}

// Runs what waited for the open (or for the sandboxes to be created).
void OpenDone(Self self) {
  auto& st = self->state;
  st.opening = false;
  auto deferred = std::move(st.deferred);
  st.deferred.clear();
  for (auto& f : deferred) f();
}

// ---- lease ----------------------------------------------------------------

void CloseSession(Self self, std::string reason, SessionPromise* rp);

// Starts the lease clock: when it runs out with no trainer attached, the
// session closes. Any trainer's request stops it (lease_gen moves on).
void ArmLease(Self self) {
  auto& st = self->state;
  if (st.rec.phase() != v1::SESSION_PHASE_OPEN) return;
  // No trainer: nothing will read the cached steps soon (a trainer that
  // comes back to replay reads ahead from the store).
  st.steps.Clear();
  uint64_t gen = ++st.lease_gen;
  uint32_t secs = st.rec.lease_s();
  self->delayed_send(
      caf::actor_cast<session_actor>(self), std::chrono::seconds(secs), Continuation{[self, gen] {
        auto& st = self->state;
        if (gen != st.lease_gen || !st.trainers.empty()) return;
        if (st.rec.phase() != v1::SESSION_PHASE_OPEN || st.closing) return;
        st.ctx->log->info("session {}: no trainer for {} s (the lease); closing it", st.rec.name(), st.rec.lease_s());
        CloseSession(self, "lease expired: no trainer attached for " + std::to_string(st.rec.lease_s()) + " s",
                     nullptr);
      }});
}

// The sender of the current message is a trainer: watch it, stop the lease.
void Attach(Self self) {
  auto& st = self->state;
  const auto& sender = self->current_sender();
  if (!sender) return;
  auto addr = caf::actor_cast<caf::actor_addr>(sender);
  ++st.lease_gen;
  if (st.trainers.insert(addr).second) self->monitor(caf::actor_cast<caf::actor>(sender));
}

// ---- sandboxes ------------------------------------------------------------

// Creates the sandbox of role `i` under its chosen id, or finds it already
// there (an earlier attempt got that far). `done` gets Ok once it runs.
void EnsureSandbox(Self self, int i, int attempt, std::function<void(const Status&)> done) {
  auto& st = self->state;
  const auto& sb = st.rec.sandboxes(i);
  v1::CreateRequest req;
  *req.mutable_spec() = sb.spec();
  req.set_id(sb.id());
  req.set_session(st.rec.name());  // it ends with the session: no ttl, idle timeout or owner of its own
  std::string what = "session " + st.rec.name() + ": sandbox " + sb.id() + " (" + sb.role() + ")";
  self->request(st.node, kNodeMargin, std::move(req))
      .then(
          [self, i, attempt, done, what](v1::SandboxReply& r) {
            Status s = FromProto(r.status());
            if (s.ok()) return done(Status::Ok());
            auto phase = r.sandbox().phase();
            if (s.code() == Status::Code::kAlreadyExists) {
              if (phase == v1::SANDBOX_PHASE_RUNNING || phase == v1::SANDBOX_PHASE_PAUSED) return done(Status::Ok());
              if ((phase == v1::SANDBOX_PHASE_PENDING || phase == v1::SANDBOX_PHASE_STARTING) && attempt < 600) {
                // Still being created by an earlier attempt: look again soon.
                self->delayed_send(
                    caf::actor_cast<session_actor>(self), std::chrono::milliseconds(100),
                    Continuation{[self, i, attempt, done] { EnsureSandbox(self, i, attempt + 1, done); }});
                return;
              }
              return done(Status::Unavailable(what + " is " + PhaseName(phase) +
                                              (r.sandbox().error().empty() ? "" : ": " + r.sandbox().error())));
            }
            done(s.Annotate(what));
          },
          [done, what](caf::error& e) { done(Status::Unavailable(what + ": " + caf::to_string(e))); });
}

// Destroys every sandbox the session owns (best effort: a sandbox already
// gone is fine); `done` runs once all have answered.
void DestroySandboxes(Self self, std::function<void()> done) {
  auto& st = self->state;
  auto left = std::make_shared<int>(0);
  for (const auto& sb : st.rec.sandboxes())
    if (!sb.id().empty()) ++*left;
  if (*left == 0) return done();
  for (const auto& sb : st.rec.sandboxes()) {
    if (sb.id().empty()) continue;
    v1::DestroyRequest req;
    req.set_sandbox_id(sb.id());
    std::string id = sb.id();
    auto one = [self, left, done, id](const Status& s) {
      if (!s.ok() && s.code() != Status::Code::kNotFound)
        self->state.ctx->log->warn("session {}: destroying sandbox {}: {}", self->state.rec.name(), id, s.message());
      if (--*left == 0) done();
    };
    self->request(st.node, kNodeMargin, std::move(req))
        .then([one](v1::SandboxReply& r) { one(FromProto(r.status())); },
              [one](caf::error& e) { one(Status::Unavailable(caf::to_string(e))); });
  }
}

// Creates the sandboxes not created yet, then marks the session ready
// (durably). On failure nothing is left: what it created goes, and so does
// the record (no step can have run), so the trainer may simply retry the open.
void CreateSandboxes(Self self, std::function<void(const Status&)> done) {
  auto& st = self->state;
  auto left = std::make_shared<int>(0);
  auto first_error = std::make_shared<Status>(Status::Ok());
  for (const auto& sb : st.rec.sandboxes())
    if (!sb.id().empty()) ++*left;
  // Nothing of a failed open stays: its sandboxes, then its record.
  auto abandon = [self, done](const Status& why) {
    self->state.ctx->log->warn("{}", why.message());
    DestroySandboxes(self, [self, why, done] {
      auto& st = self->state;
      st.rec.set_phase(v1::SESSION_PHASE_FAILED);
      st.rec.set_error(why.message());
      state::WriteBatch b;
      b.Delete(state::Table::kSessions, st.rec.name());
      Persist(self, std::move(b), [why, done](const Status&) { done(why); });
    });
  };
  auto all_done = [self, first_error, done, abandon]() {
    auto& st = self->state;
    if (!first_error->ok()) return abandon(*first_error);
    st.rec.set_ready(true);
    PersistRecord(self, [self, done, abandon](const Status& w) {
      if (!w.ok()) return abandon(w.Annotate("session " + self->state.rec.name() + ": open"));
      done(Status::Ok());
    });
  };
  if (*left == 0) return all_done();
  for (int i = 0; i < st.rec.sandboxes_size(); ++i) {
    if (st.rec.sandboxes(i).id().empty()) continue;
    EnsureSandbox(self, i, 0, [left, first_error, all_done](const Status& s) {
      if (!s.ok() && first_error->ok()) *first_error = s;
      if (--*left == 0) all_done();
    });
  }
}

// ---- steps ----------------------------------------------------------------

// Steps read ahead from the store on a miss: a replaying trainer asks for
// them in order, and one scan is cheaper than a lookup each.
constexpr int kReadAhead = 32;

// A logged step: from an annotation in flight, else from the cache, else
// from the store (reading ahead into the cache).
Result<StepCache::Ptr> LoggedStep(Self self, uint64_t index) {
  auto& st = self->state;
  if (auto it = st.annotated.find(index); it != st.annotated.end()) return it->second.first;
  if (auto hit = st.steps.Find(index)) return hit;
  state::TypedTable<v1::StepRecord> steps(st.ctx->store, state::Table::kSteps);
  std::vector<StepCache::Ptr> ahead;
  size_t bytes = 0;
  // Best effort: a failed or short scan leaves the lookup below to report.
  (void)steps.ScanFrom(state::StepPrefix(st.rec.name()), state::StepKey(st.rec.name(), index),
                       [&](const std::string&, v1::StepRecord&& rec) {
                         if (rec.index() >= st.rec.step_count()) return false;
                         bytes += rec.ByteSizeLong();
                         ahead.push_back(std::make_shared<v1::StepRecord>(std::move(rec)));
                         return ahead.size() < kReadAhead && bytes < st.steps.max_bytes() / 2;
                       });
  for (auto it = ahead.rbegin(); it != ahead.rend(); ++it)
    if (!st.annotated.count((*it)->index())) st.steps.Put(*it);
  if (!ahead.empty() && ahead.front()->index() == index) return ahead.front();
  auto step = steps.Get(state::StepKey(st.rec.name(), index));
  if (!step.ok()) return step.status().Annotate(StepName(st.rec.name(), index));
  auto ptr = std::make_shared<v1::StepRecord>(std::move(*step));
  st.steps.Put(ptr);
  return ptr;
}

void FastForward(Self self, const v1::StepRequest& req, StepPromise rp) {
  auto& st = self->state;
  auto step = LoggedStep(self, req.index());
  if (!step.ok()) {
    rp.deliver(StepError(step.status()));
    return;
  }
  const v1::StepRecord& logged = **step;
  Status same = SameRequest(st.rec.name(), req.index(), logged.sandbox().empty() ? kAgentRole : logged.sandbox(),
                            logged.request(), RoleOf(req), req.exec());
  if (!same.ok()) {
    rp.deliver(StepError(same));
    return;
  }
  v1::StepReply r;
  *r.mutable_step() = logged;
  r.set_fast_forwarded(true);
  rp.deliver(std::move(r));
}

// Logs the step (the step row and the new log length in one atomic, durable
// batch) and answers everyone waiting for it. The trainer hears of a step
// only after it is on disk.
void LogStep(Self self, const v1::StepRequest& req, int64_t started, Result<v1::ExecResult> r) {
  auto& st = self->state;
  uint64_t index = req.index();
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
  if (!r.ok()) return finish(StepError(r.status().Annotate(StepName(st.rec.name(), index))));
  v1::StepRecord step;
  step.set_session(st.rec.name());
  step.set_index(index);
  step.set_sandbox(RoleOf(req));
  *step.mutable_request() = req.exec();
  step.mutable_request()->clear_sandbox_id();
  step.mutable_request()->clear_idempotency_key();
  step.mutable_request()->clear_stream();
  step.mutable_request()->clear_stream_id();
  *step.mutable_result() = std::move(*r);
  *step.mutable_meta() = req.meta();
  step.set_started_ms(started);
  step.set_finished_ms(NowMs());
  state::WriteBatch b;
  state::TypedTable<v1::StepRecord>(st.ctx->store, state::Table::kSteps)
      .Put(&b, state::StepKey(st.rec.name(), index), step);
  v1::SessionRecord next = st.rec;
  next.set_step_count(index + 1);
  next.set_updated_ms(NowMs());
  state::TypedTable<v1::SessionRecord>(st.ctx->store, state::Table::kSessions).Put(&b, next.name(), next);
  Persist(self, std::move(b), [self, step = std::move(step), next, finish](const Status& w) mutable {
    if (!w.ok()) {
      finish(StepError(w.Annotate(StepName(next.name(), step.index()) + " ran but could not be logged")));
      return;
    }
    // Only the log length changed; a close that waited for this step runs
    // after it (finish), never in between.
    self->state.rec.set_step_count(step.index() + 1);
    self->state.rec.set_updated_ms(next.updated_ms());
    v1::StepReply reply;
    *reply.mutable_step() = step;
    self->state.steps.Put(std::make_shared<v1::StepRecord>(std::move(step)));
    finish(reply);
  });
}

void Execute(Self self, const v1::StepRequest& req, StepPromise rp) {
  auto& st = self->state;
  const std::string name = StepName(st.rec.name(), req.index());
  const auto* role = FindRole(st.rec, RoleOf(req));
  if (!role) {
    std::string roles;
    for (const auto& s : st.rec.sandboxes()) roles += (roles.empty() ? "" : ", ") + s.role();
    {
      rp.deliver(StepError(Status::InvalidArgument(name + ": the session has no sandbox '" + RoleOf(req) +
                                                   "' (it has: " + roles + ")")));
      return;
    }
  }
  v1::ExecRequest plain = req.exec();
  plain.clear_idempotency_key();  // the session sets its own
  plain.clear_stream();
  Status ok = drivers::CheckExecRequest(st.ctx->options.limits, plain);
  auto limits =
      ok.ok() ? drivers::EffectiveLimits(st.ctx->options.limits, role->spec(), req.exec()) : Result<v1::Limits>(ok);
  if (!limits.ok()) {
    rp.deliver(StepError(limits.status().Annotate(name)));
    return;
  }
  st.running = true;
  st.running_req = req;
  st.waiters.push_back(std::move(rp));
  int64_t started = NowMs();
  if (role->id().empty()) {
    // A fncall role: every step is a fresh one-shot run.
    auto d = st.ctx->DriverFor(role->spec());
    if (!d.ok()) return LogStep(self, req, started, d.status());
    v1::ExecRequest exec = req.exec();
    *exec.mutable_limits() = *limits;
    v1::SandboxRecord sandbox;
    sandbox.set_id(st.rec.name());
    *sandbox.mutable_spec() = role->spec();
    auto handle = caf::actor_cast<session_actor>(self);
    std::string run_id = st.rec.name() + "#" + std::to_string(req.index());
    (*d)->Exec(sandbox, run_id, exec, [handle, self, req, started](Result<v1::ExecResult> r) {
      Post(handle, [self, req, started, r = std::move(r)]() mutable { LogStep(self, req, started, std::move(r)); });
    });
    return;
  }
  // A sandbox role: the exec goes to the sandbox's actor, through the node.
  // The key makes the sandbox run this step once, whatever happens to us:
  // after a crash (ours or dsecd's) the re-sent step collects the result of
  // the run already going or done in the sandbox's agent.
  v1::ExecRequest exec = req.exec();
  exec.set_sandbox_id(role->id());
  exec.set_stream(false);
  exec.set_idempotency_key(st.rec.name() + "#" + std::to_string(req.index()));
  auto timeout = std::chrono::milliseconds(limits->timeout_ms()) + kNodeMargin;
  std::string where = "sandbox '" + role->role() + "' (" + role->id() + ")";
  self->request(st.node, timeout, std::move(exec))
      .then(
          [self, req, started, where](v1::ExecReply& r) {
            if (r.status().code() == v1::Status::OK) return LogStep(self, req, started, std::move(*r.mutable_result()));
            Status s = FromProto(r.status());
            if (s.code() == Status::Code::kNotFound)
              s = Status::FailedPrecondition(where + " is gone (removed outside the session), and the environment "
                                                     "state with it; close this session and open a new one");
            else if (s.code() == Status::Code::kAlreadyExists)
              s = Status::FailedPrecondition("this step already ran in " + where +
                                             " with another request, and its result was not logged; resend the "
                                             "original request");
            LogStep(self, req, started, s);
          },
          [self, req, started, where](caf::error& e) {
            LogStep(self, req, started,
                    Status::Unavailable(where + " did not answer (" + caf::to_string(e) +
                                        "); resend the step: it runs at most once"));
          });
}

Status Serving(Self self) {
  auto& st = self->state;
  const std::string& name = st.rec.name();
  if (st.rec.phase() == v1::SESSION_PHASE_FAILED)
    return Status::FailedPrecondition("session " + name + " failed (" + st.rec.error() + "); open a new session");
  if (st.rec.phase() != v1::SESSION_PHASE_OPEN || st.closing)
    return Status::FailedPrecondition("session " + name + " is closed; open a new session");
  return Status::Ok();
}

void HandleStep(Self self, const v1::StepRequest& req, StepPromise rp) {
  auto& st = self->state;
  const std::string& name = st.rec.name();
  if (Status s = Serving(self); !s.ok()) {
    rp.deliver(StepError(s));
    return;
  }
  uint64_t len = st.rec.step_count();
  if (req.index() < len) return FastForward(self, req, std::move(rp));
  if (req.index() == len && st.running) {
    Status same =
        SameRequest(name, req.index(), RoleOf(st.running_req), st.running_req.exec(), RoleOf(req), req.exec());
    if (!same.ok()) {
      rp.deliver(StepError(same));
      return;
    }
    st.waiters.push_back(std::move(rp));  // the same step, asked again: wait for it
    return;
  }
  if (req.index() == len) return Execute(self, req, std::move(rp));
  rp.deliver(StepError(Status::FailedPrecondition(
      "session " + name + ": step " + std::to_string(req.index()) + " is ahead of the log (" + std::to_string(len) +
      " step(s) logged" + (st.running ? ", step " + std::to_string(len) + " running" : "") + "; the next step is " +
      std::to_string(len) + "); send steps in order")));
}

void MergeMeta(const v1::StepMeta& add, v1::StepMeta* into) {
  if (add.has_reward()) into->set_reward(add.reward());
  if (add.prompt_tokens()) into->set_prompt_tokens(add.prompt_tokens());
  if (add.completion_tokens()) into->set_completion_tokens(add.completion_tokens());
  for (const auto& [k, v] : add.notes()) (*into->mutable_notes())[k] = v;
}

// Where an annotation's answer goes: its CAF response promise, or the
// `done` of a LocalAnnotate from a batch.
using AnswerFn = std::function<void(v1::StepReply)>;

void Annotate(Self self, const v1::AnnotateStepRequest& req, AnswerFn answer) {
  auto& st = self->state;
  if (req.index() == st.rec.step_count() && st.running) {
    st.after_step.push_back([self, req, answer]() mutable { Annotate(self, req, std::move(answer)); });
    return;
  }
  if (req.index() >= st.rec.step_count()) {
    answer(StepError(Status::NotFound(StepName(st.rec.name(), req.index()) + " is not in the log (" +
                                          std::to_string(st.rec.step_count()) + " step(s) logged)")));
    return;
  }
  auto logged = LoggedStep(self, req.index());
  if (!logged.ok()) {
    answer(StepError(logged.status()));
    return;
  }
  // Merged in place: the record is the session's own (cache, in-flight
  // annotations), and later reads must see the annotation at once.
  StepCache::Ptr step = std::move(*logged);
  auto meta_before = static_cast<std::ptrdiff_t>(step->meta().SpaceUsedLong());
  MergeMeta(req.meta(), step->mutable_meta());
  auto& pending = st.annotated[req.index()];
  pending.first = step;
  ++pending.second;
  // Only the metadata changed: count its growth rather than the whole record.
  if (!st.steps.Grew(req.index(), static_cast<std::ptrdiff_t>(step->meta().SpaceUsedLong()) - meta_before))
    st.steps.Put(step);
  state::WriteBatch b;
  state::TypedTable<v1::StepRecord>(st.ctx->store, state::Table::kSteps)
      .Put(&b, state::StepKey(st.rec.name(), req.index()), *step);
  // The answer names the step and carries its metadata as this write logs
  // it: not the request and output, which the trainer has (Steps() reads
  // them back).
  v1::StepReply brief;
  brief.mutable_step()->set_session(st.rec.name());
  brief.mutable_step()->set_index(req.index());
  *brief.mutable_step()->mutable_meta() = step->meta();
  uint64_t index = req.index();
  Persist(self, std::move(b), [self, index, answer = std::move(answer), brief = std::move(brief)](const Status& w) mutable {
    auto& st = self->state;
    auto it = st.annotated.find(index);
    if (it != st.annotated.end() && --it->second.second == 0) {
      st.annotated.erase(it);
      // The cached record holds what this write carried; if that failed
      // (it may still have landed), read the store next time.
      if (!w.ok()) st.steps.Erase(index);
    }
    if (!w.ok()) {
      answer(StepError(w.Annotate(StepName(st.rec.name(), index) + ": annotate")));
      return;
    }
    answer(std::move(brief));
  });
}

void StartAnnotate(Self self, const v1::AnnotateStepRequest& req, AnswerFn answer) {
  auto go = [self, req, answer = std::move(answer)]() mutable {
    if (Status s = Serving(self); !s.ok()) {
      answer(StepError(s));
      return;
    }
    Annotate(self, req, std::move(answer));
  };
  if (self->state.opening)
    self->state.deferred.push_back(std::move(go));
  else
    go();
}

// Closes once nothing is in between: after the open is done and after a
// running step is logged, so the closed record carries the full log length.
// The sandboxes go first; then the closed record is written, the node
// forgets the session, everyone waiting hears, and the actor quits.
void CloseSession(Self self, std::string reason, SessionPromise* rp) {
  auto& st = self->state;
  if (rp) st.close_waiters.push_back(*rp);
  if (st.opening) {
    st.deferred.push_back([self, reason] { CloseSession(self, reason, nullptr); });
    return;
  }
  if (st.running) {
    st.after_step.push_back([self, reason] { CloseSession(self, reason, nullptr); });
    return;
  }
  auto answer = [self](const Status& s) {
    auto& st = self->state;
    auto waiters = std::move(st.close_waiters);
    st.close_waiters.clear();
    for (auto& w : waiters) w.deliver(Reply(s, st.rec));
  };
  if (st.rec.phase() != v1::SESSION_PHASE_OPEN) return answer(Status::Ok());
  if (st.closing) return;  // the close in progress answers everyone
  st.closing = true;
  // The closed record is durable before anything goes: a close that cannot
  // be written changes nothing. A sandbox whose destroy fails afterwards is
  // removed by the node's sweep (it belongs to a closed session).
  v1::SessionRecord closed = st.rec;
  closed.set_phase(v1::SESSION_PHASE_CLOSED);
  closed.set_close_reason(reason);
  closed.set_closed_ms(NowMs());
  closed.set_updated_ms(NowMs());
  state::WriteBatch b;
  state::TypedTable<v1::SessionRecord>(st.ctx->store, state::Table::kSessions).Put(&b, closed.name(), closed);
  Persist(self, std::move(b), [self, closed, answer](const Status& w) {
    auto& st = self->state;
    if (!w.ok()) {
      st.closing = false;
      return answer(w.Annotate("session " + st.rec.name() + ": close (nothing was closed; retry)"));
    }
    // Seen as closed once its sandboxes are gone too (steps are refused
    // meanwhile: `closing`).
    DestroySandboxes(self, [self, closed, answer] {
      self->state.rec = closed;
      if (self->state.gone) self->state.gone();
      answer(Status::Ok());
      self->quit();
    });
  });
}

// Starts a new session: the record (sandbox ids chosen) is durable first,
// then the sandboxes are created, then the open is answered.
caf::result<v1::SessionReply> OpenNew(Self self, const v1::OpenSessionRequest& req) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  std::vector<std::pair<std::string, v1::SandboxSpec>> roles{{kAgentRole, req.spec()}};
  for (const auto& more : req.more_sandboxes()) roles.emplace_back(more.role(), more.spec());
  Status can = Status::Ok();
  v1::SessionRecord rec;
  rec.set_name(req.name());
  *rec.mutable_spec() = req.spec();
  for (const auto& [role, spec] : roles) {
    auto d = ctx.DriverFor(spec);
    can = d.ok() ? (*d)->CanHandle(spec) : d.status();
    if (!can.ok()) {
      can = can.Annotate("sandbox '" + role + "'");
      break;
    }
    auto* sb = rec.add_sandboxes();
    sb->set_role(role);
    *sb->mutable_spec() = spec;
    if ((*d)->kind() != v1::KIND_FNCALL) sb->set_id("ss-" + RandomHex(12));
  }
  if (!can.ok()) {
    // A refused open leaves nothing behind: not even this actor.
    Quit(self);
    return Reply(can.Annotate("session " + req.name()), st.rec);
  }
  rec.set_phase(v1::SESSION_PHASE_OPEN);
  rec.set_created_ms(NowMs());
  rec.set_lease_s(req.lease_s() ? req.lease_s() : ctx.options.session_lease_s);
  bool ready = true;
  for (const auto& sb : rec.sandboxes()) ready = ready && sb.id().empty();
  rec.set_ready(ready);
  st.rec = std::move(rec);
  st.opening = true;
  auto rp = self->make_response_promise<v1::SessionReply>();
  PersistRecord(self, [self, rp](const Status& w) mutable {
    auto& st = self->state;
    auto fail = [self, rp](const Status& s) mutable {
      auto& st = self->state;
      st.rec.set_phase(v1::SESSION_PHASE_FAILED);
      st.rec.set_error(s.message());
      rp.deliver(Reply(s, st.rec));
      OpenDone(self);  // everyone who waited hears the failure
      Quit(self);
    };
    if (!w.ok()) return fail(w.Annotate("session " + st.rec.name() + ": open"));
    // Opened without a trainer to watch (no sender): the lease runs now.
    if (st.trainers.empty()) ArmLease(self);
    if (st.rec.ready()) {
      rp.deliver(Reply(Status::Ok(), st.rec));
      return OpenDone(self);
    }
    CreateSandboxes(self, [self, rp, fail](const Status& s) mutable {
      if (!s.ok()) return fail(s);
      rp.deliver(Reply(Status::Ok(), self->state.rec));
      OpenDone(self);
    });
  });
  return rp;
}

bool SameSpecs(const v1::OpenSessionRequest& req, const v1::SessionRecord& rec) {
  using google::protobuf::util::MessageDifferencer;
  if (!MessageDifferencer::Equals(req.spec(), rec.spec())) return false;
  if (req.more_sandboxes_size() + 1 != rec.sandboxes_size()) return false;
  for (int i = 0; i < req.more_sandboxes_size(); ++i) {
    const auto& a = req.more_sandboxes(i);
    const auto& b = rec.sandboxes(i + 1);
    if (a.role() != b.role() || !MessageDifferencer::Equals(a.spec(), b.spec())) return false;
  }
  return true;
}

session_actor::behavior_type Behavior(Self self) {
  // A crash answers the trainers waiting for the running step at once, so
  // they re-send it to the restarted actor (which collects the run already
  // going in the sandbox) instead of waiting out their timeouts.
  ExitOnException(self, self->state.ctx->log, "session " + self->state.rec.name(), [self](const std::string& what) {
    auto& st = self->state;
    auto waiters = std::move(st.waiters);
    st.waiters.clear();
    for (auto& w : waiters)
      w.deliver(StepError(Status::Unavailable("session " + st.rec.name() + " crashed (" + what +
                                              ") and is restarted from its log; resend the step: it runs once")));
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.trainers.erase(dm.source) && st.trainers.empty()) ArmLease(self);
  });
  return {
      [self](const v1::OpenSessionRequest& req) -> caf::result<v1::SessionReply> {
        auto& st = self->state;
        Attach(self);
        if (st.opening) {
          auto rp = self->make_response_promise<v1::SessionReply>();
          st.deferred.push_back([self, req, rp]() mutable {
            auto& rec = self->state.rec;
            if (rec.phase() == v1::SESSION_PHASE_FAILED) {
              rp.deliver(
                  Reply(Status::Unavailable("session " + rec.name() + " could not be opened: " + rec.error()), rec));
              return;
            }
            rp.deliver(Reply(SameSpecs(req, rec)
                                 ? Status::Ok()
                                 : Status::FailedPrecondition("session " + rec.name() +
                                                              " already exists with different specs; re-open it with "
                                                              "the same specs or use a new name"),
                             rec));
          });
          return rp;
        }
        if (st.rec.phase() == v1::SESSION_PHASE_UNSPECIFIED) return OpenNew(self, req);
        if (Status s = Serving(self); !s.ok()) return Reply(s, st.rec);
        // Re-open: idempotent, as long as the specs are the same ones.
        if (!SameSpecs(req, st.rec))
          return Reply(Status::FailedPrecondition("session " + st.rec.name() +
                                                  " already exists with different specs; re-open it with the "
                                                  "same specs or use a new name"),
                       st.rec);
        return Reply(Status::Ok(), st.rec);
      },
      [self](const v1::StepRequest& req) -> caf::result<v1::StepReply> {
        auto& st = self->state;
        Attach(self);
        auto rp = self->make_response_promise<v1::StepReply>();
        if (st.opening)
          st.deferred.push_back([self, req, rp]() mutable { HandleStep(self, req, rp); });
        else
          HandleStep(self, req, rp);
        return rp;
      },
      [self](const v1::AnnotateStepRequest& req) -> caf::result<v1::StepReply> {
        Attach(self);
        auto rp = self->make_response_promise<v1::StepReply>();
        StartAnnotate(self, req, [rp](v1::StepReply r) mutable { rp.deliver(std::move(r)); });
        return rp;
      },
      [self](LocalAnnotate& call) {
        // From the node on behalf of a batch: the batch's sender is the
        // trainer, attached through the node like any other caller.
        Attach(self);
        StartAnnotate(self, call.req, std::move(call.done));
      },
      [self](const v1::ListStepsRequest& req) -> v1::StepsReply {
        return ListStepsFromStore(*self->state.ctx, self->state.rec, req.from(), req.limit());
      },
      [self](const v1::CloseSessionRequest& req) -> caf::result<v1::SessionReply> {
        auto rp = self->make_response_promise<v1::SessionReply>();
        CloseSession(self, req.reason().empty() ? "closed by the trainer" : req.reason().substr(0, 256), &rp);
        return rp;
      },
      [self](const v1::GetSessionRequest&) { return Reply(Status::Ok(), self->state.rec); },
      [self](Continuation& c) { c.fn(); },
      [self](crash_atom) { InjectCrash(self->state.ctx->options.test_hooks); },
  };
}

session_actor::behavior_type SessionActor(Self self, std::shared_ptr<NodeContext> ctx, entry_actor node,
                                          v1::SessionRecord record, std::function<void()> gone) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.node = std::move(node);
  st.rec = std::move(record);
  st.gone = std::move(gone);
  if (st.rec.phase() == v1::SESSION_PHASE_UNSPECIFIED) return Behavior(self);
  // Records from before sessions owned sandboxes: one fncall role.
  if (st.rec.sandboxes_size() == 0) {
    auto* sb = st.rec.add_sandboxes();
    sb->set_role(kAgentRole);
    *sb->mutable_spec() = st.rec.spec();
    st.rec.set_ready(true);
  }
  if (!st.rec.lease_s()) st.rec.set_lease_s(st.ctx->options.session_lease_s);
  if (st.rec.phase() == v1::SESSION_PHASE_OPEN) {
    ArmLease(self);  // restored: no trainer yet; one has the lease to come back
    // Restarted after a crash of this actor, the writes of the crashed one
    // may still be queued in the committer: requests wait behind an empty
    // write (first in, first out) so no older step is read into the cache.
    st.opening = true;
    Persist(self, state::WriteBatch{}, [self](const Status&) {
      if (self->state.rec.ready()) return OpenDone(self);
      // Restored before its sandboxes were all created: finish that first.
      CreateSandboxes(self, [self](const Status& s) {
        if (!s.ok()) self->state.ctx->log->warn("session {}: {}", self->state.rec.name(), s.message());
        OpenDone(self);
        if (!s.ok()) Quit(self);
      });
    });
  } else if (st.rec.phase() == v1::SESSION_PHASE_FAILED) {
    // Left failed (by the supervisor): its sandboxes go, its log stays.
    DestroySandboxes(self, [self] { Quit(self); });
  }
  return Behavior(self);
}

}  // namespace

v1::StepsReply ListStepsFromStore(NodeContext& ctx, const v1::SessionRecord& rec, uint64_t from, uint32_t limit) {
  v1::StepsReply reply;
  *reply.mutable_session() = rec;
  if (limit == 0 || limit > 1000) limit = 1000;
  // A page stays well under a frame: steps carry up to 2 x 16 MiB of output.
  constexpr size_t kPageBytes = 16 << 20;
  size_t bytes = 0;
  Status s = state::TypedTable<v1::StepRecord>(ctx.store, state::Table::kSteps)
                 .ScanFrom(state::StepPrefix(rec.name()), state::StepKey(rec.name(), from),
                           [&](const std::string&, v1::StepRecord&& step) {
                   size_t size = step.ByteSizeLong();
                   if (reply.steps_size() > 0 && bytes + size > kPageBytes) return false;
                   bytes += size;
                   *reply.add_steps() = std::move(step);
                   return reply.steps_size() < static_cast<int>(limit);
                 });
  ToProto(s.Annotate("session " + rec.name() + ": reading its log"), reply.mutable_status());
  return reply;
}

Status CheckOpenRequest(const NodeContext& ctx, const v1::OpenSessionRequest& req) {
  const std::string& name = req.name();
  if (name.empty()) return Status::InvalidArgument("session name is empty (use job/prompt/sample)");
  if (name.size() > 512)
    return Status::InvalidArgument("session name is " + std::to_string(name.size()) + " bytes; the limit is 512");
  // Names travel as words (the console splits its lines on spaces) and in
  // file names of exports: no spaces, quotes or shell characters.
  bool ok = name[0] != '-' && name[0] != '/';
  for (unsigned char c : name)
    ok = ok && (std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/' || c == ':' || c == '@' ||
                c == '+' || c == '=');
  if (!ok)
    return Status::InvalidArgument("session name '" + name.substr(0, 64) +
                                   "' must be characters of [A-Za-z0-9._/:@+=-], not starting with '-' or '/' "
                                   "(e.g. job/prompt/sample)");
  if (req.more_sandboxes_size() + 1 > kMaxSandboxes)
    return Status::InvalidArgument("session " + name + ": " + std::to_string(req.more_sandboxes_size() + 1) +
                                   " sandboxes; the limit is " + std::to_string(kMaxSandboxes));
  if (req.lease_s() > 7u * 24 * 3600)
    return Status::InvalidArgument("session " + name + ": a lease of " + std::to_string(req.lease_s()) +
                                   " s is more than the limit of 7 days");
  // A session's sandboxes end with it (its lease, its close).
  auto lifetime = [&name](const v1::SandboxSpec& spec, const std::string& role) {
    if (!spec.has_ttl_s() && !spec.has_idle_timeout_s() && spec.on_idle() == v1::IDLE_ACTION_UNSPECIFIED)
      return Status::Ok();
    return Status::InvalidArgument("session " + name + ": sandbox '" + role +
                                   "' asks for a ttl or an idle timeout; a session's sandboxes end with the "
                                   "session (its lease, its close): leave them out");
  };
  Status s = drivers::CheckSpec(ctx.options.limits, req.spec()).Annotate("session " + name + ": sandbox 'agent'");
  if (s.ok()) s = lifetime(req.spec(), "agent");
  if (!s.ok()) return s;
  std::unordered_set<std::string> seen{kAgentRole};
  for (const auto& more : req.more_sandboxes()) {
    const std::string& role = more.role();
    bool ok = !role.empty() && role.size() <= 32;
    for (char c : role) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
    if (!ok)
      return Status::InvalidArgument("session " + name + ": sandbox role '" + role +
                                     "' must be 1-32 characters of [a-z0-9_-]");
    if (!seen.insert(role).second)
      return Status::InvalidArgument("session " + name + ": sandbox role '" + role + "' is given twice" +
                                     (role == kAgentRole ? " ('agent' is the spec the session is opened with)" : ""));
    s = drivers::CheckSpec(ctx.options.limits, more.spec()).Annotate("session " + name + ": sandbox '" + role + "'");
    if (s.ok()) s = lifetime(more.spec(), role);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

session_actor SpawnSession(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx, entry_actor node,
                           v1::SessionRecord record, std::function<void()> gone) {
  return parent->spawn<caf::monitored>(SessionActor, std::move(ctx), std::move(node), std::move(record),
                                       std::move(gone));
}

}  // namespace dsec
