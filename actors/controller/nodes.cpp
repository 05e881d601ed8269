// The controller's nodes: their joins (the directory reconciled with what
// each holds), heartbeats, the deadline that marks one down, and the
// nodes and directory it loads from its store at start.
#include <spdlog/fmt/fmt.h>
#include <spdlog/logger.h>

#include <unordered_set>

#include "actors/controller/forward.hpp"
#include "dsec/status_proto.hpp"
#include "state/group_commit.hpp"
#include "state/table.hpp"

namespace dsec::controller_detail {

namespace {

std::string Clock_(int64_t ms) {
  time_t t = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

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

Status NodeGone(Self self, const std::string& id, const std::string& what) {
  auto it = self->state.nodes.find(id);
  if (it == self->state.nodes.end())
    return Status::Unavailable(what + " is lost: it was on node " + id + ", which this controller no longer knows");
  const auto& r = it->second.rec;
  return Status::Unavailable(what + " is lost: its node " + id + " is down since " + Clock_(r.down_ms()) + " (" +
                             r.down_reason() + "); it comes back if the node rejoins with it");
}

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
      PutPlacement(&b, SandboxKey(sb), id);
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
      PutPlacement(&b, SessionKey(se), id);
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
    if (st.sandbox_node.emplace(sb, id).second) PutPlacement(&b, SandboxKey(sb), id);
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
  // What it can run now (a kind may have become available since the join).
  if (load.kinds_size() || load.unavailable_size()) {
    *n.rec.mutable_node()->mutable_kinds() = std::move(*load.mutable_kinds());
    *n.rec.mutable_node()->mutable_unavailable() = std::move(*load.mutable_unavailable());
  }
  load.clear_kinds();
  load.clear_unavailable();
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
    Status counted = st.ctx->store->ScanFrom(state::Table::kSteps, state::StepPrefix(k.substr(2)),
                                             state::StepPrefix(k.substr(2)), [&](const std::string&, const std::string&) {
                                               r.logged++;
                                               return true;
                                             });
    // Its copy's length unknown: it cannot be re-run, nor fast-forwarded from.
    if (!counted.ok()) r.failed = "cannot go on: its log's copy could not be read (" + counted.message() + ")";
    st.restartable[k.substr(2)] = std::move(r);
    return true;
  });
  st.ctx->log->info("controller {}: {} nodes known (down until they rejoin), {} sandboxes and {} sessions in the directory",
                    st.ctx->id, st.nodes.size(), st.sandbox_node.size(), st.session_node.size());
}

}  // namespace dsec::controller_detail
