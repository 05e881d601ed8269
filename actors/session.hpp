// The session actor: one per rollout session (DESIGN.md section 4), named by
// the trainer. Holds the trajectory log in the `steps` table: a step whose
// index equals the log length runs and is appended (durably, before the
// reply); a lower index is fast-forwarded from the log after checking the
// request matches; a higher one is a gap and an error. This is the minimal
// session of the foundation; leases, multiple sandboxes and replay follow.
#pragma once

#include <caf/all.hpp>

#include <memory>

#include "actors/continuation.hpp"
#include "actors/sandbox.hpp"
#include "actors/wire.hpp"

namespace dsec {

struct NodeContext;

// Messages, and when they are legal:
//   OpenSessionRequest  first message after spawn for a new session; later
//                       ones are idempotent re-opens (same spec required)
//   StepRequest         while open
//   CloseSessionRequest while open; idempotent once closed
//   GetSessionRequest   any time
//   Continuation        from the actor's own callbacks only
//   crash_atom          test hook
using session_actor = caf::typed_actor<
    caf::replies_to<v1::OpenSessionRequest>::with<v1::SessionReply>,
    caf::replies_to<v1::StepRequest>::with<v1::StepReply>,
    caf::replies_to<v1::CloseSessionRequest>::with<v1::SessionReply>,
    caf::replies_to<v1::GetSessionRequest>::with<v1::SessionReply>,
    caf::reacts_to<Continuation>,
    caf::reacts_to<crash_atom>>;

// Spawns a session actor monitored by `parent`. `record` is new (phase
// unspecified; an OpenSessionRequest comes next) or restored from the store.
session_actor SpawnSession(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx,
                           v1::SessionRecord record);

}  // namespace dsec
