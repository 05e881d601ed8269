// Session.Grade (DESIGN.md section 13): the session's work graded in a
// fresh sandbox on the agent's image that gets the agent's changes under
// the task root (protected and hidden paths as the image has them; the
// container driver's CarryLayers) and the grader image's files, runs the
// grade command there and logs it as a step in role "grade" with its
// reward. The agent's sandbox goes on untouched.
//
// Once, across crashes: the record's `grading` mark is durable before the
// grade's sandbox is made (under an id of its own, chosen from the step),
// the command runs under the step's idempotency key, and the mark goes only
// after the step is logged and the sandbox removed. A restart with the mark
// finishes what it stood for: runs (or collects) the grade, or removes the
// sandbox of one already logged.
#include <cmath>
#include <cstdlib>

#include "actors/node/session_internal.hpp"
#include "drivers/limits.hpp"
#include "dsec/status_proto.hpp"

namespace dsec::session_detail {

namespace {

constexpr uint32_t kDefaultGradeTimeoutS = 600;

// The step a grade logs: its command, run in the task's root.
v1::StepRequest GradeStep(const v1::SessionRecord& rec, uint64_t index, uint64_t max_ms) {
  v1::StepRequest req;
  req.set_session(rec.name());
  req.set_index(index);
  req.set_sandbox(kGradeRole);
  auto* exec = req.mutable_exec();
  for (const auto& a : rec.grade().command()) exec->add_argv(a);
  exec->set_cwd(rec.spec().task().root());
  uint64_t ms = uint64_t{rec.grade().timeout_s() ? rec.grade().timeout_s() : kDefaultGradeTimeoutS} * 1000;
  exec->mutable_limits()->set_timeout_ms(max_ms ? std::min(ms, max_ms) : ms);
  return req;
}

// The grade sandbox: the agent's spec without its guard, the grading
// phase's network, and what it carries.
v1::SandboxSpec GradeSandboxSpec(const v1::SessionRecord& rec) {
  v1::SandboxSpec spec = rec.spec();
  spec.clear_task();
  *spec.mutable_network() = rec.grade().network();
  if (spec.network().mode() == v1::NETWORK_MODE_UNSPECIFIED) spec.mutable_network()->set_mode(v1::NETWORK_MODE_NONE);
  auto* carry = spec.mutable_carry();
  carry->set_sandbox_id(FindRole(rec, kAgentRole)->id());
  *carry->mutable_task() = rec.spec().task();
  carry->set_grader_image(rec.grade().grader_image());
  if (!rec.spec().task().root().empty()) spec.set_workdir(rec.spec().task().root());
  return spec;
}

// The reward of a grade's run: the last line of its output when that is a
// number; else 1 for exit status 0, 0 for anything else. Noted as
// notes["grade"].
void Score(const v1::ExecResult& r, v1::StepMeta* meta) {
  std::string note;
  double reward = 0;
  bool ran = r.verdict() == v1::VERDICT_OK || r.verdict() == v1::VERDICT_RUNTIME_ERROR;
  if (ran) {
    bool passed = r.verdict() == v1::VERDICT_OK && r.exit_code() == 0;
    reward = passed ? 1 : 0;
    note = passed ? "passed" : r.signal() ? "failed (signal " + std::to_string(r.signal()) + ")"
                                          : "failed (exit status " + std::to_string(r.exit_code()) + ")";
    std::string out = r.stdout();
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\r')) out.pop_back();
    std::string last = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    char* end = nullptr;
    double v = last.empty() || last.size() > 32 ? 0 : std::strtod(last.c_str(), &end);
    if (end && *end == 0 && std::isfinite(v)) {
      reward = v;
      note += ", reward from its last line";
    }
  } else if (r.verdict() == v1::VERDICT_TIME_LIMIT) {
    note = "cut at its time limit";
  } else if (r.verdict() == v1::VERDICT_MEMORY_LIMIT) {
    note = "killed by its memory limit";
  } else if (r.verdict() == v1::VERDICT_OUTPUT_LIMIT) {
    note = "killed past its output limit";
  } else {
    note = "the platform failed: " + r.error();
  }
  meta->set_reward(reward);
  (*meta->mutable_notes())["grade"] = note;
}

void RunGrade(Self self, v1::StepRequest req, int64_t started);
void CreateGradeSandbox(Self self, v1::StepRequest req, int64_t started, int attempt);

// Removes the grade sandbox of step `index`, then the record's mark.
void EndGrade(Self self, uint64_t index, std::function<void()> then) {
  auto& st = self->state;
  v1::DestroyRequest d;
  d.set_sandbox_id(GradeSandboxId(st.rec, index));
  d.set_reason("its grade (step " + std::to_string(index) + ") is over");
  auto clear = [self, index, then](const Status& s) {
    auto& st = self->state;
    if (!s.ok() && s.code() != Status::Code::kNotFound) {
      st.ctx->log->warn("{}: removing its grade sandbox: {} (the mark stays; removed at the next start)",
                        StepName(st.rec.name(), index), s.message());
      return then();
    }
    if (st.rec.grading() != index + 1) return then();
    st.rec.set_grading(0);
    // Written now only when no other write of the record can be in flight
    // (a step being logged, a close): else the next one carries it, and a
    // restart before that removes a sandbox already gone.
    if (st.running || st.closing || st.rec.phase() != v1::SESSION_PHASE_OPEN) return then();
    PersistRecord(self, [then](const Status&) { then(); });
  };
  self->request(st.node, kNodeMargin, std::move(d))
      .then([clear](v1::SandboxReply& r) { clear(FromProto(r.status())); },
            [clear](caf::error& e) { clear(Status::Unavailable(caf::to_string(e))); });
}

// A grade that could not start: nothing ran; its sandbox (if any) and
// mark go, and the waiters hear why.
void GradeNotStarted(Self self, const v1::StepRequest& req, int64_t started, const Status& why) {
  EndGrade(self, req.index(), [self, req, started, why] { LogStep(self, req, started, why); });
}

void CreateGradeSandbox(Self self, v1::StepRequest req, int64_t started, int attempt) {
  auto& st = self->state;
  v1::CreateRequest c;
  *c.mutable_spec() = GradeSandboxSpec(st.rec);
  c.set_id(GradeSandboxId(st.rec, req.index()));
  c.set_session(st.rec.name());
  std::string what = StepName(st.rec.name(), req.index()) + ": the grade sandbox " + c.id();
  // Its creation copies the agent's changes and the grader's files.
  self->request(st.node, kNodeMargin * 10, std::move(c))
      .then(
          [self, req, started, attempt, what](v1::SandboxReply& r) {
            Status s = FromProto(r.status());
            auto phase = r.sandbox().phase();
            if (s.ok() || (s.code() == Status::Code::kAlreadyExists && phase == v1::SANDBOX_PHASE_RUNNING))
              return RunGrade(self, req, started);
            bool making = phase == v1::SANDBOX_PHASE_PENDING || phase == v1::SANDBOX_PHASE_STARTING;
            if (s.code() == Status::Code::kAlreadyExists && making && attempt >= 6000)
              return LogStep(self, req, started,
                             Status::Unavailable(what + " is still being made after 10 minutes; grade again later: it "
                                                        "runs once"));
            if (s.code() == Status::Code::kAlreadyExists && making) {
              self->delayed_send(caf::actor_cast<session_actor>(self), std::chrono::milliseconds(100),
                                 Continuation{[self, req, started, attempt] {
                                   CreateGradeSandbox(self, req, started, attempt + 1);
                                 }});
              return;
            }
            if (s.ok() || s.code() == Status::Code::kAlreadyExists)
              s = Status::Unavailable(std::string("it is ") + PhaseName(phase) +
                                      (r.sandbox().error().empty() ? "" : ": " + r.sandbox().error()));
            GradeNotStarted(self, req, started, s.Annotate(what));
          },
          [self, req, started, what](caf::error& e) {
            // Unknown whether it was made: the mark stays, a retry finds out.
            LogStep(self, req, started,
                    Status::Unavailable(what + " did not answer (" + caf::to_string(e) + "); grade again: it runs once"));
          });
}

void RunGrade(Self self, v1::StepRequest req, int64_t started) {
  auto& st = self->state;
  v1::ExecRequest exec = req.exec();
  exec.set_sandbox_id(GradeSandboxId(st.rec, req.index()));
  exec.set_idempotency_key(st.rec.name() + "#" + std::to_string(req.index()));
  auto timeout = std::chrono::milliseconds(exec.limits().timeout_ms()) + kNodeMargin;
  uint64_t index = req.index();
  self->request(st.node, timeout, std::move(exec))
      .then(
          [self, req, started, index](v1::ExecReply& r) mutable {
            Status s = FromProto(r.status());
            if (!s.ok())
              return LogStep(self, req, started, s.Annotate(StepName(self->state.rec.name(), index) + ": the grade"));
            Score(r.result(), req.mutable_meta());
            // Once logged, its sandbox goes (a close waiting for the step comes after).
            self->state.after_step.push_front([self, index] {
              if (self->state.rec.step_count() > index) EndGrade(self, index, [] {});
            });
            LogStep(self, req, started, std::move(*r.mutable_result()));
          },
          [self, req, started, index](caf::error& e) {
            LogStep(self, req, started,
                    Status::Unavailable(StepName(self->state.rec.name(), index) + ": the grade sandbox did not answer (" +
                                        caf::to_string(e) + "); grade again: it runs once"));
          });
}

// Starts (or, after a restart, resumes) the grade at the log's end.
void StartGrade(Self self, uint64_t index) {
  auto& st = self->state;
  st.running = true;
  st.running_req = GradeStep(st.rec, index, st.ctx->options.limits.maxima.timeout_ms());
  if (st.rec.grading() && st.rec.grading() != index + 1) {
    // A grade of an earlier step that never got logged: its sandbox goes
    // first (`running` keeps everything else waiting meanwhile).
    uint64_t stale = st.rec.grading() - 1;
    return EndGrade(self, stale, [self, index] {
      self->state.rec.set_grading(0);
      StartGrade(self, index);
    });
  }
  int64_t started = WallClockMs();
  v1::StepRequest req = st.running_req;
  if (st.rec.grading() == index + 1) return CreateGradeSandbox(self, req, started, 0);
  st.rec.set_grading(index + 1);
  PersistRecord(self, [self, req, started](const Status& w) {
    if (!w.ok()) {
      self->state.rec.set_grading(0);
      return LogStep(self, req, started, w.Annotate(StepName(self->state.rec.name(), req.index()) + ": grade"));
    }
    CreateGradeSandbox(self, req, started, 0);
  });
}

}  // namespace

void HandleGrade(Self self, const v1::GradeRequest& req, StepPromise rp) {
  auto& st = self->state;
  const std::string& name = st.rec.name();
  if (Status s = Serving(self); !s.ok()) return rp.deliver(StepError(s.Annotate("grade")));
  if (!st.rec.has_grade())
    return rp.deliver(StepError(Status::FailedPrecondition(
        "session " + name + " was opened without a grade spec (OpenSessionRequest.grade: its command, timeout, "
        "network and grader image); open a session with one")));
  uint64_t len = st.rec.step_count();
  if (req.index() < len) {
    auto step = LoggedStep(self, req.index());
    if (!step.ok()) return rp.deliver(StepError(step.status()));
    if ((*step)->sandbox() != kGradeRole)
      return rp.deliver(StepError(Status::FailedPrecondition(
          StepName(name, req.index()) + " is not a grade (it ran in '" + (*step)->sandbox() +
          "'); grade at the log's end (step " + std::to_string(len) + ")")));
    v1::StepReply r;
    *r.mutable_step() = **step;
    r.set_fast_forwarded(true);
    return rp.deliver(std::move(r));
  }
  if (req.index() == len && st.running) {
    if (RoleOf(st.running_req) == kGradeRole) return st.waiters.push_back(std::move(rp));
    return rp.deliver(StepError(Status::FailedPrecondition(
        StepName(name, req.index()) + " is running in '" + RoleOf(st.running_req) + "'; grade as step " +
        std::to_string(len + 1) + " once it is logged")));
  }
  if (req.index() > len)
    return rp.deliver(StepError(Status::FailedPrecondition(
        "session " + name + ": grade as step " + std::to_string(req.index()) + " is ahead of the log (" +
        std::to_string(len) + " step(s) logged" + (st.running ? ", step " + std::to_string(len) + " running" : "") +
        "); the next step is " + std::to_string(len))));
  st.waiters.push_back(std::move(rp));
  StartGrade(self, req.index());
}

void ResumeGrade(Self self) {
  auto& st = self->state;
  if (!st.rec.grading() || st.rec.phase() != v1::SESSION_PHASE_OPEN || st.running) return;
  uint64_t index = st.rec.grading() - 1;
  if (index < st.rec.step_count()) {
    st.ctx->log->info("{}: its grade was logged before the restart; removing its sandbox", StepName(st.rec.name(), index));
    return EndGrade(self, index, [] {});
  }
  if (index > st.rec.step_count()) {
    st.rec.set_grading(0);  // a mark past the log cannot be: dropped
    return;
  }
  st.ctx->log->info("{}: resuming the grade begun before the restart (it runs once)", StepName(st.rec.name(), index));
  StartGrade(self, index);
}

}  // namespace dsec::session_detail

