// The controller (docs/cluster.md): it places sandboxes and sessions on
// nodes and knows which node holds which. Nodes reach its cluster port
// through the front door (runtime/door_auth.hpp, keyed by the cluster
// secret) and then speak CAF's BASP on that connection: the controller is a
// remote actor to them, and each node's entry actor a remote actor to it
// (actors/node/cluster_link.hpp is a node's side).
#pragma once

#include <caf/all.hpp>

#include <functional>
#include <memory>
#include <string>

#include "actors/admin.hpp"
#include "actors/continuation.hpp"
#include "actors/node/image_worker.hpp"
#include "wire/wire.hpp"

namespace spdlog {
class logger;
}

namespace dsec {

class FrontDoor;
struct NodeContext;
namespace state {
class Store;
class GroupCommitter;
}  // namespace state

// The controller answers the entry interface (the table of calls) for the
// whole cluster, and the admin commands (the console's, the HTTP
// server's). Beyond those:
//   (join_atom, NodeJoin, node)       a node's link, first on each
//                                     connection -> JoinReply
//   (beat_atom, node id, NodeLoad)    its heartbeat, every heartbeat_ms
//   (rejoin_atom)                     controller -> a node's link: it sent a
//                                     heartbeat while marked down (a healed
//                                     partition): join again
using join_atom = caf::atom_constant<caf::atom("join")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;
//   Continuation                      from its own callbacks only
//   (chunks_atom, digests) -> bytes   the image service (docs/images.md):
//                                     chunks by digest, to its nodes only
//   (prefetch_atom, ChunkMap)         a node's record of an image's first reads
using controller_actor = entry_actor::extend<
    caf::replies_to<admin_atom, std::string, std::vector<std::string>>::with<std::string>,
    caf::replies_to<join_atom, cluster::v1::NodeJoin, caf::actor>::with<cluster::v1::JoinReply>,
    caf::reacts_to<beat_atom, std::string, cluster::v1::NodeLoad>,
    caf::reacts_to<Continuation>,
    caf::replies_to<chunks_atom, std::vector<std::string>>::with<std::vector<std::string>>,
    caf::reacts_to<prefetch_atom, cluster::v1::ChunkMap>>;

struct ControllerContext {
  std::string id;                 // the controller's own id (meta table)
  uint64_t boot = 0;
  std::string sdk_token;          // handed to nodes that join
  std::string sdk_address, admin_address, http_address, cluster_address;
  int heartbeat_ms = 1000;        // what nodes are told
  // How a node gets an image it lacks (dsecd --image-fetch): lazily, its
  // chunks when first read (docs/images.md), or whole, copied first.
  bool lazy_images = true;
  bool test_hooks = false;        // dsecd --test-hooks: the console's chunk-fault
  int down_after_ms = 3000;       // no heartbeat this long: down
  state::Store* store = nullptr;  // nodes and placements tables
  state::GroupCommitter* committer = nullptr;
  std::shared_ptr<spdlog::logger> log;
  FrontDoor* door = nullptr;      // may be null
  // The controller's own image registry (<data-dir>/images): images built
  // with dsec-image --addr CONTROLLER, which nodes fetch when a sandbox on
  // one is placed on them. Only store, log and options.image_root are used.
  std::shared_ptr<NodeContext> image_ctx;
  // The console's `e2b-key` (the controller's E2B door's keys; a reply
  // line); empty when it serves no E2B door.
  std::function<std::string(const std::vector<std::string>&)> e2b_keys;
};

// Spawns the controller; it loads its nodes (all down until they rejoin)
// and its directory from the store before its first message.
controller_actor SpawnController(caf::actor_system& sys, std::shared_ptr<ControllerContext> ctx);

}  // namespace dsec
