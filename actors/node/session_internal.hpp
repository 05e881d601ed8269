// Internal to the session actor (session.cpp: lifecycle, lease, open and
// close; session_sandboxes.cpp: the sandboxes a session owns;
// session_log.cpp: steps and annotations, the trajectory log): its state
// and what those files call of each other. Everything here runs on the
// session actor.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <chrono>

#include "actors/node/context.hpp"
#include "actors/node/session.hpp"
#include "actors/node/step_cache.hpp"
#include "runtime/metrics.hpp"
#include "state/store.hpp"

namespace dsec::session_detail {

// A step's caller: its promise, and when the step came (every answer to it
// counts in dsec_step_seconds).
struct StepPromise {
  StepPromise(caf::typed_response_promise<v1::StepReply> p) : rp(std::move(p)) {}  // NOLINT: implicit on purpose
  void deliver(v1::StepReply r) {
    metrics::StepSeconds().Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    rp.deliver(std::move(r));
  }
  caf::typed_response_promise<v1::StepReply> rp;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};
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
  // What the task guard flagged in this actor's life (sandbox id and Flag
  // evidence): a change that stays is flagged at the first step that shows it.
  std::unordered_set<std::string> flagged;
  // Per sandbox id: the refused packets and names its network report showed at
  // the last step (network_refused / name_refused flags are the growth).
  std::map<std::string, std::pair<uint64_t, uint64_t>> refusals_seen;
  // Per sandbox id: the syscalls its filter had denied at the last step.
  std::map<std::string, std::map<std::string, uint64_t>> denied_seen;
  std::map<std::string, std::map<std::string, uint64_t>> watched_seen;  // reads of watched files, likewise
  std::map<std::string, std::map<std::string, uint64_t>> writes_seen;   // writes refused, likewise
  uint64_t lease_gen = 0;
  bool lease_armed = false;  // a lease timer of lease_gen is pending
  int64_t forwarded_ms = 0;  // the last call the controller forwarded, steady clock (0: none)
  static constexpr const char* name = "session";
};

using Self = session_actor::stateful_pointer<SessionState>;

// ---- shared (session.cpp) ---------------------------------------------------

v1::SessionReply Reply(const Status& st, const v1::SessionRecord& rec);
v1::StepReply StepError(const Status& st);
std::string StepName(const std::string& session, uint64_t index);
std::string RoleOf(const v1::StepRequest& req);
const v1::SessionSandbox* FindRole(const v1::SessionRecord& rec, const std::string& role);
// Writes `batch` through the group committer; `then` runs on the actor.
void Persist(Self self, state::WriteBatch batch, std::function<void(const Status&)> then);
void PutRecord(Self self, state::WriteBatch* b);
void PersistRecord(Self self, std::function<void(const Status&)> then);
// Quits, after telling the node to forget this session.
void Quit(Self self);
// Runs what waited for the open (or for the sandboxes to be created).
void OpenDone(Self self);
// Closes the session once nothing is in between (see session.cpp).
void CloseSession(Self self, std::string reason, SessionPromise* rp);

// ---- sandboxes (session_sandboxes.cpp) --------------------------------------

// Creates the sandboxes not created yet, then marks the session ready.
void CreateSandboxes(Self self, std::function<void(const Status&)> done);
// Destroys every sandbox the session owns; `done` once all have answered.
void DestroySandboxes(Self self, std::function<void()> done);

// ---- the log (session_log.cpp) ----------------------------------------------

// Where an annotation's answer goes: its CAF response promise, or the
// `done` of a LocalAnnotate from a batch.
using AnswerFn = std::function<void(v1::StepReply)>;
// Why the session cannot take a step now, or Ok.
Status Serving(Self self);
// A step: run it (the next index), fast-forward it (a logged one), or refuse.
void HandleStep(Self self, const v1::StepRequest& req, StepPromise rp);
// A logged step, from the cache or the store.
Result<StepCache::Ptr> LoggedStep(Self self, uint64_t index);
// Logs a step run (with its flags) and answers everyone waiting for it;
// an error is answered, not logged. Then runs `after_step`.
void LogStep(Self self, const v1::StepRequest& req, int64_t started, Result<v1::ExecResult> r);

// ---- grades (session_grade.cpp) ---------------------------------------------

// A grade: run it as the next step, answer a logged one, or refuse.
void HandleGrade(Self self, const v1::GradeRequest& req, StepPromise rp);
// After a restart: finishes the grade the record's mark names.
void ResumeGrade(Self self);
void StartAnnotate(Self self, const v1::AnnotateStepRequest& req, AnswerFn answer);

}  // namespace dsec::session_detail
