#include "actors/node/session.hpp"

#include <cctype>

#include <google/protobuf/util/message_differencer.h>

#include <deque>
#include <map>
#include <unordered_set>

#include "actors/node/context.hpp"
#include "actors/crash.hpp"
#include "actors/node/session_internal.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "state/table.hpp"

namespace dsec {
namespace session_detail {

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
  st.rec.set_updated_ms(WallClockMs());
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

void LeaseCheck(Self self, uint64_t gen);

// Milliseconds on the steady clock (lease arithmetic; never 0).
int64_t SteadyMs() { return SteadyClockMs() + 1; }

void ScheduleLeaseCheck(Self self, uint64_t gen, std::chrono::milliseconds after) {
  self->delayed_send(caf::actor_cast<session_actor>(self), after,
                     Continuation{[self, gen] { LeaseCheck(self, gen); }});
}

// Starts the lease clock: when it runs out with no trainer attached, the
// session closes. Any trainer's request stops it (lease_gen moves on); a
// call the controller forwarded pushes its end back (forwarded_ms).
void ArmLease(Self self) {
  auto& st = self->state;
  if (st.rec.phase() != v1::SESSION_PHASE_OPEN) return;
  // No trainer: nothing will read the cached steps soon (a trainer that
  // comes back to replay reads ahead from the store).
  st.steps.Clear();
  st.lease_armed = true;
  ScheduleLeaseCheck(self, ++st.lease_gen, std::chrono::seconds(st.rec.lease_s()));
}

void LeaseCheck(Self self, uint64_t gen) {
  auto& st = self->state;
  if (gen != st.lease_gen) return;
  st.lease_armed = false;
  if (!st.trainers.empty()) return;
  if (st.rec.phase() != v1::SESSION_PHASE_OPEN || st.closing) return;
  int64_t lease_ms = int64_t{st.rec.lease_s()} * 1000, idle_ms = SteadyMs() - st.forwarded_ms;
  if (st.forwarded_ms > 0 && (st.running || !st.waiters.empty())) {
    // A forwarded step longer than the lease: its trainer waits for it.
    st.forwarded_ms = SteadyMs();
    idle_ms = 0;
  }
  if (st.forwarded_ms > 0 && idle_ms < lease_ms) {  // the controller forwarded a call since: wait the rest
    st.lease_armed = true;
    return ScheduleLeaseCheck(self, gen, std::chrono::milliseconds(lease_ms - idle_ms));
  }
  st.ctx->log->info("session {}: no trainer for {} s (the lease); closing it", st.rec.name(), st.rec.lease_s());
  CloseSession(self, "lease expired: no trainer attached for " + std::to_string(st.rec.lease_s()) + " s", nullptr);
}

// The sender of the current message is a trainer: watch it, stop the lease.
// A call the controller forwarded (a cluster node's session opened through
// it, or a restartable one's steps) is the trainer's activity, but the
// controller outlives trainers: such a call pushes the lease's end back
// when no trainer is watched, instead of holding the session open for as
// long as the controller lives.
void Attach(Self self) {
  auto& st = self->state;
  const auto& sender = self->current_sender();
  if (!sender) return;
  std::string controller = st.ctx->controller_node->Get();
  if (!controller.empty() && caf::to_string(sender->node()) == controller) {
    st.forwarded_ms = SteadyMs();
    if (st.trainers.empty() && !st.lease_armed) ArmLease(self);
    return;
  }
  ++st.lease_gen;
  st.lease_armed = false;
  auto addr = caf::actor_cast<caf::actor_addr>(sender);
  if (st.trainers.insert(addr).second) self->monitor(caf::actor_cast<caf::actor>(sender));
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
  closed.set_closed_ms(WallClockMs());
  closed.set_updated_ms(WallClockMs());
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

// The first `fork.steps` steps of session `fork.session`'s log, as steps of
// `name` into `b`; the flags they hold, or why not (the source has fewer
// steps, or its log cannot be read).
Result<uint64_t> CopyLogPrefix(const NodeContext& ctx, const v1::SessionFork& fork, const std::string& name,
                               state::WriteBatch* b) {
  constexpr uint64_t kMaxForkSteps = 100000;
  if (fork.session() == name) return Status::InvalidArgument("a session cannot be a fork of itself");
  auto source = state::TypedTable<v1::SessionRecord>(ctx.store, state::Table::kSessions).Get(fork.session());
  if (!source.ok())
    return source.status().code() == Status::Code::kNotFound
               ? Status::NotFound("fork of session " + fork.session() + ": there is no such session on this node")
               : source.status();
  if (fork.steps() > source->step_count())
    return Status::InvalidArgument("fork of session " + fork.session() + " at step " + std::to_string(fork.steps()) +
                                   ": it has logged " + std::to_string(source->step_count()));
  if (fork.steps() > kMaxForkSteps)
    return Status::InvalidArgument("a fork copies at most " + std::to_string(kMaxForkSteps) + " logged steps");
  state::TypedTable<v1::StepRecord> steps(ctx.store, state::Table::kSteps);
  uint64_t next = 0, flags = 0;
  Status scanned = steps.Scan(state::StepPrefix(fork.session()), [&](const std::string&, v1::StepRecord&& step) {
    if (step.index() >= fork.steps()) return false;
    if (step.index() != next) return false;  // a hole: said below
    step.set_session(name);
    flags += static_cast<uint64_t>(step.flags_size());
    steps.Put(b, state::StepKey(name, next), step);
    ++next;
    return true;
  });
  if (!scanned.ok()) return scanned;
  if (next != fork.steps())
    return Status::Internal("fork of session " + fork.session() + ": its log has no step " + std::to_string(next));
  return flags;
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
  if (req.has_grade()) *rec.mutable_grade() = req.grade();
  for (const auto& [role, spec] : roles) {
    auto d = ctx.kinds->DriverFor(spec);
    can = d.ok() ? drivers::Admissible(ctx.options.limits, **d, spec) : d.status();
    if (can.ok() && role == kAgentRole && req.has_grade() && !(*d)->traits().carry)
      can = Status::InvalidArgument(std::string("a grade carries the agent sandbox's changes, which a ") +
                                    (*d)->name() + " sandbox cannot give; grade a container session");
    if (!can.ok()) {
      can = can.Annotate("sandbox '" + role + "'");
      break;
    }
    auto* sb = rec.add_sandboxes();
    sb->set_role(role);
    *sb->mutable_spec() = spec;
    if ((*d)->traits().stateful) sb->set_id("ss-" + RandomHex(12));
  }
  if (!can.ok()) {
    // A refused open leaves nothing behind: not even this actor.
    Quit(self);
    return Reply(can.Annotate("session " + req.name()), st.rec);
  }
  // A fork's log begins with its source's steps (written with the record).
  state::WriteBatch prefix;
  if (!req.fork_of().session().empty()) {
    auto copied = CopyLogPrefix(ctx, req.fork_of(), req.name(), &prefix);
    if (!copied.ok()) {
      Quit(self);
      return Reply(copied.status().Annotate("session " + req.name()), st.rec);
    }
    rec.set_step_count(req.fork_of().steps());
    rec.set_flags(*copied);
    rec.set_forked_from(req.fork_of().session());
    rec.set_forked_at(req.fork_of().steps());
  }
  rec.set_phase(v1::SESSION_PHASE_OPEN);
  rec.set_created_ms(WallClockMs());
  rec.set_lease_s(req.lease_s() ? req.lease_s() : ctx.options.session_lease_s);
  bool ready = true;
  for (const auto& sb : rec.sandboxes()) ready = ready && sb.id().empty();
  rec.set_ready(ready);
  st.rec = std::move(rec);
  st.opening = true;
  auto rp = self->make_response_promise<v1::SessionReply>();
  PutRecord(self, &prefix);
  Persist(self, std::move(prefix), [self, rp](const Status& w) mutable {
    auto& st = self->state;
    auto fail = [self, rp](const Status& s) mutable {
      auto& st = self->state;
      st.rec.set_phase(v1::SESSION_PHASE_FAILED);
      st.rec.set_error(s.message());
      // The node forgets this session before anyone hears: an open retried
      // at once must not be handed to this quitting actor (as in a close).
      if (auto gone = std::move(st.gone)) {
        st.gone = nullptr;
        gone();
      }
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
  if (!MessageDifferencer::Equals(req.grade(), rec.grade())) return false;
  if (req.more_sandboxes_size() + 1 != rec.sandboxes_size()) return false;
  for (int i = 0; i < req.more_sandboxes_size(); ++i) {
    const auto& a = req.more_sandboxes(i);
    const auto& b = rec.sandboxes(i + 1);
    if (a.role() != b.role() || !MessageDifferencer::Equals(a.spec(), b.spec())) return false;
  }
  return true;
}

caf::result<v1::SessionReply> Handle(Self self, v1::OpenSessionRequest& req) {
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
}

caf::result<v1::StepReply> Handle(Self self, v1::StepRequest& req) {
  auto& st = self->state;
  Attach(self);
  auto rp = self->make_response_promise<v1::StepReply>();
  if (st.opening)
    st.deferred.push_back([self, req, rp]() mutable { HandleStep(self, req, rp); });
  else
    HandleStep(self, req, rp);
  return rp;
}

caf::result<v1::StepReply> Handle(Self self, v1::GradeRequest& req) {
  auto& st = self->state;
  Attach(self);
  auto rp = self->make_response_promise<v1::StepReply>();
  if (st.opening)
    st.deferred.push_back([self, req, rp]() mutable { HandleGrade(self, req, rp); });
  else
    HandleGrade(self, req, rp);
  return rp;
}

caf::result<v1::StepReply> Handle(Self self, v1::AnnotateStepRequest& req) {
  Attach(self);
  auto rp = self->make_response_promise<v1::StepReply>();
  StartAnnotate(self, req, [rp](v1::StepReply r) mutable { rp.deliver(std::move(r)); });
  return rp;
}

v1::StepsReply Handle(Self self, v1::ListStepsRequest& req) {
  return ListStepsFromStore(*self->state.ctx, self->state.rec, req.from(), req.limit());
}

caf::result<v1::SessionReply> Handle(Self self, v1::CloseSessionRequest& req) {
  auto rp = self->make_response_promise<v1::SessionReply>();
  CloseSession(self, req.reason().empty() ? "closed by the trainer" : req.reason().substr(0, 256), &rp);
  return rp;
}

v1::SessionReply Handle(Self self, v1::GetSessionRequest&) { return Reply(Status::Ok(), self->state.rec); }

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
  // The table's calls for a session (wire/calls.hpp): each to its Handle.
  auto table = calls::Handlers(SessionCalls{}, [self](auto& req) { return Handle(self, req); });
  return calls::MakeBehavior<session_actor::behavior_type>(
      std::move(table),
      [self](LocalAnnotate& call) {
        // From the node on behalf of a batch: the batch's sender is the
        // trainer, attached through the node like any other caller.
        Attach(self);
        StartAnnotate(self, call.req, std::move(call.done));
      },
      [self](Continuation& c) { c.fn(); },
      [self](crash_atom) { InjectCrash(self->state.ctx->options.test_hooks); }
  );
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
    // A grade begun before the restart is finished first (session_grade.cpp).
    if (st.rec.grading()) st.deferred.push_back([self] { ResumeGrade(self); });
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

}  // namespace session_detail

using namespace session_detail;

Status CheckSessionName(const std::string& name) {
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
  return Status::Ok();
}

Status CheckOpenRequest(const NodeContext& ctx, const v1::OpenSessionRequest& req) {
  const std::string& name = req.name();
  if (Status s = CheckSessionName(name); !s.ok()) return s;
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
  if (Status g = CheckGradeSpec(ctx.options.limits, req); !g.ok()) return g;
  std::unordered_set<std::string> seen{kAgentRole};
  for (const auto& more : req.more_sandboxes()) {
    const std::string& role = more.role();
    bool ok = !role.empty() && role.size() <= 32;
    for (char c : role) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
    if (!ok)
      return Status::InvalidArgument("session " + name + ": sandbox role '" + role +
                                     "' must be 1-32 characters of [a-z0-9_-]");
    if (role == kGradeRole)
      return Status::InvalidArgument("session " + name + ": sandbox role 'grade' is reserved for Session.Grade's "
                                     "sandbox; name the role otherwise");
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
