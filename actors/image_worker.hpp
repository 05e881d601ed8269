// The image worker: a detached actor (its own thread) that runs the node's
// image registry operations, which block (registering hashes the whole EROFS
// file). The node delegates image requests to it; it answers the caller.
#pragma once

#include <caf/all.hpp>

#include <memory>

#include "wire/wire.hpp"

namespace dsec {

struct NodeContext;

using image_worker_actor = caf::typed_actor<
    caf::replies_to<v1::RegisterImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::GetImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::ListImagesRequest>::with<v1::ImagesReply>,
    caf::replies_to<v1::RemoveImageRequest>::with<v1::ImageReply>>;

// Spawned detached; the node stops it when it stops.
image_worker_actor SpawnImageWorker(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx);

}  // namespace dsec
