// Internal to the controller (controller.cpp, controller_admin.cpp): its
// state, and what the admin commands need of the rest.
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

#include "actors/cluster.hpp"
#include "actors/context.hpp"
#include "actors/image_worker.hpp"
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

// Writes `b` (group commit; errors are logged).
void Persist(Self self, state::WriteBatch b);
void PersistNode(Self self, const NodeEntry& n);
// Why node `id` cannot answer for `what` now ("... is lost: its node ...").
Status NodeGone(Self self, const std::string& id, const std::string& what);

// The console's commands on a controller (controller_admin.cpp).
caf::result<std::string> Admin(Self self, const std::string& cmd, const std::vector<std::string>& args);

}  // namespace dsec::controller_detail
