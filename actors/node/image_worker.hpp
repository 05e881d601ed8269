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
//
// Images on demand (docs/images.md):
//   (chunk_map_atom, digest) -> ChunkMap: a registered image's chunks (cut
//       once, kept next to its file), with its prefetch order if recorded
//   (chunks_atom, digests) -> bytes of each: the image service (the
//       controller forwards only what its nodes ask)
//   (prefetch_atom, ChunkMap) the first reads of an image on some node (its
//       image_digest and prefetch): kept unless it has an order already
//   (lazy_image_atom, manifest, ChunkMap) -> ImageReply: a node takes the
//       image as lazy (dsecd's LazyImages): registered at once, no copy
using image_chunk_atom = caf::atom_constant<caf::atom("imgchunk")>;
using fetch_image_atom = caf::atom_constant<caf::atom("imgfetch")>;
using chunk_map_atom = caf::atom_constant<caf::atom("chunkmap")>;
using chunks_atom = caf::atom_constant<caf::atom("chunks")>;
using prefetch_atom = caf::atom_constant<caf::atom("prefetch")>;
using lazy_image_atom = caf::atom_constant<caf::atom("lazyimg")>;
inline constexpr uint64_t kImageChunk = 1 << 20;
using image_worker_actor = caf::typed_actor<
    caf::replies_to<v1::RegisterImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::GetImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::ListImagesRequest>::with<v1::ImagesReply>,
    caf::replies_to<v1::RemoveImageRequest>::with<v1::ImageReply>,
    caf::replies_to<image_chunk_atom, std::string, uint64_t>::with<std::string>,
    caf::replies_to<fetch_image_atom, v1::ImageManifest, caf::actor>::with<v1::ImageReply>,
    caf::replies_to<chunk_map_atom, std::string>::with<cluster::v1::ChunkMap>,
    caf::replies_to<chunks_atom, std::vector<std::string>>::with<std::vector<std::string>>,
    caf::reacts_to<prefetch_atom, cluster::v1::ChunkMap>,
    caf::replies_to<lazy_image_atom, v1::ImageManifest, cluster::v1::ChunkMap>::with<v1::ImageReply>>;

// Spawned detached; the node stops it when it stops.
image_worker_actor SpawnImageWorker(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx);

}  // namespace dsec
