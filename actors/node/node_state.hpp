// Internal to the node actor (node.cpp, node_admin.cpp): its state.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "actors/node/context.hpp"
#include "actors/node/directory.hpp"
#include "actors/node/image_worker.hpp"
#include "actors/node/node.hpp"
#include "actors/node/node_host.hpp"
#include "actors/node/sandbox.hpp"
#include "actors/node/session.hpp"
#include "actors/node/supervisor.hpp"
#include "runtime/metrics.hpp"

namespace dsec {

// Results of AnnotateBatch calls for one sender, sent together once the
// node's mailbox holds nothing older (a posted flush).
struct AnnotateOut {
  caf::actor to;
  v1::AnnotateResults results;
  bool flush_posted = false;
};

// The node actor is the router: it answers the SDK from its directory and
// hands each request to the sandbox or session actor that serves it, to
// the host (one-shot runs, admission, restore), or to the image worker.
// The supervisor restarts the children that die.
struct NodeState {
  std::shared_ptr<NodeContext> ctx;
  std::unique_ptr<NodeHost> host;
  std::unique_ptr<Supervisor> supervisor;
  Directory dir;
  std::unordered_map<caf::actor_addr, AnnotateOut> annotate_out;
  image_worker_actor images;  // blocking registry work, off the node's thread
  // dsec_exec_seconds{kind} of one-shot runs, looked up once per kind.
  std::unordered_map<int, metrics::Histogram*> run_seconds;
  // Sandboxes and sessions that ended (sandboxes made) since the controller last asked
  // (cluster_load_atom); at most kMaxEndedReport each.
  std::vector<std::string> ended_sandboxes, ended_sessions, started_sandboxes;
  static constexpr const char* name = "node";
};

using NodeSelf = node_actor::stateful_pointer<NodeState>;

// For a controller (node_admin.cpp): what this node holds, and its load.
inline constexpr size_t kMaxEndedReport = 1 << 20;
inline void NoteForController(std::vector<std::string>* list, const std::string& id) {
  if (list->size() < kMaxEndedReport) list->push_back(id);
}
cluster::v1::NodeJoin ClusterInfo(NodeSelf self);
cluster::v1::NodeLoad ClusterLoad(NodeSelf self);

// Snapshots (node_snapshots.cpp, DESIGN.md section 14). A create from a
// snapshot (spec.snapshot) gets its image, kind and layers here, or why
// not; a client's own spec.layers is refused.
Status ResolveSnapshot(NodeSelf self, v1::SandboxSpec* spec);
// Sandbox `id` (made from spec.snapshot) needs it / has ended.
void HoldSnapshot(NodeSelf self, const v1::SandboxRecord& rec);
void ReleaseSnapshot(NodeSelf self, const std::string& id);
caf::result<v1::SnapshotReply> HandleSnapshots(NodeSelf self, v1::GetSnapshotRequest& req);
caf::result<v1::SnapshotsReply> HandleSnapshots(NodeSelf self, v1::ListSnapshotsRequest& req);
caf::result<v1::SnapshotReply> HandleSnapshots(NodeSelf self, v1::RemoveSnapshotRequest& req);

// Admin console commands (node_admin.cpp).
caf::result<std::string> HandleAdmin(NodeSelf self, const std::string& cmd,
                                     const std::vector<std::string>& args);

}  // namespace dsec
