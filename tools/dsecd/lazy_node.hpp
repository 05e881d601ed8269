// A cluster node's lazy images (docs/images.md): dsecd's LazyImages, whose
// fetches and prefetch records go to the controller the node has joined.
#pragma once

#include <caf/all.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "drivers/images/lazy_images.hpp"

namespace spdlog {
class logger;
}

namespace dsec {
namespace images {
class ImageStore;
}

namespace daemon {

struct Flags;

// The controller the node's link is connected to (null while it is not),
// and the actor system to reach it from other threads.
struct ControllerSlot {
  std::mutex mu;
  caf::actor controller;
  caf::actor_system* sys = nullptr;
  // The actor the lazy images' threads ask (a blocking call to it): it
  // asks the controller event-based, so no blocking actor of ours talks to
  // a remote one (one that had kept the actor system from shutting down).
  caf::actor relay;
};

// Spawns slot->relay in `sys` (and sets slot->sys); StopChunkRelay ends it
// before the actor system goes.
void StartChunkRelay(caf::actor_system& sys, const std::shared_ptr<ControllerSlot>& slot);
void StopChunkRelay(const std::shared_ptr<ControllerSlot>& slot);

// Started: the cache, the socket and dsec-lazyfs. `lost(id, why)` reports
// a sandbox whose image's lazy file went with a dead dsec-lazyfs. Null and
// logged (the node runs on, and a lazy placement is refused saying why)
// when it cannot start.
std::shared_ptr<images::LazyImages> StartLazyImages(const Flags& f, const std::string& data_dir,
                                                    std::shared_ptr<ControllerSlot> slot,
                                                    const images::ImageStore* store,
                                                    std::function<void(const std::string&, const std::string&)> lost,
                                                    std::shared_ptr<spdlog::logger> log);

}  // namespace daemon
}  // namespace dsec
