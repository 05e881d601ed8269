// The session actor: one per open rollout session (DESIGN.md section 4),
// named by the trainer.
//
// It owns the session's sandboxes (role "agent" and any more, such as
// "eval"), created through the node with ids chosen before they exist, so a
// crash between "chosen" and "created" is finished on restart instead of
// leaking a sandbox. It keeps the trajectory log in the `steps` table: a step
// whose index equals the log length runs and is appended (durably, before the
// reply); a lower index is fast-forwarded from the log after checking the
// request matches; a higher one is a gap and an error.
//
// Trainers that talk to it are monitored; when the last one is gone, the
// session (and its sandboxes) live on for the lease (`lease_s`), then close.
// A closed session's actor quits; its record and log stay in the store (the
// node answers for it) until the retention limit.
#pragma once

#include <caf/all.hpp>

#include <functional>
#include <memory>

#include "actors/continuation.hpp"
#include "actors/node/sandbox.hpp"
#include "wire/wire.hpp"
#include "dsec/status.hpp"

namespace dsec {

struct NodeContext;

// An annotation the node hands a session actor on behalf of a batch; `done`
// gets the answer an AnnotateStepRequest would have had. Local only.
struct LocalAnnotate {
  v1::AnnotateStepRequest req;
  std::function<void(v1::StepReply)> done;
};

}  // namespace dsec

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::LocalAnnotate)

namespace dsec {

// The table's calls for a session (wire/calls.hpp: routes kNewSession and
// kSession), and when they are legal:
//   OpenSessionRequest  first message after spawn for a new session; later
//                       ones are idempotent re-opens (same specs required)
//   StepRequest         while open
//   GradeRequest        while open, for a session opened with a grade spec
//   AnnotateStepRequest while open, for a logged (or running) step
//   ListStepsRequest    any time
//   CloseSessionRequest while open; the actor quits after replying
//   GetSessionRequest   any time
// And the actor's own:
//   LocalAnnotate       an AnnotateStepRequest from the node (a call of an
//                       AnnotateBatch): answered through its `done`, on the
//                       session's thread
//   Continuation        from the actor's own callbacks only
//   crash_atom          test hook
using SessionCalls = calls::CallsTo<calls::Route::kNewSession, calls::Route::kSession>;
using session_actor = calls::ActorOf<SessionCalls>::type::extend<
    caf::reacts_to<LocalAnnotate>,
    caf::reacts_to<Continuation>,
    caf::reacts_to<crash_atom>>;

// Spawns a session actor monitored by `parent`. `record` is new (phase
// unspecified; an OpenSessionRequest comes next) or restored from the store.
// `node` creates, runs in and destroys the session's sandboxes. `gone` runs
// on the session actor right before it answers a close (see SpawnSandbox).
session_actor SpawnSession(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx, entry_actor node,
                           v1::SessionRecord record, std::function<void()> gone);

// The record and steps [from, from + limit) of `rec`'s log, read from the
// store (blocking; a point scan). limit 0 means 1000; more than 1000 is cut.
v1::StepsReply ListStepsFromStore(NodeContext& ctx, const v1::SessionRecord& rec, uint64_t from,
                                  uint32_t limit);

// A session's name: 1 to 512 bytes of [A-Za-z0-9._/:@+=-], not starting
// with '-' or '/' (a controller checks it too, with the same words).
Status CheckSessionName(const std::string& name);
// Checks an open request: the name, every role and spec. Does not check
// whether the kinds can run here (the session actor does).
Status CheckOpenRequest(const NodeContext& ctx, const v1::OpenSessionRequest& req);

namespace drivers {
struct LimitPolicy;
}
// Session.Grade's steps are logged in this role (reserved: no sandbox of
// a session's spec takes it).
constexpr const char* kGradeRole = "grade";
// The id of the sandbox that grades step `index` of `rec` (the agent's id +
// "-g<index>"; session_grade.cpp).
std::string GradeSandboxId(const v1::SessionRecord& rec, uint64_t index);
// An open request's grade spec (session_grade.cpp): its command, timeout and
// image name within bounds, and a task root to carry.
Status CheckGradeSpec(const drivers::LimitPolicy& limits, const v1::OpenSessionRequest& req);

}  // namespace dsec
