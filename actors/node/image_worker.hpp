// The image worker: a detached actor (its own thread) that runs the node's
// image registry operations, which block (registering hashes the whole EROFS
// file). The node delegates image requests to it; it answers the caller.
#pragma once

#include <caf/all.hpp>

#include <memory>

#include "wire/wire.hpp"

namespace dsec {

struct NodeContext;

// In a cluster (docs/cluster.md):
//   (image_chunk_atom, digest, offset) -> bytes: up to kImageChunk bytes of
//       the file of a registered image (a controller's worker serves them)
//   (fetch_image_atom, manifest, source) -> ImageReply: gets the image's
//       file from `source` (another worker) chunk by chunk, checks its size
//       and digest and registers it here; at once when it is here already
using image_chunk_atom = caf::atom_constant<caf::atom("imgchunk")>;
using fetch_image_atom = caf::atom_constant<caf::atom("imgfetch")>;
inline constexpr uint64_t kImageChunk = 1 << 20;
using image_worker_actor = caf::typed_actor<
    caf::replies_to<v1::RegisterImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::GetImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::ListImagesRequest>::with<v1::ImagesReply>,
    caf::replies_to<v1::RemoveImageRequest>::with<v1::ImageReply>,
    caf::replies_to<image_chunk_atom, std::string, uint64_t>::with<std::string>,
    caf::replies_to<fetch_image_atom, v1::ImageManifest, caf::actor>::with<v1::ImageReply>>;

// Spawned detached; the node stops it when it stops.
image_worker_actor SpawnImageWorker(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx);

}  // namespace dsec
