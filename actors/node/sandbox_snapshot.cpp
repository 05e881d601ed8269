// Sandbox.Snapshot and Sandbox.Fork, for the sandbox actor (DESIGN.md
// section 14): the driver writes the sandbox's state into the node's
// snapshot store (drivers/images/snapshot_store.hpp), which makes it
// durable whole or not at all; a fork is a snapshot of its own (removed
// with the last of its sandboxes) and `count` new sandboxes made on it by
// the node, all or none.
#include <memory>

#include "actors/continuation.hpp"
#include "actors/error_reply.hpp"
#include "actors/node/sandbox_state.hpp"
#include "drivers/images/snapshot_store.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "wire/wire.hpp"

namespace dsec::sandbox_detail {

namespace {

constexpr uint32_t kMaxFork = 100;

using Taken = std::function<void(Result<v1::SnapshotInfo>)>;

// A snapshot or fork (st.snapshotting) is answered: a destroy that waited
// for the last goes on.
void Unbusy(Self self) {
  auto& st = self->state;
  if (--st.snapshotting == 0 && st.after_snapshots) {
    auto next = std::move(st.after_snapshots);
    st.after_snapshots = nullptr;
    next();
  }
}

// Takes the snapshot `name` of the sandbox; `then` runs on the actor.
void Take(Self self, const std::string& name, bool ephemeral, Taken then) {
  auto& st = self->state;
  const std::string what = "sandbox " + st.rec.id();
  if (Status no = NotServing(self, /*paused_ok=*/true); !no.ok()) return then(no);
  if (Status can = drivers::Require(*st.driver, drivers::Capability::kSnapshot); !can.ok())
    return then(can.Annotate(what));
  auto snaps = st.ctx->snapshots;
  if (!snaps) return then(Status::FailedPrecondition("this node keeps no snapshots"));
  // What it stands on: the snapshot its sandbox started from, unless it
  // holds the whole state (a VM's memory and devices) or its layers are
  // as deep as they stack (a container's are then flattened into it).
  bool layer = st.driver->traits().isolation < v1::ISOLATION_KERNEL;  // a container's files
  bool whole = !layer ||
               static_cast<uint32_t>(st.rec.spec().layers().dirs_size()) >= images::SnapshotStore::kMaxDepth;
  const std::string parent = whole ? "" : st.rec.spec().snapshot();
  auto pending = snaps->Begin(name, parent);
  if (!pending.ok()) return then(pending.status());
  v1::SnapshotInfo info;
  info.set_kind(st.rec.spec().kind());
  info.set_source_sandbox(st.rec.id());
  info.set_image(st.rec.spec().image());
  info.set_parent(parent);
  info.set_ephemeral(ephemeral);
  auto handle = caf::actor_cast<sandbox_actor>(self);
  auto log = st.ctx->log;
  // A destroy meanwhile waits for it (StartDestroy), so it is answered.
  ++st.snapshotting;
  then = [self, then](Result<v1::SnapshotInfo> out) {
    then(std::move(out));
    Unbusy(self);
  };
  st.driver->Snapshot(
      st.rec, pending->part, pending->bytes_left,
      [handle, snaps, p = *pending, info, then, log, layer](Result<drivers::SnapshotStats> made) mutable {
        // On a driver thread: sharing its files with earlier layers and the
        // commit (an fsync and a store write) too.
        Result<v1::SnapshotInfo> out = made.status();
        if (made.ok() && layer) {
          auto shared = snaps->Share(p);
          if (shared.ok()) info.set_shared_bytes(shared->shared_bytes);
          else made = shared.status();
        }
        if (made.ok()) {
          info.set_size_bytes(made->bytes);
          info.set_entries(made->entries);
          info.set_image_digest(made->image_digest);
          out = snaps->Commit(p, info);
        } else {
          snaps->Abort(p);
        }
        if (out.ok())
          log->info("snapshot {} of sandbox {}: {} entries, {} bytes ({} shared with earlier snapshots), {} layer(s)",
                    out->name(), out->source_sandbox(), out->entries(), out->size_bytes(), out->shared_bytes(),
                    out->depth());
        Post(handle, [then, out = std::move(out)]() mutable { then(std::move(out)); });
      });
}

}  // namespace

caf::result<v1::SnapshotReply> TakeSnapshot(Self self, v1::SnapshotRequest& req) {
  auto rp = self->make_response_promise<v1::SnapshotReply>();
  Touch(self);
  Take(self, req.name(), req.ephemeral(), [rp](Result<v1::SnapshotInfo> info) mutable {
    v1::SnapshotReply r = ErrorReply<v1::SnapshotReply>(info.status());
    if (info.ok()) *r.mutable_snapshot() = std::move(*info);
    rp.deliver(std::move(r));
  });
  return rp;
}

namespace {

// The forks under way: their answers, in order.
struct Forking {
  caf::typed_response_promise<v1::ForkReply> rp;
  std::string snapshot;
  std::vector<v1::SandboxRecord> made;  // by slot; id "" where none was made
  std::vector<std::string> failures;
  Status first;  // the first failure, whose code the answer takes
  size_t waiting = 0;
};

// All made: the answer. One or more failed: the others are destroyed
// (all or none), and the answer says which failed and why.
void Finish(Self self, const std::shared_ptr<Forking>& f) {
  v1::ForkReply r;
  r.set_snapshot(f->snapshot);
  if (f->failures.empty()) {
    for (auto& m : f->made) *r.add_sandboxes() = std::move(m);
    f->rp.deliver(std::move(r));
    Unbusy(self);
    return;
  }
  auto node = caf::actor_cast<entry_actor>(self->state.node);
  bool none = true;
  for (const auto& m : f->made) none = none && m.id().empty();
  if (none) {  // no sandbox held it: it goes now (else with the last one's end)
    v1::RemoveSnapshotRequest rm;
    rm.set_name(f->snapshot);
    self->request(node, std::chrono::minutes(5), std::move(rm)).then([](v1::SnapshotReply&) {}, [](caf::error&) {});
  }
  // The answer once those made are gone: a caller that tries a smaller
  // fork at once finds their room free.
  auto left = std::make_shared<size_t>(0);
  for (const auto& m : f->made) *left += m.id().empty() ? 0 : 1;
  auto answer = std::make_shared<v1::ForkReply>();
  auto gone = [self, f, left, answer]() {
    if (--*left > 0) return;
    f->rp.deliver(std::move(*answer));
    Unbusy(self);
  };
  for (const auto& m : f->made) {
    if (m.id().empty()) continue;
    v1::DestroyRequest d;
    d.set_sandbox_id(m.id());
    d.set_reason("its fork of " + self->state.rec.id() + " failed: all or none");
    self->request(node, std::chrono::minutes(5), std::move(d)).then([gone](v1::SandboxReply&) { gone(); },
                                                                     [gone](caf::error&) { gone(); });
  }
  ToProto(Status(f->first.code(), "fork of sandbox " + self->state.rec.id() + ": " +
                                       std::to_string(f->failures.size()) + " of " + std::to_string(f->made.size()) +
                                       " could not be made (none is kept): " + f->failures.front()),
          r.mutable_status());
  for (auto& why : f->failures) r.add_failures(std::move(why));
  if (*left == 0) {
    f->rp.deliver(std::move(r));
    Unbusy(self);
  } else {
    *answer = std::move(r);
  }
}

}  // namespace

caf::result<v1::ForkReply> Fork(Self self, v1::ForkRequest& req) {
  auto& st = self->state;
  const std::string what = "sandbox " + st.rec.id();
  if (req.count() == 0 || req.count() > kMaxFork)
    return ErrorReply<v1::ForkReply>(Status::InvalidArgument(what + ": a fork makes 1 to " +
                                                             std::to_string(kMaxFork) + " sandboxes, not " +
                                                             std::to_string(req.count())));
  if (st.driver)
    if (Status can = drivers::Require(*st.driver, drivers::Capability::kFork); !can.ok())
      return ErrorReply<v1::ForkReply>(can.Annotate(what));
  auto f = std::make_shared<Forking>();
  f->rp = self->make_response_promise<v1::ForkReply>();
  uint32_t count = req.count();
  // Sandbox ids are [a-z0-9-]: a snapshot name of them is one too.
  std::string name = "fork-" + st.rec.id().substr(0, 64) + "-" + RandomHex(8);
  Touch(self);
  // A destroy meanwhile waits for the answer (the forks are made, or none).
  ++st.snapshotting;
  Take(self, name, true, [self, f, count](Result<v1::SnapshotInfo> info) {
    auto& st = self->state;
    if (!info.ok()) {
      f->rp.deliver(ErrorReply<v1::ForkReply>(info.status().Annotate("fork of sandbox " + st.rec.id())));
      Unbusy(self);
      return;
    }
    f->snapshot = info->name();
    f->made.resize(count);
    f->waiting = count;
    // Each a new sandbox of the source's spec on the snapshot, with its
    // own id (so hostname) and lifetime, for the source's owner.
    v1::CreateRequest create;
    *create.mutable_spec() = st.rec.spec();
    create.mutable_spec()->set_snapshot(info->name());
    create.mutable_spec()->clear_layers();
    if (!st.rec.session().empty()) {  // a session's sandbox: the forks are plain ones
      create.mutable_spec()->clear_ttl_s();
      create.mutable_spec()->clear_idle_timeout_s();
    }
    create.set_owner(st.rec.owner());
    create.set_lease_s(st.rec.lease_s());
    create.set_detached(st.rec.owner().empty());
    auto node = caf::actor_cast<entry_actor>(st.node);
    for (uint32_t i = 0; i < count; ++i) {
      auto done = [self, f, i](const Status& s, v1::SandboxRecord rec) {
        if (s.ok()) f->made[i] = std::move(rec);
        else {
          if (f->failures.empty()) f->first = s;
          f->failures.push_back("fork " + std::to_string(i) + ": " + s.message());
        }
        if (--f->waiting == 0) Finish(self, f);
      };
      self->request(node, std::chrono::minutes(5), create)
          .then([done](v1::SandboxReply& r) { done(FromProto(r.status()), std::move(*r.mutable_sandbox())); },
                [done](caf::error& e) { done(Status::Unavailable("the node did not answer: " + caf::to_string(e)), {}); });
    }
  });
  return f->rp;
}

}  // namespace dsec::sandbox_detail
