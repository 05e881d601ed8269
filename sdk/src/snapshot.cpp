#include "dsec/snapshot.hpp"

#include <algorithm>

#include "sdk/src/client_impl.hpp"

namespace dsec {

// What dsec/snapshot.hpp needs of the handles' insides.
struct SnapshotCalls {
  static void Take(const Sandbox& sb, const std::string& name, Done<v1::SnapshotInfo> done) {
    v1::SnapshotRequest req;
    req.set_sandbox_id(sb.id_);
    req.set_name(name);
    // The copy of what it changed: longer than a plain call.
    auto timeout = std::max<std::chrono::milliseconds>(sb.client_->impl_->options.rpc_timeout, std::chrono::minutes(5));
    sb.client_->impl_->CallVia<v1::SnapshotReply>(
        sb.route_, std::move(req), timeout,
        Then<v1::SnapshotReply>(std::move(done), [](v1::SnapshotReply& r) { return std::move(*r.mutable_snapshot()); }));
  }
  static void Fork(const Sandbox& sb, uint32_t count, Done<std::vector<Sandbox>> done) {
    v1::ForkRequest req;
    req.set_sandbox_id(sb.id_);
    req.set_count(count);
    // A snapshot, then up to 100 creations: longer than a plain call.
    auto timeout = std::max<std::chrono::milliseconds>(sb.client_->impl_->options.rpc_timeout, std::chrono::minutes(5));
    Client* c = sb.client_;
    std::string route = sb.route_;
    c->impl_->CallVia<v1::ForkReply>(route, std::move(req), timeout,
                                     Then<v1::ForkReply>(std::move(done), [c, route](v1::ForkReply& r) {
                                       std::vector<Sandbox> out;
                                       for (const auto& rec : r.sandboxes())
                                         out.push_back(Sandbox(c, rec.id(), rec.spec(), route));
                                       return out;
                                     }));
  }
  template <class Reply, class Request, class T, class Pick>
  static void Ask(Client& c, Request req, Done<T> done, Pick pick) {
    c.impl_->Call<Reply>(std::move(req), c.impl_->options.rpc_timeout, Then<Reply>(std::move(done), pick));
  }
};

void SnapshotAsync(const Sandbox& sandbox, const std::string& name, Done<v1::SnapshotInfo> done) {
  SnapshotCalls::Take(sandbox, name, std::move(done));
}

Result<v1::SnapshotInfo> Snapshot(const Sandbox& sandbox, const std::string& name) {
  return Wait<v1::SnapshotInfo>([&](Done<v1::SnapshotInfo> d) { SnapshotAsync(sandbox, name, std::move(d)); });
}

void ForkAsync(const Sandbox& sandbox, uint32_t count, Done<std::vector<Sandbox>> done) {
  SnapshotCalls::Fork(sandbox, count, std::move(done));
}

Result<std::vector<Sandbox>> Fork(const Sandbox& sandbox, uint32_t count) {
  return Wait<std::vector<Sandbox>>([&](Done<std::vector<Sandbox>> d) { ForkAsync(sandbox, count, std::move(d)); });
}

namespace {
v1::SnapshotInfo Info(v1::SnapshotReply& r) { return std::move(*r.mutable_snapshot()); }
}  // namespace

void GetSnapshotAsync(Client& client, const std::string& name, Done<v1::SnapshotInfo> done) {
  v1::GetSnapshotRequest req;
  req.set_name(name);
  SnapshotCalls::Ask<v1::SnapshotReply>(client, std::move(req), std::move(done), Info);
}

void ListSnapshotsAsync(Client& client, Done<std::vector<v1::SnapshotInfo>> done) {
  SnapshotCalls::Ask<v1::SnapshotsReply>(client, v1::ListSnapshotsRequest(), std::move(done),
                                         [](v1::SnapshotsReply& r) {
                                           return std::vector<v1::SnapshotInfo>(r.snapshots().begin(),
                                                                                r.snapshots().end());
                                         });
}

void RemoveSnapshotAsync(Client& client, const std::string& name, DoneStatus done) {
  v1::RemoveSnapshotRequest req;
  req.set_name(name);
  Done<v1::SnapshotInfo> d = [done = std::move(done)](Result<v1::SnapshotInfo> r) { done(r.status()); };
  SnapshotCalls::Ask<v1::SnapshotReply>(client, std::move(req), std::move(d), Info);
}

Result<v1::SnapshotInfo> GetSnapshot(Client& client, const std::string& name) {
  return Wait<v1::SnapshotInfo>([&](Done<v1::SnapshotInfo> d) { GetSnapshotAsync(client, name, std::move(d)); });
}

Result<std::vector<v1::SnapshotInfo>> ListSnapshots(Client& client) {
  return Wait<std::vector<v1::SnapshotInfo>>(
      [&](Done<std::vector<v1::SnapshotInfo>> d) { ListSnapshotsAsync(client, std::move(d)); });
}

Status RemoveSnapshot(Client& client, const std::string& name) {
  return WaitStatus([&](DoneStatus d) { RemoveSnapshotAsync(client, name, std::move(d)); });
}

}  // namespace dsec
