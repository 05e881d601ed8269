// The E2B door's snapshots and forks (docs/e2b.md): E2B's calls made of
// dsec's snapshots (SnapshotRequest and the rest, docs/running.md
// "Snapshots"). A fork is a snapshot of the fork's own (removed with the
// last sandbox made from it, as Sandbox.Fork's) and one create from it per
// sandbox, each with an id E2B's SDK takes and the lifetime asked; each
// fork succeeds or fails on its own, as E2B's do (dsec's own Fork is all
// or none).
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/front/e2b/door_internal.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"

namespace dsec::e2b {
namespace {

using nlohmann::json;

// The most sandboxes one fork makes (dsec's Fork takes as many).
constexpr int64_t kMaxForks = 100;
// The most snapshots one page lists.
constexpr int64_t kMaxPage = 100;

using Reply = std::shared_ptr<HttpResponder>;

// The forks of one call under way: each slot's answer, in order.
struct Forks {
  std::string snapshot;
  std::vector<json> results;
  size_t waiting = 0;
  size_t made = 0;
};

void Fork(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& id,
          const std::string& secret) {
  json body;
  uint32_t timeout = 0;
  if (!Body(c, &body) || !Seconds(c, body, "timeout", kDefaultTimeoutS, &timeout)) return;
  int64_t count = 1;
  if (auto n = body.find("count"); n != body.end() && !n->is_null()) {
    if (!n->is_number_integer() || n->get<int64_t>() < 1 || n->get<int64_t>() > kMaxForks)
      return Error(c.reply, 400, "'count' must be a whole number from 1 to " + std::to_string(kMaxForks));
    count = n->get<int64_t>();
  }
  auto reply = c.reply;
  v1::GetSandboxRequest get;
  get.set_sandbox_id(id);
  Ask<v1::SandboxReply>(self, entry, reply, std::move(get), [=](v1::SandboxReply& got) {
    if (Gone(got.sandbox())) return Error(reply, 404, "sandbox " + id + " ended");
    v1::SnapshotRequest snap;
    snap.set_sandbox_id(id);
    snap.set_name("fork-" + id + "-" + RandomHex(8));
    snap.set_ephemeral(true);  // removed with the last of its forks
    v1::SandboxSpec spec = got.sandbox().spec();
    Ask<v1::SnapshotReply>(self, entry, reply, std::move(snap), [=](v1::SnapshotReply& taken) mutable {
      auto f = std::make_shared<Forks>();
      f->snapshot = taken.snapshot().name();
      f->results.resize(static_cast<size_t>(count));
      f->waiting = static_cast<size_t>(count);
      spec.set_snapshot(f->snapshot);
      spec.clear_layers();
      spec.set_ttl_s(timeout);
      auto finish = [self, entry, reply, f] {
        if (--f->waiting > 0) return;
        if (f->made == 0) {  // nothing holds the fork's snapshot: it goes now
          v1::RemoveSnapshotRequest rm;
          rm.set_name(f->snapshot);
          self->request(entry, kCallTimeout, std::move(rm)).then([](v1::SnapshotReply&) {}, [](caf::error&) {});
        }
        reply->Send(201, kJson, json(f->results).dump());
      };
      for (size_t i = 0; i < f->results.size(); ++i) {
        v1::CreateRequest create;
        create.set_id("e" + RandomHex(19));
        create.set_detached(true);
        *create.mutable_spec() = spec;
        auto failed = [f, i, finish](int code, const std::string& why) {
          f->results[i] = {{"error", {{"code", code}, {"message", why}}}};
          finish();
        };
        self->request(entry, kCallTimeout, std::move(create))
            .then(
                [f, i, secret, finish, failed](v1::SandboxReply& r) {
                  Status s = FromProto(r.status());
                  if (!s.ok()) return failed(HttpCode(s), s.message());
                  ++f->made;
                  f->results[i] = {{"sandbox", Created(r.sandbox(), secret)}};
                  finish();
                },
                [failed](caf::error& e) { failed(503, "dsec did not answer: " + caf::to_string(e)); });
      }
    });
  });
}

// A snapshot as E2B's SnapshotInfo: its name is its id.
json Snapshot(const v1::SnapshotInfo& s) { return {{"snapshotID", s.name()}, {"names", json::array({s.name()})}}; }

void TakeSnapshot(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& id) {
  json body;
  if (!Body(c, &body)) return;
  v1::SnapshotRequest req;
  req.set_sandbox_id(id);
  auto name = body.find("name");
  if (name != body.end() && !name->is_null() && !name->is_string())
    return Error(c.reply, 400, "'name' must be a string (a snapshot's name: [a-z0-9][a-z0-9._-]*)");
  req.set_name(name != body.end() && name->is_string() && !name->get<std::string>().empty()
                   ? name->get<std::string>()
                   : "snapshot-" + RandomHex(12));
  auto reply = c.reply;
  Ask<v1::SnapshotReply>(self, entry, reply, std::move(req),
                         [reply](v1::SnapshotReply& r) { reply->Send(201, kJson, Snapshot(r.snapshot()).dump()); });
}

// Snapshots taken through any door (a fork's own are not listed), by
// name; `sandboxID` and `name` filter, `nextToken` is the last name seen.
void ListSnapshots(caf::event_based_actor* self, const entry_actor& entry, Call& c) {
  auto q = Query(c.req.query);
  int64_t limit = kMaxPage;
  if (q.count("limit")) {
    char* end = nullptr;
    limit = std::strtoll(q["limit"].c_str(), &end, 10);
    if (q["limit"].empty() || *end || limit < 1 || limit > kMaxPage)
      return Error(c.reply, 400, "'limit' must be a whole number from 1 to " + std::to_string(kMaxPage));
  }
  auto reply = c.reply;
  Ask<v1::SnapshotsReply>(self, entry, reply, v1::ListSnapshotsRequest{}, [reply, q, limit](v1::SnapshotsReply& r) {
    std::vector<const v1::SnapshotInfo*> found;
    for (const auto& s : r.snapshots()) {
      if (s.ephemeral()) continue;
      if (q.count("sandboxID") && s.source_sandbox() != q.at("sandboxID")) continue;
      if (q.count("name") && s.name() != q.at("name")) continue;
      if (q.count("nextToken") && s.name() <= q.at("nextToken")) continue;
      found.push_back(&s);
    }
    std::sort(found.begin(), found.end(), [](auto* a, auto* b) { return a->name() < b->name(); });
    json out = json::array();
    HttpHeaders extra;
    for (const auto* s : found) {
      if (static_cast<int64_t>(out.size()) == limit) {
        extra.emplace_back("X-Next-Token", out.back()["snapshotID"].get<std::string>());
        break;
      }
      out.push_back(Snapshot(*s));
    }
    reply->Send(200, kJson, out.dump(), std::move(extra));
  });
}

void DeleteSnapshot(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& name) {
  v1::RemoveSnapshotRequest req;
  req.set_name(name);
  auto reply = c.reply;
  Ask<v1::SnapshotReply>(self, entry, reply, std::move(req), [reply](v1::SnapshotReply&) { reply->Send(204, kJson, ""); });
}

}  // namespace

bool ServeSnapshots(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& secret) {
  const std::string& m = c.req.method;
  const std::string& p = c.req.path;
  if (m == "GET" && p == "/snapshots") return ListSnapshots(self, entry, c), true;
  if (m == "DELETE" && p.rfind("/templates/", 0) == 0) {
    std::string name = Query("n=" + p.substr(11))["n"];  // its name, %-decoded
    if (name.empty() || name.find('/') != std::string::npos)
      return Error(c.reply, 404, "no template or snapshot '" + name.substr(0, 128) + "'"), true;
    return DeleteSnapshot(self, entry, c, name), true;
  }
  if (m != "POST" || p.rfind("/sandboxes/", 0) != 0) return false;
  std::string rest = p.substr(11);
  size_t slash = rest.find('/');
  if (slash == std::string::npos) return false;
  std::string id = rest.substr(0, slash), sub = rest.substr(slash);
  if (sub != "/fork" && sub != "/snapshots") return false;
  if (!E2bId(id)) return Error(c.reply, 404, "sandbox '" + id.substr(0, 64) + "' not found"), true;
  if (sub == "/fork") Fork(self, entry, c, id, secret);
  else TakeSnapshot(self, entry, c, id);
  return true;
}

void FindSnapshot(caf::event_based_actor* self, const entry_actor& entry, const std::string& name,
                  std::function<void(Result<v1::SnapshotInfo>)> then) {
  v1::GetSnapshotRequest get;
  get.set_name(name);
  self->request(entry, kCallTimeout, std::move(get))
      .then(
          [then](v1::SnapshotReply& r) {
            Status s = FromProto(r.status());
            if (!s.ok()) return then(s);
            then(std::move(*r.mutable_snapshot()));
          },
          [then](caf::error& e) { then(Status::Unavailable("dsec did not answer: " + caf::to_string(e))); });
}

}  // namespace dsec::e2b
