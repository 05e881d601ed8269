// Internal to the controller (actors/controller/*.cpp): its state, and
// what its parts need of each other.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/controller/controller.hpp"
#include "actors/node/context.hpp"
#include "actors/node/image_worker.hpp"
#include "drivers/registry.hpp"
#include "state/store.hpp"

namespace dsec::controller_detail {

struct NodeEntry {
  cluster::v1::ClusterNode rec;
  caf::actor entry;  // the node's entry actor (a proxy); null while down
  int64_t last_beat_ms = 0;
  uint64_t pending = 0;  // placed on it since its last heartbeat
  bool in_process = false;  // role all: the node in this controller's process
  // Calls forwarded to it and not yet answered: failed at once (naming the
  // node) when it goes down, instead of at the trainer's deadline.
  std::unordered_map<uint64_t, std::function<void(const Status&)>> waiting;
  bool up() const { return static_cast<bool>(entry); }
};

// A session opened restartable: how to open it again, how long the log's
// copy here is (its steps in this controller's steps table), and where a
// restart stands.
struct Restartable {
  v1::OpenSessionRequest open;
  uint64_t logged = 0;
  std::string restarting_on;  // the node it is being re-run on
  std::string failed;         // why it cannot go on ("" while it can)
  uint32_t moves = 0;
  // The nodes it left when they went down: each may come back with a copy
  // (kept in memory only: a controller restarted in between forgets them).
  std::set<std::string> left;
};

struct ControllerState {
  std::shared_ptr<ControllerContext> ctx;
  std::unordered_map<std::string, Restartable> restartable;
  std::map<std::string, NodeEntry> nodes;  // by node id
  std::unordered_map<caf::actor_addr, std::string> node_of;
  std::unordered_map<std::string, std::string> sandbox_node, session_node;
  std::string in_process;  // the id of the node in this process (role all), if one joined
  // Restartable sessions closed while a node that held a copy was down
  // (node -> names): the copy is closed when the node rejoins.
  std::unordered_map<std::string, std::unordered_set<std::string>> closed_away;
  std::vector<std::unique_ptr<drivers::Kind>> kinds = drivers::AllKinds();  // for kind auto
  image_worker_actor images;  // this controller's image registry (off its thread)
  std::unordered_map<std::string, v1::ImageManifest> image_by_name;  // what it holds
  uint64_t next_call = 0;
  uint64_t placed = 0;
  int64_t started_ms = WallClockMs();
  static constexpr const char* name = "controller";
};

using Self = controller_actor::stateful_pointer<ControllerState>;

// Keys of the `placements` table: the directory ("b/<sandbox>",
// "s/<session>"), restartable sessions ("r/<session>": how to open it
// again) and closes a node missed while down ("c/<node>/<session>"; a node
// id has no '/', so the key splits at the first one after "c/").
inline std::string SandboxKey(const std::string& id) { return "b/" + id; }
inline std::string SessionKey(const std::string& name) { return "s/" + name; }
inline std::string RestartableKey(const std::string& name) { return "r/" + name; }
inline std::string ClosedAwayKey(const std::string& node, const std::string& name) {
  return "c/" + node + "/" + name;
}

// A node's or a sandbox's id: [a-z0-9-], 1 to 64 bytes.
inline bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}
inline void PutPlacement(state::WriteBatch* b, const std::string& key, const std::string& node) {
  b->Put(state::Table::kPlacements, key, node);
}

// --- nodes.cpp: the nodes and the store.
// Writes `b` (group commit; errors are logged).
void Persist(Self self, state::WriteBatch b);
void PersistNode(Self self, const NodeEntry& n);
// Why node `id` cannot answer for `what` now ("... is lost: its node ...").
Status NodeGone(Self self, const std::string& id, const std::string& what);
// Node `n` is down (`why`): its calls in flight fail naming it, and its
// restartable sessions go on elsewhere.
void MarkDown(Self self, NodeEntry& n, const std::string& why);
cluster::v1::JoinReply Join(Self self, cluster::v1::NodeJoin& j, caf::actor entry);
void Beat(Self self, const std::string& id, cluster::v1::NodeLoad& load);
// The heartbeat deadline's check, and the next one armed.
void Tick(Self self);
// The nodes (all down until they rejoin), the directory and the
// restartable sessions, from the store.
void Load(Self self);

// --- forward.cpp: placement and images (to the node, see forward.hpp).
// The node for a new sandbox or session with `spec` (placement.hpp over a
// snapshot of the nodes); counts it as pending there.
Result<std::string> Place(Self self, const v1::SandboxSpec& spec);
// Runs `then` once node `node` holds `spec`'s image: at once when it does
// (or the spec needs none), else after the node fetched it from this
// controller; an error naming both when that failed.
void EnsureImage(Self self, const std::string& node, const v1::SandboxSpec& spec, std::function<void(Status)> then);
// EnsureImage for each of a session's sandboxes, one after another.
void EnsureSessionImages(Self self, const std::string& node, const v1::OpenSessionRequest& open,
                         std::function<void(Status)> then, int next = -1);

// --- restart.cpp: restartable sessions.
// Drops restartable session `name`'s entry and its log's copy (into `b`).
void ForgetRestartable(Self self, const std::string& name, state::WriteBatch* b);
Result<v1::StepRecord> CopiedStep(Self self, const std::string& name, uint64_t index);
// Session `name` was on node `from`, which went down: open it on another
// node and re-run its log there.
void Restart(Self self, const std::string& name, const std::string& from);
// A step of a restartable session (answered from the log's copy, or run
// on its node and copied here durably before the answer).
caf::result<v1::StepReply> RestartableStep(Self self, Restartable& r, v1::StepRequest& req);
caf::result<v1::StepReply> RestartableGrade(Self self, Restartable& r, v1::GradeRequest& req);

// --- admin.cpp: the console's commands on a controller.
caf::result<std::string> Admin(Self self, const std::string& cmd, const std::vector<std::string>& args);

}  // namespace dsec::controller_detail
