// Sandbox.Snapshot, Sandbox.Fork and a node's snapshots (DESIGN.md section
// 14; docs/running.md "Snapshots and fork"). A snapshot is a named,
// read-only state of a sandbox (a container's: what it changed of its
// image) that new sandboxes start from: Client::Create with
// spec.snapshot = its name (its image and kind come with it; it lives on
// the node it was taken on, where they are made).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsec/client.hpp"

namespace dsec {

// A snapshot named `name` ([a-z0-9][a-z0-9._-]*, unique on its node) of
// `sandbox` as it is now (it is frozen for the copy, then goes on).
Result<v1::SnapshotInfo> Snapshot(const Sandbox& sandbox, const std::string& name);
// `count` (1 to 100) new sandboxes in `sandbox`'s current state, on its
// node, each with its own id, hostname and machine-id, lifetime and lease
// (the source's spec and owner): all of them, or an error that names which
// failed and why (none is kept then). The source goes on after a short
// freeze. They share one snapshot, removed with the last of them.
Result<std::vector<Sandbox>> Fork(const Sandbox& sandbox, uint32_t count);

// Session.Fork: `count` (1 to 100) new sessions that continue `session`
// from its current step k (its log's length): each one's log begins with
// steps 0..k-1 of `session`'s (they fast-forward, so a restarted trainer
// replays each fork without running a step again), and its agent sandbox
// starts from a snapshot of `session`'s taken now (its other sandboxes start
// fresh). Named `names` (one each), or "<name>/fork-<i>". Fork between
// steps: a step running meanwhile would be caught half done. All or none:
// on an error the sessions opened are closed again. `client` is the one
// `session` came from.
Result<std::vector<Session>> ForkSession(Client& client, const Session& session, uint32_t count,
                                         std::vector<std::string> names = {});

Result<v1::SnapshotInfo> GetSnapshot(Client& client, const std::string& name);
// Every node's snapshots (users: the sandboxes and snapshots that need each).
Result<std::vector<v1::SnapshotInfo>> ListSnapshots(Client& client);
// Refused (FailedPrecondition, naming them) while sandboxes or snapshots need it.
Status RemoveSnapshot(Client& client, const std::string& name);

// Callback forms (`done` on an SDK thread; see Done).
void SnapshotAsync(const Sandbox& sandbox, const std::string& name, Done<v1::SnapshotInfo> done);
void ForkAsync(const Sandbox& sandbox, uint32_t count, Done<std::vector<Sandbox>> done);
void GetSnapshotAsync(Client& client, const std::string& name, Done<v1::SnapshotInfo> done);
void ListSnapshotsAsync(Client& client, Done<std::vector<v1::SnapshotInfo>> done);
void RemoveSnapshotAsync(Client& client, const std::string& name, DoneStatus done);

}  // namespace dsec
