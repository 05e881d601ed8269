// The controller's forwarding (forward.hpp), and placement as the
// controller does it: a snapshot of its nodes for placement.hpp's pure
// choice, then the image fetched to the chosen node if it lacks it.
#include <spdlog/logger.h>

#include "actors/controller/forward.hpp"
#include "actors/controller/placement.hpp"
#include "actors/node/image_worker.hpp"
#include "runtime/metrics.hpp"

namespace dsec::controller_detail {

bool Settle(Self self, const std::string& node, uint64_t call) {
  auto it = self->state.nodes.find(node);
  return it != self->state.nodes.end() && it->second.waiting.erase(call) > 0;
}

std::chrono::milliseconds ExecTimeout(const v1::ExecRequest& req) {
  uint32_t limit = req.limits().timeout_ms() ? req.limits().timeout_ms() : 30'000;
  return std::chrono::milliseconds(limit) + std::chrono::minutes(2);
}

const std::string* SdkAddress(Self self, const std::string& node) {
  auto it = self->state.nodes.find(node);
  return it == self->state.nodes.end() ? nullptr : &it->second.rec.node().sdk_address();
}

node_actor InProcess(Self self, const std::string& node) {
  auto& st = self->state;
  if (st.in_process.empty() || (!node.empty() && node != st.in_process)) return {};
  auto it = st.nodes.find(st.in_process);
  if (it == st.nodes.end() || !it->second.up()) return {};
  return caf::actor_cast<node_actor>(it->second.entry);
}

void Decorate(Self self, const std::string& node, v1::SandboxReply* r) {
  if (!r->has_sandbox()) return;
  if (auto* a = SdkAddress(self, node)) r->mutable_sandbox()->set_node_address(*a);
}
void Decorate(Self self, const std::string& node, v1::SessionReply* r) {
  if (!r->has_session()) return;
  auto* rec = r->mutable_session();
  rec->set_node_id(node);
  auto re = self->state.restartable.find(rec->name());
  if (re != self->state.restartable.end()) {
    // Its steps come here (the log's copy is kept here): no node address.
    rec->set_restartable(true);
    rec->set_moves(re->second.moves);
    rec->clear_node_address();
    return;
  }
  if (auto* a = SdkAddress(self, node)) rec->set_node_address(*a);
}

// Runs `then` once node `node` holds `spec`'s image: at once when it does
// (or the spec needs none), else after the node fetched it from this
// controller; an error naming both when that failed.
void EnsureImage(Self self, const std::string& node, const v1::SandboxSpec& spec, std::function<void(Status)> then) {
  auto& st = self->state;
  const std::string& image = spec.image();
  auto n = st.nodes.find(node);
  auto known = st.image_by_name.find(image);
  if (image.empty() || image == "host" || n == st.nodes.end() || known == st.image_by_name.end() ||
      placement::HoldsImage(n->second.rec, image, known->second.digest()) || !n->second.up())
    return then(Status::Ok());
  v1::ImageManifest m = known->second;
  auto held = [self, node, m, then](v1::ImageReply& r) {
    if (r.status().code() != v1::Status::OK)
      return then(Status::Unavailable("node " + node + " could not fetch image " + m.name() + ": " +
                                      r.status().message()));
    auto it = self->state.nodes.find(node);
    if (it != self->state.nodes.end()) it->second.rec.mutable_load()->add_images(m.name() + "@" + m.digest());
    then(Status::Ok());
  };
  auto failed = [self, node, m, then](caf::error& e) {
    then(Status::Unavailable("node " + node + " could not fetch image " + m.name() + ": " + self->system().render(e)));
  };
  if (!st.ctx->lazy_images) {
    st.ctx->log->info("node {} fetches image {} ({} bytes) for a placement", node, image, m.size_bytes());
    self->request(n->second.entry, std::chrono::minutes(10), fetch_image_atom::value, m,
                  caf::actor_cast<caf::actor>(st.images))
        .then(held, failed);
    return;
  }
  // Lazily (docs/images.md): the node gets the chunk map, no bytes yet.
  self->request(st.images, std::chrono::minutes(10), chunk_map_atom::value, m.digest())
      .then(
          [self, node, m, held, failed](cluster::v1::ChunkMap& map) {
            auto n = self->state.nodes.find(node);
            if (n == self->state.nodes.end() || !n->second.up()) {
              caf::error gone = caf::make_error(caf::sec::request_receiver_down, "node " + node + " is not up");
              return failed(gone);
            }
            self->state.ctx->log->info("node {} takes image {} lazily ({} bytes, {} chunks, {} to prefetch)", node,
                                       m.name(), m.size_bytes(), map.chunks_size(), map.prefetch_size());
            self->request(n->second.entry, std::chrono::minutes(2), lazy_image_atom::value, m, std::move(map))
                .then(held, failed);
          },
          failed);
}

// EnsureImage for each of a session's sandboxes (its agent's and those of
// more_sandboxes), one after another; `then` gets the first failure.
void EnsureSessionImages(Self self, const std::string& node, const v1::OpenSessionRequest& open,
                         std::function<void(Status)> then, int next) {
  if (next > open.more_sandboxes_size() ||
      (next == open.more_sandboxes_size() && open.grade().grader_image().empty()))
    return then(Status::Ok());
  // Then the grader's image, which its grades need there.
  v1::SandboxSpec grader;
  grader.set_image(open.grade().grader_image());
  const v1::SandboxSpec& spec = next < 0 ? open.spec()
                                : next < open.more_sandboxes_size() ? open.more_sandboxes(next).spec()
                                                                    : grader;
  EnsureImage(self, node, spec, [self, node, open, then, next](Status ready) {
    if (!ready.ok()) return then(ready);
    EnsureSessionImages(self, node, open, then, next + 1);
  });
}

Result<std::string> Place(Self self, const v1::SandboxSpec& spec) {
  auto& st = self->state;
  auto started = std::chrono::steady_clock::now();
  std::vector<placement::NodeView> nodes;
  nodes.reserve(st.nodes.size());
  for (const auto& [id, n] : st.nodes) nodes.push_back({id, &n.rec, n.up(), n.in_process, n.pending});
  std::vector<const drivers::Kind*> kinds;
  for (const auto& k : st.kinds) kinds.push_back(k.get());
  auto best = placement::Place(
      spec, nodes, st.image_by_name, kinds,
      st.ctx->cluster_address.empty() ? "its node has not joined yet (dsecd is starting)"
                                      : "no node has joined (start dsecd --role node --join " +
                                            st.ctx->cluster_address + ")");
  if (!best.ok()) return best;
  auto& chosen = st.nodes[*best];
  chosen.pending++;
  st.placed++;
  // (A node in this process observes its own placement: its choice of kind.)
  if (!chosen.in_process)
    metrics::PlacementSeconds().Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return best;
}

}  // namespace dsec::controller_detail
