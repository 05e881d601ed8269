// The controller (docs/cluster.md): the node registry, placement, and the
// directory of which node holds which sandbox and session. It answers the
// SDK entry for the whole cluster: a create or open is placed on a node and
// forwarded there, and the reply names the node's SDK address, where the
// SDK then sends that sandbox's (session's) calls itself. A call naming a
// sandbox or session that reaches the controller anyway (an attach, dsecctl)
// is forwarded to its node, or answered "lost" with the node's name.
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/logger.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "actors/cluster.hpp"
#include "actors/controller_state.hpp"
#include "actors/context.hpp"
#include "actors/error_reply.hpp"
#include "actors/sandbox_list.hpp"
#include "actors/session.hpp"
#include "drivers/registry.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "runtime/front_door.hpp"
#include "runtime/metrics.hpp"
#include "runtime/proto_json.hpp"
#include "state/group_commit.hpp"
#include "state/table.hpp"

namespace dsec {

using namespace controller_detail;  // NOLINT: this file is its other half

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;



std::string SandboxKey(const std::string& id) { return "b/" + id; }
std::string SessionKey(const std::string& name) { return "s/" + name; }
std::string RestartableKey(const std::string& name) { return "r/" + name; }
// A node id has no '/': "c/NODE/NAME" splits at the first one after "c/".
std::string ClosedAwayKey(const std::string& node, const std::string& name) { return "c/" + node + "/" + name; }

std::string Clock_(int64_t ms) {
  time_t t = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

namespace controller_detail {

void Persist(Self self, state::WriteBatch b) {
  if (b.empty()) return;
  self->state.ctx->committer->Submit(std::move(b), [log = self->state.ctx->log](const Status& s) {
    if (!s.ok()) log->error("controller store: {}", s.message());
  });
}

void PersistNode(Self self, const NodeEntry& n) {
  state::WriteBatch b;
  state::TypedTable<cluster::v1::ClusterNode>(self->state.ctx->store, state::Table::kNodes).Put(&b, n.rec.node().id(), n.rec);
  Persist(self, std::move(b));
}

// Drops restartable session `name`'s entry and its log's copy (into `b`).
// A node that held it and is down (one it left, or the one it was on) may
// come back with a copy: that is closed at its rejoin (closed_away), not
// taken for a session of its own.
void ForgetRestartable(Self self, const std::string& name, state::WriteBatch* b) {
  auto& st = self->state;
  b->Delete(state::Table::kPlacements, RestartableKey(name));
  b->DeletePrefix(state::Table::kSteps, state::StepPrefix(name));
  auto it = st.restartable.find(name);
  if (it == st.restartable.end()) return;
  std::set<std::string> held = std::move(it->second.left);
  if (auto on = st.session_node.find(name); on != st.session_node.end()) held.insert(on->second);
  for (const auto& node : held) {
    auto n = st.nodes.find(node);
    if (n == st.nodes.end() || n->second.up()) continue;
    st.closed_away[node].insert(name);
    b->Put(state::Table::kPlacements, ClosedAwayKey(node, name), "");
  }
  st.restartable.erase(it);
}

// Why node `id` cannot answer for `what` now.
Status NodeGone(Self self, const std::string& id, const std::string& what) {
  auto it = self->state.nodes.find(id);
  if (it == self->state.nodes.end())
    return Status::Unavailable(what + " is lost: it was on node " + id + ", which this controller no longer knows");
  const auto& r = it->second.rec;
  return Status::Unavailable(what + " is lost: its node " + id + " is down since " + Clock_(r.down_ms()) + " (" +
                             r.down_reason() + "); it comes back if the node rejoins with it");
}

}  // namespace controller_detail

namespace {

void Restart(Self self, const std::string& name, const std::string& from);

void MarkDown(Self self, NodeEntry& n, const std::string& why) {
  if (!n.up()) return;
  self->demonitor(n.entry);
  self->state.node_of.erase(n.entry.address());
  n.entry = nullptr;
  n.pending = 0;
  n.rec.set_state("down");
  n.rec.set_down_ms(WallClockMs());
  n.rec.set_down_reason(why);
  self->state.ctx->log->warn("node {} ({}) is down: {}; its sandboxes and sessions are reported lost until it rejoins",
                             n.rec.node().id(), n.rec.node().sdk_address(), why);
  auto waiting = std::move(n.waiting);
  n.waiting.clear();
  for (auto& [call, fail] : waiting)
    fail(Status::Unavailable("node " + n.rec.node().id() + " went down (" + why +
                             ") while the call was in flight; it may or may not have been carried out"));
  PersistNode(self, n);
  // Restartable sessions it held go on elsewhere (after this handler: the
  // placement must not pick it).
  const std::string id = n.rec.node().id();
  std::vector<std::string> moving;
  for (const auto& [name, r] : self->state.restartable) {
    auto at = self->state.session_node.find(name);
    if (at != self->state.session_node.end() && at->second == id) moving.push_back(name);
  }
  for (const auto& name : moving) self->send(self, Continuation{[self, name, id] { Restart(self, name, id); }});
}

bool Settle(Self self, const std::string& node, uint64_t call) {
  auto it = self->state.nodes.find(node);
  return it != self->state.nodes.end() && it->second.waiting.erase(call) > 0;
}

// Sends `req` to node `node` and hands its reply to `done` (exactly once):
// the node's answer, or an error naming the node.
template <class Reply, class Request>
void Forward(Self self, const std::string& node, const std::string& what, Request req,
             std::chrono::milliseconds timeout, std::function<void(Reply)> done) {
  auto it = self->state.nodes.find(node);
  if (it == self->state.nodes.end() || !it->second.up()) return done(ErrorReply<Reply>(NodeGone(self, node, what)));
  uint64_t call = ++self->state.next_call;
  auto shared = std::make_shared<std::function<void(Reply)>>(std::move(done));
  it->second.waiting[call] = [shared](const Status& s) { (*shared)(ErrorReply<Reply>(s)); };
  self->request(it->second.entry, timeout, std::move(req))
      .then(
          [self, node, call, shared](Reply& r) {
            if (Settle(self, node, call)) (*shared)(std::move(r));
          },
          [self, node, call, shared, what](caf::error& e) {
            if (Settle(self, node, call))
              (*shared)(ErrorReply<Reply>(
                  Status::Unavailable("node " + node + " did not answer for " + what + ": " + caf::to_string(e))));
          });
}

std::chrono::milliseconds ExecTimeout(const v1::ExecRequest& req) {
  uint32_t limit = req.limits().timeout_ms() ? req.limits().timeout_ms() : 30'000;
  return std::chrono::milliseconds(limit) + std::chrono::minutes(2);
}
constexpr std::chrono::milliseconds kCallTimeout{std::chrono::minutes(5)};

const std::string* SdkAddress(Self self, const std::string& node) {
  auto it = self->state.nodes.find(node);
  return it == self->state.nodes.end() ? nullptr : &it->second.rec.node().sdk_address();
}

// The node in this process (role all) when it is up and `node` is it (or
// `node` is empty): calls for it are delegated, so the trainer stays their
// sender. The node then tracks its owner Hello, its session leases and
// its streamed output as it would without a controller, and answers with
// its own errors. Null otherwise.
node_actor InProcess(Self self, const std::string& node = "") {
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
template <class Reply>
void Decorate(Self, const std::string&, Reply*) {}

// A call naming a sandbox or session (`what` and `key`, found in `dir`):
// to the node that holds it.
template <class Reply, class Request>
caf::result<Reply> ToHolder(Self self, const std::unordered_map<std::string, std::string>& dir, const std::string& what,
                            const std::string& key, Request& req, std::chrono::milliseconds timeout) {
  auto it = dir.find(key);
  // The node in this process answers for what the directory has not yet
  // heard of from its heartbeat.
  if (auto local = InProcess(self, it == dir.end() ? "" : it->second)) return self->delegate(local, std::move(req));
  if (it == dir.end())
    return ErrorReply<Reply>(Status::NotFound("no " + what + " '" + key + "' in this cluster (dsecctl " +
                                              (what == "session" ? "sessions" : "ls") + " lists them)"));
  auto rp = self->template make_response_promise<Reply>();
  std::string node = it->second;
  Forward<Reply>(self, node, what + " " + key, std::move(req), timeout, [self, rp, node](Reply r) mutable {
    Decorate(self, node, &r);
    rp.deliver(std::move(r));
  });
  return rp;
}

template <class Reply, class Request>
caf::result<Reply> ToSandboxNode(Self self, const std::string& id, Request& req,
                                 std::chrono::milliseconds timeout = kCallTimeout) {
  return ToHolder<Reply>(self, self->state.sandbox_node, "sandbox", id, req, timeout);
}

template <class Reply, class Request>
caf::result<Reply> ToSessionNode(Self self, const std::string& name, Request& req,
                                 std::chrono::milliseconds timeout = kCallTimeout) {
  // A restartable session whose node died: on its way to another node, or stopped.
  if (auto r = self->state.restartable.find(name); r != self->state.restartable.end()) {
    if (!r->second.restarting_on.empty())
      return ErrorReply<Reply>(Status::Unavailable("session " + name + " is being restarted on node " +
                                                   r->second.restarting_on +
                                                   " (its node went down); call again in a moment"));
    if (!r->second.failed.empty())
      return ErrorReply<Reply>(Status::FailedPrecondition("session " + name + " " + r->second.failed));
  }
  return ToHolder<Reply>(self, self->state.session_node, "session", name, req, timeout);
}

// ---- placement ----

// What a node's heartbeat says it holds, "name@digest": this controller's
// image by that name (same digest), or any by that name when it has none.
bool HoldsImage(const ControllerState& st, const cluster::v1::ClusterNode& rec, const std::string& image) {
  auto known = st.image_by_name.find(image);
  for (const auto& i : rec.load().images()) {
    if (i.size() <= image.size() || i.compare(0, image.size(), image) != 0 || i[image.size()] != '@') continue;
    if (known == st.image_by_name.end() || i.compare(image.size() + 1, std::string::npos, known->second.digest()) == 0)
      return true;
  }
  return false;
}

// How much holding the image weighs against free slots (a share of 0..1).
constexpr double kLocality = 0.1;

// Runs `then` once node `node` holds `spec`'s image: at once when it does
// (or the spec needs none), else after the node fetched it from this
// controller; an error naming both when that failed.
void EnsureImage(Self self, const std::string& node, const v1::SandboxSpec& spec, std::function<void(Status)> then) {
  auto& st = self->state;
  const std::string& image = spec.image();
  auto n = st.nodes.find(node);
  auto known = st.image_by_name.find(image);
  if (image.empty() || image == "host" || n == st.nodes.end() || known == st.image_by_name.end() ||
      HoldsImage(st, n->second.rec, image) || !n->second.up())
    return then(Status::Ok());
  v1::ImageManifest m = known->second;
  st.ctx->log->info("node {} fetches image {} ({} bytes) for a placement", node, image, m.size_bytes());
  self->request(n->second.entry, std::chrono::minutes(10), fetch_image_atom::value, m,
                caf::actor_cast<caf::actor>(st.images))
      .then(
          [self, node, m, then](v1::ImageReply& r) {
            if (r.status().code() != v1::Status::OK)
              return then(Status::Unavailable("node " + node + " could not fetch image " + m.name() + ": " +
                                              r.status().message()));
            auto it = self->state.nodes.find(node);
            if (it != self->state.nodes.end())
              it->second.rec.mutable_load()->add_images(m.name() + "@" + m.digest());
            then(Status::Ok());
          },
          [node, m, then](caf::error& e) {
            then(Status::Unavailable("node " + node + " could not fetch image " + m.name() + ": " + caf::to_string(e)));
          });
}

// EnsureImage for each of a session's sandboxes (its agent's and those of
// more_sandboxes), one after another; `then` gets the first failure.
void EnsureSessionImages(Self self, const std::string& node, const v1::OpenSessionRequest& open,
                         std::function<void(Status)> then, int next = -1) {
  if (next >= open.more_sandboxes_size()) return then(Status::Ok());
  const v1::SandboxSpec& spec = next < 0 ? open.spec() : open.more_sandboxes(next).spec();
  EnsureImage(self, node, spec, [self, node, open, then, next](Status ready) {
    if (!ready.ok()) return then(ready);
    EnsureSessionImages(self, node, open, then, next + 1);
  });
}

// The node for a new sandbox (or session) with `spec`: among the nodes that
// are up, not draining, run its kind and hold its image, the one with the
// largest share of its slots free (so nodes fill in proportion to their
// capacity). A status naming each node and why not, when none fits.
Result<std::string> Place(Self self, const v1::SandboxSpec& spec) {
  auto& st = self->state;
  auto started = Clock::now();
  std::string best;
  double best_free = -1;
  std::vector<std::string> why;
  const std::string& image = spec.image();
  bool host_image = image.empty() || image == "host";
  for (auto& [id, n] : st.nodes) {
    const auto& rec = n.rec;
    if (!n.up()) {
      why.push_back(id + " is down");
      continue;
    }
    if (rec.draining()) {
      why.push_back(id + " is draining");
      continue;
    }
    if (n.in_process) {  // role all: its kinds and images are its own to check, with their reasons
      best = id;
      break;
    }
    v1::Kind kind = spec.kind();
    if (kind == v1::KIND_AUTO || kind == v1::KIND_UNSPECIFIED) {
      std::vector<const drivers::Kind*> here;
      for (const auto& k : st.kinds)
        if (std::find(rec.node().kinds().begin(), rec.node().kinds().end(), k->name()) != rec.node().kinds().end())
          here.push_back(k.get());
      auto chosen = drivers::ChooseKind(spec, here);
      if (!chosen.ok()) {
        why.push_back(id + ": " + chosen.status().message());
        continue;
      }
      kind = *chosen;
    }
    if (std::find(rec.node().kinds().begin(), rec.node().kinds().end(), KindName(kind)) == rec.node().kinds().end()) {
      why.push_back(id + " does not run " + KindName(kind) + " sandboxes");
      continue;
    }
    // Image locality: a node that holds the image is preferred; one that
    // does not can take it if this controller has the image to send.
    double local = 1;
    if (!host_image) {
      if (!HoldsImage(st, rec, image)) {
        if (!st.image_by_name.count(image)) {
          why.push_back(id + " lacks image " + image + " (and this controller has none by that name to send)");
          continue;
        }
        local = 0;
      }
    }
    uint64_t slots = std::max<uint64_t>(rec.load().slots(), 1);
    uint64_t used = rec.load().sandboxes() + n.pending;
    if (used >= slots) {
      why.push_back(id + " is full (" + std::to_string(used) + " of " + std::to_string(slots) + " slots)");
      continue;
    }
    double free = static_cast<double>(slots - used) / static_cast<double>(slots) + kLocality * local;
    if (free > best_free) {
      best_free = free;
      best = id;
    }
  }
  if (best.empty()) {
    std::string list;
    for (const auto& w : why) list += (list.empty() ? "" : "; ") + w;
    if (st.nodes.empty())
      list = st.ctx->cluster_address.empty()
                 ? "its node has not joined yet (dsecd is starting)"
                 : "no node has joined (start dsecd --role node --join " + st.ctx->cluster_address + ")";
    return Status::Unavailable("no node can take this " + std::string(KindName(spec.kind())) + " sandbox: " + list);
  }
  auto& chosen = st.nodes[best];
  chosen.pending++;
  st.placed++;
  // (A node in this process observes its own placement: its choice of kind.)
  if (!chosen.in_process)
    metrics::PlacementSeconds().Observe(std::chrono::duration<double>(Clock::now() - started).count());
  return best;
}

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

void PutPlacement(Self self, state::WriteBatch* b, const std::string& key, const std::string& node) {
  b->Put(state::Table::kPlacements, key, node);
}

caf::result<v1::SandboxReply> Create(Self self, v1::CreateRequest& req) {
  auto& st = self->state;
  if (!st.in_process.empty()) {  // role all: the node's own id checks and errors
    auto node = Place(self, req.spec());
    if (!node.ok()) return ErrorReply<v1::SandboxReply>(node.status());
    if (auto local = InProcess(self, *node)) return self->delegate(local, std::move(req));
  }
  if (req.id().empty()) req.set_id("sb-" + RandomHex(12));
  const std::string id = req.id();
  if (auto it = st.sandbox_node.find(id); it != st.sandbox_node.end())
    return ToSandboxNode<v1::SandboxReply>(self, id, req);  // its node says it is taken
  if (!ValidId(id))
    return ErrorReply<v1::SandboxReply>(
        Status::InvalidArgument("sandbox id '" + id.substr(0, 64) + "' is not [a-z0-9-], 1 to 64 bytes"));
  auto node = Place(self, req.spec());
  if (!node.ok()) return ErrorReply<v1::SandboxReply>(node.status());
  st.sandbox_node[id] = *node;
  auto rp = self->make_response_promise<v1::SandboxReply>();
  std::string n = *node;
  auto spec = req.spec();
  auto shared_req = std::make_shared<v1::CreateRequest>(std::move(req));
  EnsureImage(self, n, spec, [self, rp, n, id, shared_req](Status ready) mutable {
    if (!ready.ok()) {
      auto& st = self->state;
      if (auto it = st.sandbox_node.find(id); it != st.sandbox_node.end() && it->second == n) st.sandbox_node.erase(it);
      rp.deliver(ErrorReply<v1::SandboxReply>(ready));
      return;
    }
  Forward<v1::SandboxReply>(self, n, "sandbox " + id, std::move(*shared_req), kCallTimeout,
                            [self, rp, n, id](v1::SandboxReply r) mutable {
                              auto& st = self->state;
                              state::WriteBatch b;
                              if (r.status().code() == v1::Status::OK) {
                                PutPlacement(self, &b, SandboxKey(id), n);
                                Decorate(self, n, &r);
                              } else if (r.status().code() != v1::Status::ALREADY_EXISTS) {
                                if (auto it = st.sandbox_node.find(id); it != st.sandbox_node.end() && it->second == n)
                                  st.sandbox_node.erase(it);
                              }
                              Persist(self, std::move(b));
                              rp.deliver(std::move(r));
                            });
  });
  return rp;
}

caf::result<v1::SessionReply> OpenSession(Self self, v1::OpenSessionRequest& req) {
  auto& st = self->state;
  const std::string name = req.name();
  if (st.session_node.count(name)) return ToSessionNode<v1::SessionReply>(self, name, req);
  if (Status ok = CheckSessionName(name); !ok.ok()) return ErrorReply<v1::SessionReply>(ok);
  auto node = Place(self, req.spec());
  if (!node.ok()) return ErrorReply<v1::SessionReply>(node.status());
  // A restartable one is opened as in a cluster: its steps come here.
  if (auto local = InProcess(self, *node); local && !req.restartable()) return self->delegate(local, std::move(req));
  st.session_node[name] = *node;
  auto rp = self->make_response_promise<v1::SessionReply>();
  std::string n = *node;
  std::optional<v1::OpenSessionRequest> restartable;
  if (req.restartable()) restartable = req;
  auto spec = req.spec();
  auto shared_req = std::make_shared<v1::OpenSessionRequest>(std::move(req));
  EnsureSessionImages(self, n, *shared_req, [self, rp, n, name, restartable, shared_req](Status ready) mutable {
    if (!ready.ok()) {
      auto& st = self->state;
      if (auto it = st.session_node.find(name); it != st.session_node.end() && it->second == n) st.session_node.erase(it);
      rp.deliver(ErrorReply<v1::SessionReply>(ready));
      return;
    }
  Forward<v1::SessionReply>(self, n, "session " + name, std::move(*shared_req), kCallTimeout,
                            [self, rp, n, name, restartable](v1::SessionReply r) mutable {
                              auto& st = self->state;
                              state::WriteBatch b;
                              if (r.status().code() == v1::Status::OK && restartable &&
                                  r.session().step_count() > 0 && !st.restartable.count(name)) {
                                // It was open already, not restartable (the
                                // directory had not heard of it): its log
                                // has no copy here to go on from.
                                ToProto(Status::FailedPrecondition(
                                            "session " + name + " is already open and was not opened restartable (" +
                                            std::to_string(r.session().step_count()) +
                                            " steps logged without a copy here); a session is made restartable "
                                            "when it is first opened: use a new name"),
                                        r.mutable_status());
                              }
                              if (r.status().code() == v1::Status::OK) {
                                if (restartable) {
                                  st.restartable[name].open = *restartable;
                                  b.Put(state::Table::kPlacements, RestartableKey(name),
                                        restartable->SerializeAsString());
                                }
                                PutPlacement(self, &b, SessionKey(name), n);
                                for (const auto& sb : r.session().sandboxes()) {
                                  if (sb.id().empty()) continue;
                                  st.sandbox_node[sb.id()] = n;
                                  PutPlacement(self, &b, SandboxKey(sb.id()), n);
                                }
                                Decorate(self, n, &r);
                              } else if (auto it = st.session_node.find(name);
                                         it != st.session_node.end() && it->second == n) {
                                st.session_node.erase(it);
                              }
                              Persist(self, std::move(b));
                              rp.deliver(std::move(r));
                            });
  });
  return rp;
}

// ---- restartable sessions ----

Result<v1::StepRecord> CopiedStep(Self self, const std::string& name, uint64_t index) {
  return state::TypedTable<v1::StepRecord>(self->state.ctx->store, state::Table::kSteps)
      .Get(state::StepKey(name, index));
}

void EndRestart(Self self, const std::string& name, const std::string& failed) {
  auto it = self->state.restartable.find(name);
  if (it == self->state.restartable.end()) return;
  auto& r = it->second;
  std::string on = r.restarting_on;
  r.restarting_on.clear();
  if (!failed.empty()) {
    r.failed = failed;
    self->state.ctx->log->error("session {}: {}", name, failed);
    return;
  }
  r.moves++;
  self->state.ctx->log->info("session {} goes on on node {}: its {} logged step(s) re-ran there", name, on, r.logged);
}

// Re-runs step `i` and the ones after it of session `name` on `node`.
void Replay(Self self, const std::string& name, const std::string& node, const std::string& from, uint64_t i) {
  auto it = self->state.restartable.find(name);
  if (it == self->state.restartable.end()) return;
  auto& r = it->second;
  if (i >= r.logged) return EndRestart(self, name, "");
  auto step = CopiedStep(self, name, i);
  if (!step.ok()) return EndRestart(self, name, "cannot read step " + std::to_string(i) + " of its log's copy: " +
                                                    step.status().message());
  if (step->not_replayable()) {
    v1::CloseSessionRequest close;
    close.set_name(name);
    close.set_reason("its restart stopped before step " + std::to_string(i) + ", which is not replayable");
    Forward<v1::SessionReply>(self, node, "session " + name, close, kCallTimeout, [](v1::SessionReply) {});
    return EndRestart(self, name,
                      "cannot go on: its node " + from + " went down and step " + std::to_string(i) +
                          " is marked not replayable (it has effects outside the sandbox), so it was not re-run on "
                          "another node; its log up to there is kept (dsec-replay, Steps()); open a new session");
  }
  v1::StepRequest again;
  again.set_session(name);
  again.set_index(i);
  *again.mutable_exec() = step->request();
  again.set_sandbox(step->sandbox());
  *again.mutable_meta() = step->meta();
  auto timeout = ExecTimeout(again.exec());
  Forward<v1::StepReply>(self, node, "session " + name, std::move(again), timeout,
                         [self, name, node, from, i](v1::StepReply rep) {
                           if (rep.status().code() != v1::Status::OK)
                             return EndRestart(self, name,
                                               "re-running step " + std::to_string(i) + " on node " + node +
                                                   " failed: " + rep.status().message());
                           Replay(self, name, node, from, i + 1);
                         });
}

// Session `name` was on node `from`, which went down: open it on another
// node and re-run its log there.
void Restart(Self self, const std::string& name, const std::string& from) {
  auto& st = self->state;
  auto& r = st.restartable[name];
  if (!r.failed.empty() || !r.restarting_on.empty()) return;
  r.left.insert(from);
  auto target = Place(self, r.open.spec());
  if (!target.ok())
    return EndRestart(self, name, "its node " + from + " went down and no other node can take it: " +
                                      target.status().message());
  r.restarting_on = *target;
  st.ctx->log->warn("session {} was on node {}, which went down: opening it on node {} and re-running its {} step(s)",
                    name, from, *target, r.logged);
  std::string node = *target;
  EnsureSessionImages(self, node, r.open, [self, name, node, from](Status ready) {
    if (!ready.ok()) return EndRestart(self, name, ready.message());
    auto it = self->state.restartable.find(name);
    if (it == self->state.restartable.end()) return;
  Forward<v1::SessionReply>(self, node, "session " + name, it->second.open, kCallTimeout,
                            [self, name, node, from](v1::SessionReply rep) {
                              auto& st = self->state;
                              if (rep.status().code() != v1::Status::OK)
                                return EndRestart(self, name, "opening it again on node " + node + " failed: " +
                                                                  rep.status().message());
                              state::WriteBatch b;
                              st.session_node[name] = node;
                              PutPlacement(self, &b, SessionKey(name), node);
                              for (const auto& sb : rep.session().sandboxes()) {
                                if (sb.id().empty()) continue;
                                st.sandbox_node[sb.id()] = node;
                                PutPlacement(self, &b, SandboxKey(sb.id()), node);
                              }
                              Persist(self, std::move(b));
                              Replay(self, name, node, from, 0);
                            });
  });
}

// A step of a restartable session: answered from the log's copy when it is
// there (a fast-forward), else run on its node and copied here (durably)
// before the trainer hears of it.
caf::result<v1::StepReply> RestartableStep(Self self, Restartable& r, v1::StepRequest& req) {
  const std::string name = req.session();
  if (!r.failed.empty())
    return ErrorReply<v1::StepReply>(Status::FailedPrecondition("session " + name + " " + r.failed));
  if (!r.restarting_on.empty())
    return ErrorReply<v1::StepReply>(
        Status::Unavailable("session " + name + " is being restarted on node " + r.restarting_on +
                            " (its node went down); send the step again in a moment"));
  if (req.index() < r.logged) {
    auto step = CopiedStep(self, name, req.index());
    if (!step.ok()) return ErrorReply<v1::StepReply>(step.status());
    const auto& a = step->request().argv();
    const auto& b = req.exec().argv();
    std::string role = req.sandbox().empty() ? "agent" : req.sandbox();
    if (a.size() != b.size() || !std::equal(a.begin(), a.end(), b.begin()) || step->sandbox() != role)
      return ErrorReply<v1::StepReply>(Status::FailedPrecondition(
          "session " + name + " step " + std::to_string(req.index()) +
          " is logged with another request; a replay must send the same steps"));
    v1::StepReply reply;
    *reply.mutable_step() = std::move(*step);
    reply.set_fast_forwarded(true);
    return reply;
  }
  auto it = self->state.session_node.find(name);
  if (it == self->state.session_node.end())
    return ErrorReply<v1::StepReply>(Status::NotFound("no session '" + name + "' in this cluster"));
  auto rp = self->make_response_promise<v1::StepReply>();
  auto timeout = ExecTimeout(req.exec());
  Forward<v1::StepReply>(
      self, it->second, "session " + name, std::move(req), timeout, [self, rp, name](v1::StepReply rep) mutable {
        auto re = self->state.restartable.find(name);
        if (rep.status().code() != v1::Status::OK || rep.fast_forwarded() || re == self->state.restartable.end() ||
            rep.step().index() < re->second.logged) {
          rp.deliver(std::move(rep));  // (deliver returns the promise: no `return rp.deliver`)
          return;
        }
        state::WriteBatch b;
        state::TypedTable<v1::StepRecord>(self->state.ctx->store, state::Table::kSteps)
            .Put(&b, state::StepKey(name, rep.step().index()), rep.step());
        re->second.logged = rep.step().index() + 1;
        auto handle = caf::actor_cast<controller_actor>(self);
        auto out = std::make_shared<v1::StepReply>(std::move(rep));
        self->state.ctx->committer->Submit(std::move(b), [handle, rp, out](const Status& w) mutable {
          Post(handle, [rp, out, w]() mutable {
            if (!w.ok())
              rp.deliver(ErrorReply<v1::StepReply>(
                  w.Annotate("the step ran but the controller could not keep its copy of the log")));
            else
              rp.deliver(std::move(*out));
          });
        });
      });
  return rp;
}

// ---- nodes ----

cluster::v1::JoinReply Join(Self self, cluster::v1::NodeJoin& j, caf::actor entry) {
  auto& st = self->state;
  const std::string id = j.node().id();
  cluster::v1::JoinReply reply;
  if (!ValidId(id) || !entry) {
    ToProto(Status::InvalidArgument("a join needs the node's id ([a-z0-9-], 1 to 64 bytes) and its entry actor"),
            reply.mutable_status());
    return reply;
  }
  auto& n = st.nodes[id];
  if (n.up() && n.entry != entry) {
    if (n.entry.node() == entry.node()) {
      MarkDown(self, n, "it joined again");
    } else {
      ToProto(Status::AlreadyExists("node id " + id + " is already joined from " + n.rec.node().sdk_address() +
                                    "; each node needs a data dir of its own (the node id lives there)"),
              reply.mutable_status());
      return reply;
    }
  }
  bool rejoin = n.rec.joined_ms() != 0;
  *n.rec.mutable_node() = j.node();
  *n.rec.mutable_load() = j.load();
  n.rec.mutable_load()->clear_ended_sandboxes();
  n.rec.mutable_load()->clear_ended_sessions();
  n.rec.set_state(n.rec.draining() ? "draining" : "up");
  if (!n.rec.joined_ms()) n.rec.set_joined_ms(WallClockMs());
  n.rec.set_last_seen_ms(WallClockMs());
  n.rec.clear_down_reason();
  n.rec.set_down_ms(0);
  n.entry = entry;
  n.pending = 0;
  n.last_beat_ms = WallClockMs();
  n.in_process = entry.node() == self->node();
  if (n.in_process) st.in_process = id;
  st.node_of[entry.address()] = id;
  self->monitor(entry);
  // Reconcile the directory with what the node says it holds: what it
  // holds is on it (never a second copy elsewhere); what the directory
  // put on it and it no longer holds ended while it was away.
  state::WriteBatch b;
  std::unordered_set<std::string> held_sb(j.sandboxes().begin(), j.sandboxes().end());
  std::unordered_set<std::string> held_se(j.sessions().begin(), j.sessions().end());
  size_t added = 0, gone = 0, conflicts = 0;
  for (const auto& sb : held_sb) {
    auto [it, fresh] = st.sandbox_node.emplace(sb, id);
    if (fresh) {
      ++added;
      PutPlacement(self, &b, SandboxKey(sb), id);
    } else if (it->second != id) {
      ++conflicts;
      st.ctx->log->warn("sandbox {} is held by node {} and by node {}; the directory keeps {}", sb, it->second, id,
                        it->second);
    }
  }
  // Restartable sessions their trainers closed while this node was down:
  // its copies are closed (the mark goes once one is; one it no longer
  // holds goes now).
  std::unordered_set<std::string> closed_here;
  if (auto away = st.closed_away.find(id); away != st.closed_away.end()) {
    for (const auto& name : away->second) {
      if (held_se.count(name)) {
        closed_here.insert(name);
        continue;
      }
      b.Delete(state::Table::kPlacements, ClosedAwayKey(id, name));
    }
    away->second = closed_here;
    if (away->second.empty()) st.closed_away.erase(away);
  }
  for (const auto& se : closed_here) {
    v1::CloseSessionRequest close;
    close.set_name(se);
    close.set_reason("it was closed by its trainer while this node was down");
    st.ctx->log->info("session {} was closed while node {} was down: closing its copy there", se, id);
    self->request(entry, kCallTimeout, std::move(close))
        .then(
            [self, id, se](v1::SessionReply& r) {
              if (r.status().code() != v1::Status::OK && r.status().code() != v1::Status::NOT_FOUND) return;
              auto& st = self->state;
              auto away = st.closed_away.find(id);
              if (away == st.closed_away.end() || !away->second.erase(se)) return;
              if (away->second.empty()) st.closed_away.erase(away);
              state::WriteBatch gone;
              gone.Delete(state::Table::kPlacements, ClosedAwayKey(id, se));
              Persist(self, std::move(gone));
            },
            [](caf::error&) {});  // kept: closed at its next rejoin
  }
  for (const auto& se : held_se) {
    if (closed_here.count(se)) continue;
    auto [it, fresh] = st.session_node.emplace(se, id);
    if (fresh) {
      ++added;
      PutPlacement(self, &b, SessionKey(se), id);
    } else if (it->second != id) {
      // Restarted elsewhere while this node was away: its copy here goes.
      ++conflicts;
      v1::CloseSessionRequest close;
      close.set_name(se);
      close.set_reason("it was restarted on node " + it->second + " while this node was down");
      st.ctx->log->info("session {} is on node {} now: closing the stale copy on node {}", se, it->second, id);
      self->request(entry, kCallTimeout, std::move(close)).then([](v1::SessionReply&) {}, [](caf::error&) {});
    }
  }
  for (auto it = st.sandbox_node.begin(); it != st.sandbox_node.end();) {
    if (it->second == id && !held_sb.count(it->first)) {
      b.Delete(state::Table::kPlacements, SandboxKey(it->first));
      it = st.sandbox_node.erase(it);
      ++gone;
    } else {
      ++it;
    }
  }
  for (auto it = st.session_node.begin(); it != st.session_node.end();) {
    if (it->second == id && !held_se.count(it->first)) {
      b.Delete(state::Table::kPlacements, SessionKey(it->first));
      it = st.session_node.erase(it);
      ++gone;
    } else {
      ++it;
    }
  }
  Persist(self, std::move(b));
  PersistNode(self, n);
  st.ctx->log->info("node {} {} {}: {} sandboxes, {} sessions, {} slots, kinds [{}]{}", id,
                    rejoin ? "rejoined" : "joined",
                    n.in_process ? std::string("in this process") : "from " + j.node().sdk_address(),
                    j.sandboxes_size(), j.sessions_size(),
                    j.load().slots(), [&] {
                      std::string k;
                      for (const auto& s : j.node().kinds()) k += (k.empty() ? "" : ",") + s;
                      return k;
                    }(),
                    added || gone || conflicts
                        ? fmt::format(" (directory: {} added, {} ended while away, {} held twice)", added, gone, conflicts)
                        : std::string());
  reply.set_controller_id(st.ctx->id);
  reply.set_sdk_token(st.ctx->sdk_token);
  reply.set_heartbeat_ms(static_cast<uint32_t>(st.ctx->heartbeat_ms));
  reply.set_draining(n.rec.draining());
  return reply;
}

void Beat(Self self, const std::string& id, cluster::v1::NodeLoad& load) {
  auto& st = self->state;
  auto it = st.nodes.find(id);
  auto sender = self->current_sender();
  if (it == st.nodes.end() || !it->second.up()) {
    // A node marked down whose connection lived through (a healed
    // partition) or one this controller does not know (it lost its data
    // dir): it joins again, with what it holds.
    if (sender) {
      st.ctx->log->info("node {} sent a heartbeat while {}: asking it to join again", id,
                        it == st.nodes.end() ? "unknown" : "down");
      caf::anon_send(caf::actor_cast<caf::actor>(sender), rejoin_atom::value);
    }
    return;
  }
  auto& n = it->second;
  if (!sender || sender->node() != n.entry.node()) return;  // not from that node
  n.last_beat_ms = WallClockMs();
  n.rec.set_last_seen_ms(n.last_beat_ms);
  n.pending = 0;
  state::WriteBatch b;
  // Made, then ended: in that order (both may be in one heartbeat).
  for (const auto& sb : load.started_sandboxes()) {
    if (st.sandbox_node.emplace(sb, id).second) PutPlacement(self, &b, SandboxKey(sb), id);
  }
  for (const auto& sb : load.ended_sandboxes()) {
    auto d = st.sandbox_node.find(sb);
    if (d != st.sandbox_node.end() && d->second == id) {
      st.sandbox_node.erase(d);
      b.Delete(state::Table::kPlacements, SandboxKey(sb));
    }
  }
  for (const auto& se : load.ended_sessions()) {
    auto d = st.session_node.find(se);
    if (d != st.session_node.end() && d->second == id) {
      st.session_node.erase(d);
      b.Delete(state::Table::kPlacements, SessionKey(se));
      // Closed there (its lease ran out, an operator killed it): nothing
      // to restart, and its log's copy here goes. (One whose restart
      // stopped keeps its entry: its trainer hears why until it closes it.)
      auto r = st.restartable.find(se);
      if (r != st.restartable.end() && r->second.restarting_on.empty() && r->second.failed.empty())
        ForgetRestartable(self, se, &b);
    }
  }
  Persist(self, std::move(b));
  load.clear_ended_sandboxes();
  load.clear_ended_sessions();
  load.clear_started_sandboxes();
  *n.rec.mutable_load() = std::move(load);
}

void Tick(Self self) {
  auto& st = self->state;
  int64_t now = WallClockMs();
  // (A node in this process cannot be cut off: its actor's end is seen by
  // the monitor, and a busy node's late heartbeat must not fail its calls.)
  for (auto& [id, n] : st.nodes)
    if (n.up() && !n.in_process && now - n.last_beat_ms > st.ctx->down_after_ms)
      MarkDown(self, n, "no heartbeat for " + std::to_string((now - n.last_beat_ms) / 1000.0).substr(0, 3) + " s");
  self->delayed_send(self, std::chrono::milliseconds(std::max(100, st.ctx->heartbeat_ms / 2)),
                     Continuation{[self] { Tick(self); }});
}

void Load(Self self) {
  auto& st = self->state;
  auto s = state::TypedTable<cluster::v1::ClusterNode>(st.ctx->store, state::Table::kNodes)
               .Scan("", [&](const std::string& key, cluster::v1::ClusterNode&& r) {
                 if (r.node().id().empty()) return true;  // not a cluster row
                 auto& n = st.nodes[key];
                 n.rec = std::move(r);
                 n.rec.set_state("down");
                 n.rec.set_down_ms(st.started_ms);
                 n.rec.set_down_reason("it has not rejoined since the controller started");
                 return true;
               });
  if (!s.ok()) st.ctx->log->error("controller: reading the nodes table: {}", s.message());
  s = st.ctx->store->ScanFrom(state::Table::kPlacements, "", "", [&](const std::string& k, const std::string& v) {
    if (k.size() > 2 && k[0] == 'b' && k[1] == '/') st.sandbox_node[k.substr(2)] = v;
    else if (k.size() > 2 && k[0] == 's' && k[1] == '/') st.session_node[k.substr(2)] = v;
    else if (k.size() > 2 && k[0] == 'c' && k[1] == '/') {
      size_t slash = k.find('/', 2);
      if (slash != std::string::npos) st.closed_away[k.substr(2, slash - 2)].insert(k.substr(slash + 1));
    }
    return true;
  });
  if (!s.ok()) st.ctx->log->error("controller: reading the placements table: {}", s.message());
  s = st.ctx->store->ScanFrom(state::Table::kPlacements, "r/", "r/", [&](const std::string& k, const std::string& v) {
    Restartable r;
    if (!r.open.ParseFromString(v)) return true;
    (void)st.ctx->store->ScanFrom(state::Table::kSteps, state::StepPrefix(k.substr(2)), state::StepPrefix(k.substr(2)),
                                  [&](const std::string&, const std::string&) {
                                    r.logged++;
                                    return true;
                                  });
    st.restartable[k.substr(2)] = std::move(r);
    return true;
  });
  st.ctx->log->info("controller {}: {} nodes known (down until they rejoin), {} sandboxes and {} sessions in the directory",
                    st.ctx->id, st.nodes.size(), st.sandbox_node.size(), st.session_node.size());
}

// Image calls to a controller without a registry of its own (role all):
// the in-process node's registry answers them.
template <class Reply, class Request>
caf::result<Reply> NoRegistry(Self self, Request& req) {
  if (auto local = InProcess(self)) return self->delegate(local, std::move(req));
  return ErrorReply<Reply>(Status::Unimplemented("no image registry here"));
}

// ---- the table's calls (wire/calls.hpp) -------------------------------------

// How long a call forwarded to a node may take: a run's own limit and a
// margin, or kCallTimeout.
template <class Req>
std::chrono::milliseconds Timeout(const Req&) { return kCallTimeout; }
std::chrono::milliseconds Timeout(const v1::ExecRequest& req) { return ExecTimeout(req); }
std::chrono::milliseconds Timeout(const v1::StepRequest& req) { return ExecTimeout(req.exec()); }

caf::result<v1::RunReply> Handle(Self self, v1::RunRequest& req) {
  auto node = Place(self, req.spec());
  if (!node.ok()) return ErrorReply<v1::RunReply>(node.status());
  if (auto local = InProcess(self, *node)) return self->delegate(local, std::move(req));
  auto rp = self->make_response_promise<v1::RunReply>();
  auto timeout = ExecTimeout(req.exec());
  Forward<v1::RunReply>(self, *node, "a run", std::move(req), timeout,
                        [rp](v1::RunReply r) mutable { rp.deliver(std::move(r)); });
  return rp;
}

caf::result<v1::SandboxReply> Handle(Self self, v1::CreateRequest& req) { return Create(self, req); }
caf::result<v1::SessionReply> Handle(Self self, v1::OpenSessionRequest& req) { return OpenSession(self, req); }

caf::result<v1::StepReply> Handle(Self self, v1::StepRequest& req) {
  auto re = self->state.restartable.find(req.session());
  if (re != self->state.restartable.end()) return RestartableStep(self, re->second, req);
  auto timeout = ExecTimeout(req.exec());
  return ToSessionNode<v1::StepReply>(self, req.session(), req, timeout);
}

caf::result<v1::SessionReply> Handle(Self self, v1::CloseSessionRequest& req) {
  auto re = self->state.restartable.find(req.name());
  if (re == self->state.restartable.end()) return ToSessionNode<v1::SessionReply>(self, req.name(), req);
  // A restartable session: closed on its node, and its copy here goes
  // (a session that could not go on is closed here even if its node
  // no longer has it).
  auto it = self->state.session_node.find(req.name());
  std::string name = req.name();
  auto forget = [self, name] {
    state::WriteBatch b;
    ForgetRestartable(self, name, &b);
    Persist(self, std::move(b));
  };
  // One that could not go on is closed here at once: its trainer does
  // not wait on a node (maybe just back, busy re-adopting) for a copy
  // that has nothing left to do; that copy is closed after the answer.
  bool failed = !re->second.failed.empty();
  if (failed || it == self->state.session_node.end()) {
    forget();
    if (it != self->state.session_node.end())
      Forward<v1::SessionReply>(self, it->second, "session " + name, std::move(req), kCallTimeout,
                                [](v1::SessionReply) {});
    return ErrorReply<v1::SessionReply>(Status::Ok());
  }
  // (The promise takes the request's answer over: made only here, where
  // it is the answer; a value returned after it would be dropped.)
  auto rp = self->make_response_promise<v1::SessionReply>();
  std::string node = it->second;
  Forward<v1::SessionReply>(self, node, "session " + name, std::move(req), kCallTimeout,
                            [self, rp, node, forget](v1::SessionReply r) mutable {
                              if (r.status().code() == v1::Status::OK) forget();
                              Decorate(self, node, &r);
                              rp.deliver(std::move(r));
                            });
  return rp;
}

void Handle(Self self, v1::AnnotateBatch& batch) {
  // The SDK sends a session's annotations to its node; any that come
  // here are forwarded one by one and answered the same way.
  if (auto local = InProcess(self)) {
    self->delegate(local, std::move(batch));
    return;
  }
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (!sender) return;
  for (auto& call : *batch.mutable_calls()) {
    uint64_t id = call.call_id();
    auto answer = [self, sender, id](v1::StepReply r) {
      v1::AnnotateResults out;
      auto* one = out.add_results();
      one->set_call_id(id);
      *one->mutable_reply() = std::move(r);
      caf::anon_send(sender, std::move(out));
    };
    auto it = self->state.session_node.find(call.request().session());
    if (it == self->state.session_node.end()) {
      answer(ErrorReply<v1::StepReply>(
          Status::NotFound("no session '" + call.request().session() + "' in this cluster")));
      continue;
    }
    Forward<v1::StepReply>(self, it->second, "session " + call.request().session(),
                           std::move(*call.mutable_request()), kCallTimeout, answer);
  }
}

// Owners are tracked by the nodes their sandboxes are on; in role all the
// trainer's connection is to this controller, so its Hello goes on.
void Handle(Self self, v1::Hello& hello) {
  if (auto local = InProcess(self)) self->delegate(local, hello);
}

caf::result<v1::StepsReply> Handle(Self self, v1::ListStepsRequest& req) {
  auto re = self->state.restartable.find(req.session());
  if (re == self->state.restartable.end()) return ToSessionNode<v1::StepsReply>(self, req.session(), req);
  // A restarted session's node holds the re-run; the log is the copy.
  auto it = self->state.session_node.find(req.session());
  if (it == self->state.session_node.end())
    return ErrorReply<v1::StepsReply>(Status::NotFound("no session '" + req.session() + "' in this cluster"));
  auto rp = self->make_response_promise<v1::StepsReply>();
  std::string name = req.session();
  Forward<v1::StepsReply>(self, it->second, "session " + name, std::move(req), kCallTimeout,
                          [self, rp, name](v1::StepsReply r) mutable {
                            for (auto& step : *r.mutable_steps())
                              if (auto copy = CopiedStep(self, name, step.index()); copy.ok())
                                step = std::move(*copy);
                            rp.deliver(std::move(r));
                          });
  return rp;
}

// Images: this controller's registry; nodes fetch from it (EnsureImage).
caf::result<v1::ImageReply> Handle(Self self, v1::RegisterImageRequest& req) {
  if (!self->state.images) return NoRegistry<v1::ImageReply>(self, req);
  auto rp = self->make_response_promise<v1::ImageReply>();
  self->request(self->state.images, caf::infinite, std::move(req))
      .then([self, rp](v1::ImageReply& r) mutable {
        if (r.status().code() == v1::Status::OK) self->state.image_by_name[r.image().name()] = r.image();
        rp.deliver(std::move(r));
      });
  return rp;
}

caf::result<v1::ImageReply> Handle(Self self, v1::RemoveImageRequest& req) {
  if (!self->state.images) return NoRegistry<v1::ImageReply>(self, req);
  auto rp = self->make_response_promise<v1::ImageReply>();
  std::string name = req.name();
  self->request(self->state.images, caf::infinite, std::move(req))
      .then([self, rp, name](v1::ImageReply& r) mutable {
        if (r.status().code() == v1::Status::OK) self->state.image_by_name.erase(name);
        rp.deliver(std::move(r));
      });
  return rp;
}

// Every node's sandboxes: the same page asked of each node that is up,
// merged (a node that is down is not asked: its sandboxes come back with it).
caf::result<v1::ListSandboxesReply> Handle(Self self, v1::ListSandboxesRequest& req) {
  if (Status s = CheckListRequest(req); !s.ok()) return ErrorReply<v1::ListSandboxesReply>(s);
  if (auto local = InProcess(self); local && self->state.nodes.size() == 1) return self->delegate(local, std::move(req));
  std::vector<std::string> up;
  for (const auto& [id, n] : self->state.nodes)
    if (n.up() && (req.node().empty() || req.node() == id)) up.push_back(id);
  if (up.empty() && !req.node().empty() && !self->state.nodes.count(req.node()))
    return ErrorReply<v1::ListSandboxesReply>(
        Status::NotFound("no node '" + req.node() + "' in this cluster (dsecctl nodes lists them)"));
  if (up.empty()) return v1::ListSandboxesReply();
  struct Gather {
    caf::typed_response_promise<v1::ListSandboxesReply> rp;
    v1::ListSandboxesRequest req;
    std::vector<v1::ListSandboxesReply> pages;
    size_t waiting = 0;
  };
  auto g = std::make_shared<Gather>();
  g->rp = self->make_response_promise<v1::ListSandboxesReply>();
  g->req = req;
  g->waiting = up.size();
  for (const auto& node : up) {
    Forward<v1::ListSandboxesReply>(self, node, "a list of node " + node + "'s sandboxes", req, kCallTimeout,
                                    [self, g, node](v1::ListSandboxesReply page) {
                                      if (auto* a = SdkAddress(self, node))
                                        for (auto& r : *page.mutable_sandboxes()) r.set_node_address(*a);
                                      g->pages.push_back(std::move(page));
                                      if (--g->waiting == 0) g->rp.deliver(MergeListPages(g->req, std::move(g->pages)));
                                    });
  }
  return g->rp;
}

// The rest, by route: to the node that holds the sandbox or the session;
// images to this controller's registry (or, in role all, the node's).
template <class Req>
caf::result<calls::ReplyOf<Req>> Handle(Self self, Req& req) {
  using C = typename calls::CallOf<Req>::type;
  using Reply = typename C::Reply;
  if constexpr (C::route == calls::Route::kSandbox) {
    return ToSandboxNode<Reply>(self, C::Key(req), req, Timeout(req));
  } else if constexpr (C::route == calls::Route::kSession) {
    return ToSessionNode<Reply>(self, C::Key(req), req, Timeout(req));
  } else if constexpr (C::route == calls::Route::kImages) {
    if (!self->state.images) return NoRegistry<Reply>(self, req);
    return self->delegate(self->state.images, std::move(req));
  } else {
    static_assert(sizeof(Req) == 0, "the controller has no handler for this call (wire/calls.hpp)");
  }
}

controller_actor::behavior_type ControllerActor(Self self, std::shared_ptr<ControllerContext> ctx) {
  self->state.ctx = std::move(ctx);
  Load(self);
  if (self->state.ctx->image_ctx) {
    self->state.images = SpawnImageWorker(self, self->state.ctx->image_ctx);
    self->link_to(self->state.images);
    (void)state::TypedTable<v1::ImageManifest>(self->state.ctx->store, state::Table::kImages)
        .Scan("", [&](const std::string& name, v1::ImageManifest&& m) {
          self->state.image_by_name[name] = std::move(m);
          return true;
        });
  }
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.node_of.find(dm.source);
    if (it == st.node_of.end()) return;
    auto n = st.nodes.find(it->second);
    if (n != st.nodes.end()) MarkDown(self, n->second, "connection lost (" + caf::to_string(dm.reason) + ")");
  });
  self->send(self, Continuation{[self] { Tick(self); }});
  // The table's calls (wire/calls.hpp), each to its Handle above.
  auto table = calls::Handlers(calls::All{}, [self](auto& req) { return Handle(self, req); });
  return calls::MakeBehavior<controller_actor::behavior_type>(
      std::move(table),
      [self](admin_atom, const std::string& cmd, const std::vector<std::string>& args) -> caf::result<std::string> {
        return Admin(self, cmd, args);
      },
      [](Continuation& c) { c.fn(); },
      [self](join_atom, cluster::v1::NodeJoin& j, caf::actor& entry) { return Join(self, j, std::move(entry)); },
      [self](beat_atom, const std::string& id, cluster::v1::NodeLoad& load) { Beat(self, id, load); });
}

}  // namespace

controller_actor SpawnController(caf::actor_system& sys, std::shared_ptr<ControllerContext> ctx) {
  return sys.spawn(ControllerActor, std::move(ctx));
}

}  // namespace dsec
