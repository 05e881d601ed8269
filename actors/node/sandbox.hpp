// The sandbox actor: one per sandbox. Its lifecycle (pending -> starting ->
// running -> stopping -> stopped | failed) is a state machine; every
// transition is checkpointed to the `sandboxes` table before it is
// acknowledged, and every operation on one sandbox is serialised through it.
// Supervised by the node, which restarts it from its checkpoint.
#pragma once

#include <caf/all.hpp>

#include <functional>
#include <memory>

#include "actors/continuation.hpp"
#include "dsec/store/v1/records.pb.h"
#include "wire/wire.hpp"

namespace dsec {

struct NodeContext;

using crash_atom = caf::atom_constant<caf::atom("crash")>;
using owner_atom = caf::atom_constant<caf::atom("owner")>;
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using describe_atom = caf::atom_constant<caf::atom("describe")>;

// The table's calls for a sandbox (wire/calls.hpp: routes kNewSandbox and
// kSandbox), and when they are legal:
//   CreateRequest      first message after spawn by the node (new sandbox)
//   ExecRequest        while running
//   PauseRequest       while running (no exec in flight) -> paused
//   ResumeRequest      while paused -> running
//   SetTimeoutRequest  any time but while it is destroyed
//   SetNetworkRequest  while running or paused
//   Read/Write/ListFiles while running
//   DestroyRequest     any time; the actor quits after replying
//   GetSandboxRequest  any time
// While the driver re-adopts the sandbox after a restart, they wait. And
// the actor's own:
//   describe_atom      any time: the record as the console's inspect shows
//                      it (one JSON object), its driver's state decoded
//   owner_atom, bool   from the node: the owner (record.owner) has a
//                      connection again (true) or has lost its last (false)
//   lost_atom, why     from the node: the sandbox ended by itself (its VM's
//                      QEMU exited, its guest kernel panicked): failed,
//                      saying why, and what is left is destroyed
//   Continuation       from the actor's own callbacks only
//   crash_atom         test hook: throws (node started with test hooks)
using SandboxCalls = calls::CallsTo<calls::Route::kNewSandbox, calls::Route::kSandbox>;
using sandbox_actor = calls::ActorOf<SandboxCalls>::type::extend<
    caf::replies_to<describe_atom>::with<std::string>,
    caf::reacts_to<owner_atom, bool>,
    caf::reacts_to<lost_atom, std::string>,
    caf::reacts_to<Continuation>,
    caf::reacts_to<crash_atom>>;

// Spawns a sandbox actor monitored by `parent` (its supervisor). `row` is
// the sandbox to run (its record and its driver's state): new (phase pending; a CreateRequest comes next) or
// restored from its checkpoint (after a crash or a daemon restart). `gone`
// runs on the sandbox actor right before it answers a destroy (with why it
// ended), so the parent can forget it before anyone learns it is gone.
// `owner_present`: its owner, if it has one, is connected now.
//
// The actor ends the sandbox itself at its ttl (destroy), after its idle
// timeout (pause or destroy, spec.on_idle) and once its owner has been gone
// for the lease (destroy); the deadlines come from the record, so they hold
// across restarts.
//
// `readopted` set: the record comes back after a daemon restart, and the
// driver re-adopts the sandbox first (a running or paused one; one it cannot
// take back is failed, saying why). Requests wait until it has; then
// `readopted` runs, on a driver thread (post from it, nothing else).
sandbox_actor SpawnSandbox(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx,
                           store::v1::SandboxRow row, std::function<void(const std::string& why)> gone = nullptr,
                           bool owner_present = false, std::function<void()> readopted = nullptr);

}  // namespace dsec
