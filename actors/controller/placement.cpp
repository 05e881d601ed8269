#include "actors/controller/placement.hpp"

#include <algorithm>

#include "dsec/status_proto.hpp"

namespace dsec::placement {

bool HoldsImage(const cluster::v1::ClusterNode& rec, const std::string& image, const std::string& digest) {
  for (const auto& i : rec.load().images()) {
    if (i.size() <= image.size() || i.compare(0, image.size(), image) != 0 || i[image.size()] != '@') continue;
    if (digest.empty() || i.compare(image.size() + 1, std::string::npos, digest) == 0) return true;
  }
  return false;
}

Result<std::string> Place(const v1::SandboxSpec& spec, const std::vector<NodeView>& nodes,
                          const std::unordered_map<std::string, v1::ImageManifest>& images,
                          const std::vector<const drivers::Kind*>& kinds, const std::string& none_joined) {
  std::string best;
  double best_free = -1;
  std::vector<std::string> why;
  const std::string& image = spec.image();
  const bool host_image = image.empty() || image == "host";
  auto known = images.find(image);
  const std::string digest = known == images.end() ? "" : known->second.digest();
  for (const auto& n : nodes) {
    const auto& rec = *n.rec;
    const auto& runs = rec.node().kinds();
    if (!n.up) {
      why.push_back(n.id + " is down");
      continue;
    }
    if (rec.draining()) {
      why.push_back(n.id + " is draining");
      continue;
    }
    if (n.in_process) return n.id;
    v1::Kind kind = spec.kind();
    if (kind == v1::KIND_AUTO || kind == v1::KIND_UNSPECIFIED) {
      std::vector<const drivers::Kind*> here;
      for (const auto* k : kinds)
        if (std::find(runs.begin(), runs.end(), k->name()) != runs.end()) here.push_back(k);
      auto chosen = drivers::ChooseKind(spec, here);
      if (!chosen.ok()) {
        why.push_back(n.id + ": " + chosen.status().message());
        continue;
      }
      kind = *chosen;
    }
    if (std::find(runs.begin(), runs.end(), KindName(kind)) == runs.end()) {
      why.push_back(n.id + " does not run " + KindName(kind) + " sandboxes");
      continue;
    }
    // Image locality: a node that holds the image is preferred; one that
    // does not can take it if this controller has the image to send.
    double local = 1;
    if (!host_image && !HoldsImage(rec, image, digest)) {
      if (known == images.end()) {
        why.push_back(n.id + " lacks image " + image + " (and this controller has none by that name to send)");
        continue;
      }
      local = 0;
    }
    uint64_t slots = std::max<uint64_t>(rec.load().slots(), 1);
    uint64_t used = rec.load().sandboxes() + n.pending;
    if (used >= slots) {
      why.push_back(n.id + " is full (" + std::to_string(used) + " of " + std::to_string(slots) + " slots)");
      continue;
    }
    double free = static_cast<double>(slots - used) / static_cast<double>(slots) + kLocality * local;
    if (free > best_free) {
      best_free = free;
      best = n.id;
    }
  }
  if (!best.empty()) return best;
  std::string list;
  for (const auto& w : why) list += (list.empty() ? "" : "; ") + w;
  if (nodes.empty()) list = none_joined;
  return Status::Unavailable("no node can take this " + std::string(KindName(spec.kind())) + " sandbox: " + list);
}

}  // namespace dsec::placement
