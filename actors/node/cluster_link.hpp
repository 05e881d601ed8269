// A node's link to its controller (docs/cluster.md): it joins with what
// the node holds, heartbeats, and rejoins after a loss. The controller's
// side, and the messages both speak, are actors/controller/controller.hpp.
#pragma once

#include <caf/all.hpp>

#include <functional>
#include <memory>
#include <string>

#include "actors/controller/controller.hpp"
#include "actors/node/node.hpp"

namespace dsec {

struct NodeContext;

// A node's link to its controller: dials host:port through the cluster
// door with `secret`, joins (with what the node holds), heartbeats, and
// rejoins after a loss. `on_token` gets the SDK token trainers hold (the
// node's SDK door admits it from then on).
//
// With `in_process` set (role all: a controller with one in-process node),
// the link joins that controller directly: no door and no dial, the same
// join and heartbeats. Such a node has no slot limit of its own unless
// --slots gives one (its drivers' limits decide).
struct LinkOptions {
  std::string host;
  uint16_t port = 0;
  std::string secret;
  uint64_t slots = 0;  // sandboxes this node takes (dsecd --slots)
  bool tls = false;    // dsecd --tls: the controller must speak it too
  std::function<void(const std::string& sdk_token)> on_token;
  std::function<void()> on_joined;  // after each join (the link's thread)
  // The controller's actor once connected, null once lost (the link's
  // thread): a node's image fetches go to it (docs/images.md).
  std::function<void(const caf::actor&)> on_controller;
  caf::actor in_process;  // the controller, in this actor system
};
caf::actor SpawnClusterLink(caf::actor_system& sys, node_actor node, std::shared_ptr<NodeContext> ctx,
                            LinkOptions options);

}  // namespace dsec
