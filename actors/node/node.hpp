// The node actor: one per host, the SDK entry point in role `all`. Runs
// one-shot fncall runs itself (no actor or checkpoint per run: fncall has no
// state), spawns and supervises sandbox and session actors (restart from
// checkpoint, with a restart-intensity limit), rebuilds them from the store
// at start, and answers the admin console.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <string>
#include <vector>

#include "actors/admin.hpp"
#include "actors/continuation.hpp"
#include "actors/node/image_worker.hpp"
#include "wire/wire.hpp"

namespace dsec {

struct NodeContext;


// Beyond the entry interface:
//   (admin_atom, command, args) -> one JSON object (as text) for the console:
//       status, ls, inspect ID, kill ID, stats
//   (lost_atom, id, why)         a driver saw sandbox `id` end by itself
//                                (drivers::DriverEnv::lost): to its actor
//   Continuation                 from the node's own callbacks only
//   (cluster_info_atom)          -> NodeJoin: the sandboxes and sessions it
//                                holds (the rest is filled in by its link)
//   (cluster_load_atom)          -> NodeLoad: live counts, and what ended
//                                since the last ask
//   (fetch_image_atom, manifest, source) -> ImageReply: the image's file
//                                from `source` (a controller's image worker)
//   (lazy_image_atom, manifest, ChunkMap) -> ImageReply: the image taken as
//                                lazy (docs/images.md), no copy
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using cluster_info_atom = caf::atom_constant<caf::atom("cinfo")>;
using cluster_load_atom = caf::atom_constant<caf::atom("cload")>;
using node_actor = entry_actor::extend<
    caf::replies_to<admin_atom, std::string, std::vector<std::string>>::with<std::string>,
    caf::reacts_to<lost_atom, std::string, std::string>,
    caf::reacts_to<Continuation>,
    caf::replies_to<cluster_info_atom>::with<cluster::v1::NodeJoin>,
    caf::replies_to<cluster_load_atom>::with<cluster::v1::NodeLoad>,
    caf::replies_to<fetch_image_atom, v1::ImageManifest, caf::actor>::with<v1::ImageReply>,
    caf::replies_to<lazy_image_atom, v1::ImageManifest, cluster::v1::ChunkMap>::with<v1::ImageReply>>;

// Spawns the node; it restores sandboxes and sessions from the store before
// it handles its first message.
node_actor SpawnNode(caf::actor_system& sys, std::shared_ptr<NodeContext> ctx);

}  // namespace dsec
