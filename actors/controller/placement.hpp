// Placement: which node takes a new sandbox or session. A pure function of
// the nodes as the controller knows them now (a snapshot: their records,
// last loads and what was placed since) and of the spec; the controller
// acts on its answer. Unit tests: tests/unit/actors/placement_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "drivers/registry.hpp"
#include "dsec/cluster/v1/cluster.pb.h"
#include "dsec/status.hpp"

namespace dsec::placement {

// One node as placement sees it.
struct NodeView {
  std::string id;
  const cluster::v1::ClusterNode* rec = nullptr;  // record and last load (never null)
  bool up = false;
  bool in_process = false;  // role all: its kinds and images are its own to check, with their reasons
  uint64_t pending = 0;     // placed on it since its last heartbeat
};

// How much holding the image weighs against free slots (a share of 0..1).
inline constexpr double kLocality = 0.1;

// Whether a node's heartbeat ("name@digest" each) lists `image`: at
// `digest` (the controller's own copy), or by name alone when "".
bool HoldsImage(const cluster::v1::ClusterNode& rec, const std::string& image, const std::string& digest);

// The node for `spec`: among the nodes that are up, not draining, run its
// kind (auto resolved per node, ChooseKind over `kinds`) and hold its image
// or can get it (`images`: what the controller can send), and are not
// full, the one with the largest share of its slots free, plus kLocality
// when it holds the image already (so nodes fill in proportion to their
// capacity). A node in this process takes any placement. Unavailable,
// naming each node and why not, when none fits; `none_joined` says what
// to do when there is no node at all.
Result<std::string> Place(const v1::SandboxSpec& spec, const std::vector<NodeView>& nodes,
                          const std::unordered_map<std::string, v1::ImageManifest>& images,
                          const std::vector<const drivers::Kind*>& kinds, const std::string& none_joined);

}  // namespace dsec::placement