namespace dsec {

std::string GradeSandboxId(const v1::SessionRecord& rec, uint64_t index) {
  const auto* agent = session_detail::FindRole(rec, session_detail::kAgentRole);
  return (agent ? agent->id() : std::string("ss")) + "-g" + std::to_string(index);
}

Status CheckGradeSpec(const drivers::LimitPolicy& limits, const v1::OpenSessionRequest& req) {
  if (!req.has_grade()) return Status::Ok();
  const auto& g = req.grade();
  std::string what = "session " + req.name() + ": grade: ";
  if (g.command_size() == 0) return Status::InvalidArgument(what + "no command (the grader to run, as argv)");
  if (req.spec().task().root().empty())
    return Status::InvalidArgument(what + "the agent's spec has no task root (spec.task.root): what of its sandbox "
                                          "a grade gets is the tree under it");
  v1::ExecRequest exec;
  for (const auto& a : g.command()) exec.add_argv(a);
  DSEC_RETURN_IF_ERROR(drivers::CheckExecRequest(limits, exec).Annotate(what + "command"));
  uint64_t max_ms = limits.maxima.timeout_ms();
  if (max_ms && uint64_t{g.timeout_s()} * 1000 > max_ms)
    return Status::InvalidArgument(what + "a timeout of " + std::to_string(g.timeout_s()) +
                                   " s is above this node's maximum of " + std::to_string(max_ms / 1000) + " s");
  if (g.grader_image().size() > 256) return Status::InvalidArgument(what + "grader image name longer than 256 bytes");
  return Status::Ok();
}

}  // namespace dsec
