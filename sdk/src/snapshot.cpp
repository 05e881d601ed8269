#include "dsec/snapshot.hpp"

#include <algorithm>

#include <random>

#include "sdk/src/client_impl.hpp"

namespace dsec {

// What dsec/snapshot.hpp needs of the handles' insides.
struct SnapshotCalls {
  static void Take(const Sandbox& sb, const std::string& name, Done<v1::SnapshotInfo> done, bool ephemeral = false) {
    v1::SnapshotRequest req;
    req.set_sandbox_id(sb.id_);
    req.set_name(name);
    req.set_ephemeral(ephemeral);
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

Result<std::vector<Session>> ForkSession(Client& client, const Session& session, uint32_t count,
                                         std::vector<std::string> names) {
  if (count == 0 || count > 100)
    return Status::InvalidArgument("session " + session.name() + ": a fork makes 1 to 100 sessions, not " +
                                   std::to_string(count));
  if (!names.empty() && names.size() != count)
    return Status::InvalidArgument("session " + session.name() + ": " + std::to_string(names.size()) +
                                   " names for " + std::to_string(count) + " forks");
  for (uint32_t i = 0; names.size() < count; ++i) names.push_back(session.name() + "/fork-" + std::to_string(i));
  auto rec = session.Get();
  if (!rec.ok()) return rec.status();
  if (rec->sandboxes().empty()) return Status::FailedPrecondition("session " + session.name() + " has no sandboxes");
  auto agent = session.sandbox();
  if (!agent.ok()) return agent.status();
  // Its agent's state now, for the forks' agents (removed with the last).
  std::string snap_name = "session-fork-";
  std::random_device rd;
  for (int i = 0; i < 16; ++i) snap_name += "0123456789abcdef"[rd() % 16];
  auto snap = Wait<v1::SnapshotInfo>(
      [&](Done<v1::SnapshotInfo> d) { SnapshotCalls::Take(*agent, snap_name, std::move(d), true); });
  if (!snap.ok()) return snap.status().Annotate("session " + session.name() + ": its agent's snapshot");
  SessionOptions options;
  for (int i = 1; i < rec->sandboxes_size(); ++i)
    options.more_sandboxes.emplace_back(rec->sandboxes(i).role(), rec->sandboxes(i).spec());
  options.lease_s = rec->lease_s();
  options.grade = rec->grade();
  options.fork_of.set_session(session.name());
  options.fork_of.set_steps(rec->step_count());
  v1::SandboxSpec spec = rec->spec();
  spec.set_snapshot(snap_name);
  std::vector<Session> out;
  Status failed;
  for (const auto& name : names) {
    auto s = client.OpenSession(name, spec, options);
    if (!s.ok()) {
      failed = s.status().Annotate("session " + session.name() + ": its fork " + name);
      break;
    }
    out.push_back(*s);
  }
  if (failed.ok()) return out;
  for (const auto& s : out) (void)s.Close();
  (void)RemoveSnapshot(client, snap_name);  // none uses it now (or the last close takes it)
  return failed;
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
