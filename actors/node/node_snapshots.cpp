// The node's snapshots (DESIGN.md section 14): listing, inspecting and
// removing them (blocking store and file work: off the node's thread), and
// what a create from one needs (its image, kind and layers; who holds it).
#include "actors/continuation.hpp"
#include "actors/error_reply.hpp"
#include "actors/node/node_state.hpp"
#include "drivers/images/snapshot_store.hpp"
#include "dsec/status_proto.hpp"

namespace dsec {

namespace {

Status NoSnapshots() {
  return Status::FailedPrecondition("this node keeps no snapshots (its dsecd was started without a snapshot store)");
}

// Runs `work` on a thread of its own; its reply goes back through the node.
template <class Reply, class Work>
caf::result<Reply> OffThread(NodeSelf self, Work work) {
  auto rp = self->make_response_promise<Reply>();
  auto handle = caf::actor_cast<node_actor>(self);
  self->spawn<caf::detached>([rp, work, handle]() mutable {
    Reply r = work();
    Post(handle, [rp, r = std::move(r)]() mutable { rp.deliver(std::move(r)); });
  });
  return rp;
}

}  // namespace

Status ResolveSnapshot(NodeSelf self, v1::SandboxSpec* spec) {
  if (spec->layers().dirs_size() > 0 || !spec->layers().image_digest().empty())
    return Status::InvalidArgument("spec.layers is set by the node only; name a snapshot with spec.snapshot");
  if (spec->snapshot().empty()) {
    spec->clear_layers();
    return Status::Ok();
  }
  auto& snaps = self->state.ctx->snapshots;
  if (!snaps) return NoSnapshots();
  v1::SnapshotLayers layers;
  auto info = snaps->Resolve(spec->snapshot(), &layers);
  if (!info.ok()) return info.status();
  const std::string& name = spec->snapshot();
  if (spec->kind() != v1::KIND_UNSPECIFIED && spec->kind() != v1::KIND_AUTO && spec->kind() != info->kind())
    return Status::InvalidArgument("snapshot '" + name + "' is of a " + v1::Kind_Name(info->kind()) +
                                   " sandbox; a sandbox of another kind cannot start from it");
  if (!spec->image().empty() && spec->image() != info->image())
    return Status::InvalidArgument("snapshot '" + name + "' stands on image " + info->image() + ", not " +
                                   spec->image() + " (leave the image out)");
  spec->set_kind(info->kind());
  spec->set_image(info->image());
  *spec->mutable_layers() = std::move(layers);
  return Status::Ok();
}

void HoldSnapshot(NodeSelf self, const v1::SandboxRecord& rec) {
  auto& snaps = self->state.ctx->snapshots;
  if (snaps && !rec.spec().snapshot().empty()) snaps->Hold(rec.spec().snapshot(), rec.id());
}

void ReleaseSnapshot(NodeSelf self, const std::string& id) {
  auto snaps = self->state.ctx->snapshots;
  if (!snaps) return;
  auto gone = snaps->Release(id);
  if (gone.empty()) return;
  auto log = self->state.ctx->log;
  self->spawn<caf::detached>([snaps, gone, log] {
    for (const auto& g : gone) {
      snaps->Drop(g);
      log->info("snapshot {} removed: the last sandbox forked from it is gone", g.name());
    }
  });
}

caf::result<v1::SnapshotReply> HandleSnapshots(NodeSelf self, v1::GetSnapshotRequest& req) {
  auto& snaps = self->state.ctx->snapshots;
  if (!snaps) return ErrorReply<v1::SnapshotReply>(NoSnapshots());
  auto info = snaps->Get(req.name());
  if (!info.ok()) return ErrorReply<v1::SnapshotReply>(info.status());
  v1::SnapshotReply r;
  *r.mutable_snapshot() = std::move(*info);
  return r;
}

caf::result<v1::SnapshotsReply> HandleSnapshots(NodeSelf self, v1::ListSnapshotsRequest&) {
  auto& snaps = self->state.ctx->snapshots;
  v1::SnapshotsReply r;
  if (!snaps) return r;  // none here
  for (auto& s : snaps->List()) *r.add_snapshots() = std::move(s);
  return r;
}

caf::result<v1::SnapshotReply> HandleSnapshots(NodeSelf self, v1::RemoveSnapshotRequest& req) {
  auto snaps = self->state.ctx->snapshots;
  if (!snaps) return ErrorReply<v1::SnapshotReply>(NoSnapshots());
  auto log = self->state.ctx->log;
  return OffThread<v1::SnapshotReply>(self, [snaps, log, name = req.name()] {
    auto info = snaps->Get(name);
    Status st = info.ok() ? snaps->Remove(name) : info.status();
    if (st.ok()) log->info("snapshot {} removed ({} bytes)", name, info->size_bytes());
    v1::SnapshotReply r = ErrorReply<v1::SnapshotReply>(st);
    if (info.ok()) *r.mutable_snapshot() = std::move(*info);
    return r;
  });
}

}  // namespace dsec
