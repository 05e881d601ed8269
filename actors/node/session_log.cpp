// The trajectory log of a session: steps run (or fast-forwarded from the
// log on replay), annotations, and reading the log back.
#include "actors/node/session_internal.hpp"

#include <map>

#include "drivers/guard/task_guard.hpp"
#include "dsec/status_proto.hpp"
#include "state/table.hpp"

namespace dsec::session_detail {

namespace {

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

}  // namespace

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
  // Read-ahead, best effort: a failed or short scan leaves the point lookup
  // below to find the step or report the store's error itself.
  Status ignored = steps.ScanFrom(state::StepPrefix(st.rec.name()), state::StepKey(st.rec.name(), index),
                       [&](const std::string&, v1::StepRecord&& rec) {
                         if (rec.index() >= st.rec.step_count()) return false;
                         bytes += rec.ByteSizeLong();
                         ahead.push_back(std::make_shared<v1::StepRecord>(std::move(rec)));
                         return ahead.size() < kReadAhead && bytes < st.steps.max_bytes() / 2;
                       });
  (void)ignored;
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

// The task guard's flags of `step`: what the agent sandbox now has changed
// under a protected path that was not flagged before (drivers/guard). Read
// from the sandbox's changes (its overlay's upper dir: the walk is over the
// changes only). A failure to read is logged, never fails the step.
// Refusals of the sandbox's network policy since the last step: a flag
// for the connections refused (with the last few, address and port) and
// one for the names (the record keeps the 32 most recent).
void AddNetworkFlags(Self self, const v1::SessionSandbox& role, drivers::Driver& d, v1::StepRecord* step) {
  auto& st = self->state;
  v1::SandboxRecord rec;
  rec.set_id(role.id());
  auto net = d.Network(rec);
  if (!net.ok()) return;  // no link (mode none): nothing to refuse
  auto& seen = st.refusals_seen[role.id()];
  uint64_t packets = net->refused_packets(), names = net->refused_names();
  // A counter below what was seen: made anew (a dsecd restart); all is new.
  uint64_t new_packets = packets >= seen.first ? packets - seen.first : packets;
  uint64_t new_names = names >= seen.second ? names - seen.second : names;
  seen = {packets, names};
  if (!new_packets && !new_names) return;
  std::string conns, refused_names;
  for (int i = net->recent_size() - 1; i >= 0; --i) {
    const std::string& w = net->recent(i).what();
    bool is_name = w.rfind("name ", 0) == 0;
    std::string& into = is_name ? refused_names : conns;
    if (into.size() < 200) into += (into.empty() ? "" : ", ") + (is_name ? w.substr(5) : w);
  }
  if (new_packets) {
    auto* f = step->add_flags();
    f->set_what("network_refused");
    f->set_evidence(std::to_string(new_packets) + " packet(s) refused" + (conns.empty() ? "" : " (latest: " + conns + ")"));
  }
  if (new_names) {
    auto* f = step->add_flags();
    f->set_what("name_refused");
    f->set_evidence(std::to_string(new_names) + " name(s) refused" +
                    (refused_names.empty() ? "" : " (latest: " + refused_names + ")"));
  }
}

// What grew in a sandbox's count since the last step, "name xN, ..." (at
// most `shown` names, then how many more); a count below what was seen
// was made anew (a dsecd restart): all of it is new.
std::string Growth(std::map<std::string, uint64_t> now, std::map<std::string, uint64_t>* seen, size_t shown,
                   uint64_t* total) {
  std::string out;
  size_t names = 0;
  for (const auto& [name, n] : now) {
    uint64_t before = seen->count(name) && (*seen)[name] <= n ? (*seen)[name] : 0;
    if (n <= before) continue;
    *total += n - before;
    if (names++ < shown) out += (out.empty() ? "" : ", ") + name + " x" + std::to_string(n - before);
  }
  if (names > shown) out += " and " + std::to_string(names - shown) + " more";
  *seen = std::move(now);
  return out;
}

// What the sandbox's seccomp filter denied since the last step (the clock
// set, a debugger, a mount or namespace tried: NotifiedSyscalls), by name;
// its writes refused by a read-only mount (a protected path), by call and
// path; its reads of its image's watched files (git-watch: the repository's
// history past the checked-out commit), by path.
void AddCountedFlags(Self self, const v1::SessionSandbox& role, drivers::Driver& d, v1::StepRecord* step) {
  auto& st = self->state;
  v1::SandboxRecord rec;
  rec.set_id(role.id());
  uint64_t calls = 0, reads = 0;
  d.SyncCounts(rec);
  std::string denied = Growth(d.DeniedCalls(rec), &st.denied_seen[role.id()], 64, &calls);
  if (!denied.empty()) {
    auto* f = step->add_flags();
    f->set_what("denied_syscall");
    f->set_evidence(denied);
  }
  uint64_t writes = 0;
  std::string refused = Growth(d.RefusedWrites(rec), &st.writes_seen[role.id()], 8, &writes);
  if (!refused.empty()) {
    auto* f = step->add_flags();
    f->set_what("write_refused");
    f->set_evidence(std::to_string(writes) + " write(s) refused by a read-only path (protected): " + refused);
  }
  std::string read = Growth(d.WatchedReads(rec), &st.watched_seen[role.id()], 8, &reads);
  if (!read.empty()) {
    auto* f = step->add_flags();
    f->set_what("watched_read");
    f->set_evidence(std::to_string(reads) + " read(s) of the image's watched files (git history past the "
                    "checked-out commit): " + read);
  }
}

void AddFlags(Self self, v1::StepRecord* step) {
  auto& st = self->state;
  const auto* role = FindRole(st.rec, step->sandbox());
  if (!role || role->id().empty()) return;
  if (auto d = st.ctx->kinds->DriverFor(role->spec()); d.ok()) AddCountedFlags(self, *role, **d, step);
  if (role->spec().network().mode() != v1::NETWORK_MODE_NONE &&
      role->spec().network().mode() != v1::NETWORK_MODE_UNSPECIFIED)
    if (auto d = st.ctx->kinds->DriverFor(role->spec()); d.ok()) AddNetworkFlags(self, *role, **d, step);
  if (!role->spec().has_task()) return;
  auto g = guard::ParseGuard(role->spec().task());
  if (!g.ok() || g->protect.empty()) return;
  auto d = st.ctx->kinds->DriverFor(role->spec());
  if (!d.ok()) return;
  v1::SandboxRecord rec;
  rec.set_id(role->id());
  auto diff = (*d)->Changes(rec);
  if (!diff.ok()) {
    st.ctx->log->warn("{}: the task guard could not read what the step changed: {}",
                      StepName(st.rec.name(), step->index()), diff.status().message());
    auto* f = step->add_flags();  // unread is not clean
    f->set_what("guard_unreadable");
    f->set_evidence(diff.status().message());
    return;
  }
  const std::string root = g->root.empty() ? "" : g->root.substr(1);
  constexpr int kMaxFlagsPerStep = 64;
  int more = 0;
  for (const auto& c : diff->changes) {
    std::string rel;
    bool gone = c.kind == guard::ChangeKind::kDeleted || c.kind == guard::ChangeKind::kReplaced;
    if (root.empty()) {
      rel = c.path;
    } else if (c.path.size() > root.size() && c.path.compare(0, root.size(), root) == 0 && c.path[root.size()] == '/') {
      rel = c.path.substr(root.size() + 1);
    } else if (gone && (c.path == root || root.compare(0, c.path.size() + 1, c.path + "/") == 0)) {
      rel = "";  // the task's root itself went (or what holds it)
    } else {
      continue;
    }
    if (!rel.empty() && !guard::FirstMatch(g->protect, rel)) continue;
    std::string evidence = std::string(guard::ChangeKindName(c.kind)) + " " + (rel.empty() ? "/" + c.path : rel);
    if (st.flagged.count(role->id() + "\n" + evidence)) continue;
    if (step->flags_size() >= kMaxFlagsPerStep) {
      ++more;  // not marked seen: named at a later step
      continue;
    }
    st.flagged.insert(role->id() + "\n" + evidence);
    auto* f = step->add_flags();
    f->set_what("protected_write");
    f->set_evidence(evidence);
  }
  if (more) {
    auto* f = step->add_flags();
    f->set_what("protected_write");
    f->set_evidence("and " + std::to_string(more) + " more protected paths changed");
  }
  if (diff->truncated) {
    auto* f = step->add_flags();
    f->set_what("changes_truncated");
    f->set_evidence("more than " + std::to_string(diff->changes.size()) + " changed paths: the rest not checked");
  }
  if (step->flags_size())
    st.ctx->log->warn("{}: the task guard flagged {} change(s) of protected paths",
                      StepName(st.rec.name(), step->index()), step->flags_size());
}

// The metrics of a logged step: its flags, and a grade's outcome.
void CountLogged(const v1::StepRecord& step) {
  for (const auto& f : step.flags()) metrics::Flags().At(metrics::Labels({{"what", f.what()}})).Add();
  if (step.sandbox() != kGradeRole) return;
  const auto& r = step.result();
  const char* outcome = r.verdict() == v1::VERDICT_OK && r.exit_code() == 0 ? "passed"
                        : r.verdict() == v1::VERDICT_OK || r.verdict() == v1::VERDICT_RUNTIME_ERROR ? "failed"
                        : r.verdict() == v1::VERDICT_TIME_LIMIT                                      ? "time_limit"
                        : r.verdict() == v1::VERDICT_MEMORY_LIMIT                                    ? "memory_limit"
                        : r.verdict() == v1::VERDICT_OUTPUT_LIMIT                                    ? "output_limit"
                                                                                                     : "platform_error";
  metrics::Grades().At(metrics::Labels({{"outcome", outcome}})).Add();
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
  step.set_not_replayable(req.not_replayable());
  step.set_started_ms(started);
  step.set_finished_ms(WallClockMs());
  AddFlags(self, &step);
  state::WriteBatch b;
  state::TypedTable<v1::StepRecord>(st.ctx->store, state::Table::kSteps)
      .Put(&b, state::StepKey(st.rec.name(), index), step);
  v1::SessionRecord next = st.rec;
  next.set_step_count(index + 1);
  next.set_flags(st.rec.flags() + static_cast<uint64_t>(step.flags_size()));
  next.set_updated_ms(WallClockMs());
  state::TypedTable<v1::SessionRecord>(st.ctx->store, state::Table::kSessions).Put(&b, next.name(), next);
  Persist(self, std::move(b), [self, step = std::move(step), next, finish](const Status& w) mutable {
    if (!w.ok()) {
      finish(StepError(w.Annotate(StepName(next.name(), step.index()) + " ran but could not be logged")));
      return;
    }
    // Only the log length changed; a close that waited for this step runs
    // after it (finish), never in between.
    self->state.rec.set_step_count(step.index() + 1);
    self->state.rec.set_flags(next.flags());
    self->state.rec.set_updated_ms(next.updated_ms());
    CountLogged(step);
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
  auto driver = st.ctx->kinds->DriverFor(role->spec());
  if (ok.ok() && !driver.ok()) ok = driver.status();
  auto limits = ok.ok() ? drivers::EffectiveLimits(st.ctx->options.limits, (*driver)->traits(), role->spec(), req.exec())
                        : Result<v1::Limits>(ok);
  if (!limits.ok()) {
    rp.deliver(StepError(limits.status().Annotate(name)));
    return;
  }
  st.running = true;
  st.running_req = req;
  st.waiters.push_back(std::move(rp));
  int64_t started = WallClockMs();
  if (role->id().empty()) {
    // A fncall role: every step is a fresh one-shot run.
    auto d = st.ctx->kinds->DriverFor(role->spec());
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
  if (req.index() == len && st.running && RoleOf(st.running_req) == kGradeRole) {
    rp.deliver(StepError(Status::FailedPrecondition(StepName(name, len) + " is a grade in progress; send step " +
                                                    std::to_string(len + 1) + " once it is logged")));
    return;
  }
  if (req.index() == len && !st.running && st.rec.grading() == len + 1) {
    rp.deliver(StepError(Status::FailedPrecondition(
        StepName(name, len) + " is a grade that began and was not logged (its grader may have run); grade again as "
                              "step " + std::to_string(len) + ": it runs once")));
    return;
  }
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

}  // namespace dsec::session_detail

namespace dsec {

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

}  // namespace dsec
