// The node's answers to the admin console: each command yields one JSON
// object; errors are {"ok":false,"error":"..."}.

#include <nlohmann/json.hpp>

#include "actors/node/lifetime.hpp"
#include "actors/node/node_state.hpp"
#include "drivers/images/lazy_images.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/front_door.hpp"
#include "runtime/metrics.hpp"
#include "runtime/proto_json.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

using nlohmann::json;

// Replaces invalid UTF-8 (ids come from the console as typed) instead of throwing.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string Error(const std::string& msg) { return Dump(json{{"ok", false}, {"error", msg}}); }


// A sandbox as listed: its stored row, with when and why it ends (the
// node knows since when its owner is gone; an exec running now is not
// known here, so an idle end may be shown that the exec postpones).
json SandboxSummary(const std::unordered_map<std::string, int64_t>& gone_since, v1::SandboxRecord r) {
  ShowEnd(&r, gone_since);
  json j{{"id", r.id()},
         {"kind", KindName(r.spec().kind())},
         {"image", r.spec().image().empty() ? "host" : r.spec().image()},
         {"phase", PhaseName(r.phase())},
         {"created_ms", r.created_ms()},
         {"restarts", r.restarts()},
         {"owner", r.owner().empty() ? json(nullptr) : json(r.owner())},
         {"session", r.session().empty() ? json(nullptr) : json(r.session())}};
  if (r.expires_ms()) {
    j["expires_in_s"] = std::max<int64_t>(0, (r.expires_ms() - WallClockMs() + 999) / 1000);
    j["expires_because"] = r.expires_because();
    j["expiry_action"] = r.expiry_action();
  } else {
    j["expires_in_s"] = nullptr;
  }
  return j;
}

json SessionSummary(const v1::SessionRecord& r) {
  const char* phase = r.phase() == v1::SESSION_PHASE_OPEN     ? "open"
                      : r.phase() == v1::SESSION_PHASE_CLOSED ? "closed"
                      : r.phase() == v1::SESSION_PHASE_FAILED ? "failed"
                                                              : "opening";
  json sandboxes = json::object();
  for (const auto& sb : r.sandboxes()) sandboxes[sb.role()] = sb.id();
  json j{{"name", r.name()},         {"phase", phase},
         {"kind", KindName(r.spec().kind())},
         {"image", r.spec().image().empty() ? "host" : r.spec().image()},
         {"steps", r.step_count()},       {"restarts", r.restarts()},
         {"flags", r.flags()},
         {"sandboxes", sandboxes},        {"lease_s", r.lease_s()},
         {"created_ms", r.created_ms()},  {"updated_ms", r.updated_ms()}};
  if (!r.close_reason().empty()) j["close_reason"] = r.close_reason();
  if (!r.error().empty()) j["error"] = r.error();
  return j;
}

// Runs `scan` (a full-table scan: its time grows with the table) on a
// thread of its own and answers with its result from the node, so the
// node's thread never waits on the store for the console.
caf::result<std::string> OffThread(NodeSelf self, std::function<std::string()> scan) {
  auto rp = self->make_response_promise<std::string>();
  auto handle = caf::actor_cast<node_actor>(self);
  self->spawn<caf::detached>([handle, rp, scan = std::move(scan)]() mutable {
    std::string out = scan();
    Post(handle, [rp, out = std::move(out)]() mutable { rp.deliver(std::move(out)); });
  });
  return rp;
}

// Misbehaviour flags logged with this node's session steps since dsecd started.
uint64_t FlagsRaised() {
  uint64_t n = 0;
  metrics::Flags().ForEach([&](const std::string&, const metrics::Counter& c) { n += c.value.load(); });
  return n;
}

// `sessions`: every session (open ones with a live actor marked), newest
// first would need an index; store order (by name) it is.
std::string Sessions(state::Store* store) {
  json sessions = json::array();
  size_t open = 0;
  Status s = state::TypedTable<v1::SessionRecord>(store, state::Table::kSessions)
                 .Scan("", [&](const std::string&, v1::SessionRecord&& r) {
                   if (r.phase() == v1::SESSION_PHASE_OPEN) ++open;
                   sessions.push_back(SessionSummary(r));
                   return sessions.size() < 10000;
                 });
  if (!s.ok()) return Error("sessions: " + s.message());
  return Dump(json{{"ok", true}, {"open", open}, {"listed", sessions.size()}, {"sessions", sessions}});
}

// Each available kind's optional capabilities (drivers::Capability).
json Capabilities(const NodeContext& ctx, const std::vector<std::string>& kinds) {
  json caps = json::object();
  for (const auto& name : kinds) {
    v1::SandboxSpec spec;
    v1::Kind k;
    if (!ParseKind(name, &k)) continue;
    spec.set_kind(k);
    auto d = ctx.kinds->DriverFor(spec);
    if (!d.ok()) continue;
    json list = json::array();
    for (auto c : {drivers::Capability::kFiles, drivers::Capability::kPause, drivers::Capability::kPauseMemory,
                   drivers::Capability::kStreaming,
                   drivers::Capability::kSnapshot, drivers::Capability::kFork,
                   drivers::Capability::kNetwork, drivers::Capability::kGuard})
      if (drivers::Has((*d)->traits(), c)) list.push_back(drivers::CapabilityName(c));
    caps[name] = list;
  }
  return caps;
}

std::string Status_(NodeSelf self) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  std::vector<std::string> kinds, unavailable;
  ctx.kinds->Kinds(&kinds, &unavailable);
  return json{{"ok", true},
              {"node", ctx.options.node_id},
              {"boot", ctx.options.boot},
              {"role", "all"},
              {"version", DSEC_VERSION},
              {"uptime_s", (WallClockMs() - st.host->started_ms()) / 1000},
              {"sdk", ctx.options.sdk_address},
              {"admin", ctx.options.admin_address},
              {"http", ctx.options.http_address.empty() ? json(nullptr) : json(ctx.options.http_address)},
              {"data", ctx.store->Describe()},
              {"sandboxes", st.dir.sandboxes().size()},
              {"sessions", st.dir.sessions().size()},
              {"runs_in_flight", st.host->runs().size()},
              {"readopting", st.host->readopting()},
              {"waiting_for_readopt", st.ctx->waiting_for_readopt->load()},
              {"kinds", kinds},
              {"capabilities", Capabilities(ctx, kinds)},
              {"network", ctx.options.network},
              {"unavailable", unavailable}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

// `ls` filters: --kind K, --state S (a sandbox phase: running, paused, ...).
struct LsFilter {
  std::string kind, state;
  bool Keeps(const v1::SandboxRecord& r) const {
    return (kind.empty() || kind == KindName(r.spec().kind())) && (state.empty() || state == PhaseName(r.phase()));
  }
};

std::string ScanLs(state::Store* store, const std::unordered_map<std::string, int64_t>& gone, const json& runs,
                   const LsFilter& filter) {
  json sandboxes = json::array(), sessions = json::array();
  Status s = state::TypedTable<store::v1::SandboxRow>(store, state::Table::kSandboxes)
                 .Scan("", [&](const std::string&, store::v1::SandboxRow&& row) {
                   auto& r = *row.mutable_record();
                   if (filter.Keeps(r)) sandboxes.push_back(SandboxSummary(gone, std::move(r)));
                   return sandboxes.size() < 10000;
                 });
  if (s.ok())
    s = state::TypedTable<v1::SessionRecord>(store, state::Table::kSessions)
            .Scan("", [&](const std::string&, v1::SessionRecord&& r) {
              sessions.push_back(SessionSummary(r));
              return sessions.size() < 10000;
            });
  // A listing cut short by a store error is no listing: say so.
  if (!s.ok()) return Error("ls: " + s.message());
  return Dump(json{{"ok", true}, {"sandboxes", sandboxes}, {"sessions", sessions}, {"runs", runs}});
}

// `ls`: the rows of sandboxes and sessions (a scan, off the node's thread)
// and the one-shot runs in flight (the node's own, read here).
caf::result<std::string> Ls(NodeSelf self, const std::vector<std::string>& args) {
  auto& st = self->state;
  LsFilter filter;
  for (size_t i = 0; i < args.size(); ++i) {
    bool has_value = i + 1 < args.size();
    if (args[i] == "--kind" && has_value) filter.kind = args[++i];
    else if (args[i] == "--state" && has_value) filter.state = args[++i];
    else if (args[i] == "--node" && has_value) {
      if (args[++i] != st.ctx->options.node_id)
        return Error("this is node " + st.ctx->options.node_id + ", not " + args[i]);
    } else
      return Error("usage: ls [--node N] [--kind K] [--state S] ('" + args[i] + "' is not one of them)");
  }
  json runs = json::array();
  int64_t now = WallClockMs();
  for (const auto& [id, info] : st.host->runs())
    runs.push_back(json{{"id", id}, {"argv0", info.argv0}, {"age_ms", now - info.started_ms}});
  return OffThread(self, [store = st.ctx->store, gone = st.dir.gone_since(), runs = std::move(runs), filter] {
    return ScanLs(store, gone, runs, filter);
  });
}

json DriverStats(const drivers::Driver* d) { return d ? json::parse(d->StatsJson(), nullptr, false) : json(nullptr); }

// The front door's counters for one of its listeners ("sdk", "console",
// "http"); null when there is none by that name (--http off).
json DoorStats(const FrontDoor* door, const char* name) {
  if (!door || !door->has(name)) return nullptr;
  auto s = door->stats(name);
  return json{{"accepted", s.accepted}, {"admitted", s.admitted}, {"rejected", s.rejected},
              {"timed_out", s.timed_out}, {"evicted", s.evicted},   {"pending", s.pending}};
}

// A node's lazy images (docs/images.md): its console's stats and its
// status page's "Images on demand".
json LazyJson(const images::LazyStats& l) {
  return {{"images", l.images},
          {"fetch_requests", l.fetch_requests},
          {"chunks_fetched", l.chunks_fetched},
          {"bytes_fetched", l.bytes_fetched},
          {"chunks_fetched_again", l.chunks_fetched_again},
          {"cache_hits", l.cache_hits},
          {"cache_misses", l.cache_misses},
          {"digest_failures", l.digest_failures},
          {"evictions", l.evictions},
          {"cached_chunks", l.cached_chunks},
          {"cached_bytes", l.cached_bytes},
          {"prefetched_chunks", l.prefetched_chunks},
          {"fetch_failures", l.fetch_failures},
          {"lazyfs_restarts", l.lazyfs_restarts},
          {"lazyfs_pid", l.lazyfs_pid}};
}

std::string Stats(NodeSelf self) {
  auto& st = self->state;
  const auto& c = st.host->counters();
  auto cs = st.ctx->committer->stats();
  json out{{"ok", true},
              {"runs", c.runs},
              {"runs_ok", c.runs_ok},
              {"runs_platform_error", c.runs_platform_error},
              {"runs_in_flight", st.host->runs().size()},
              {"rejected", c.rejected},
              {"supervisor_restarts", st.supervisor->restarts()},
              {"supervisor_gave_up", st.supervisor->gave_up()},
              {"store_writes", cs.writes},
              {"store_batches", cs.batches},
              {"store_ops", cs.ops},
              {"sdk_door", DoorStats(st.ctx->door, "sdk")},
              {"console_door", DoorStats(st.ctx->door, "console")},
              {"http_door", DoorStats(st.ctx->door, "http")}};
  for (const auto& [name, driver] : st.ctx->kinds->ByName()) out[name] = DriverStats(driver);
  if (st.ctx->lazy) out["lazy_images"] = LazyJson(st.ctx->lazy->stats());
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

// `metrics` (for /metrics): this node's figures in Prometheus' text format,
// then the process-wide ones (runtime/metrics.hpp).
std::string Metrics(NodeSelf self) {
  auto& st = self->state;
  const auto& c = st.host->counters();
  std::string out;
  metrics::Describe(&out, "dsec_node_info", "gauge", "This dsecd: its node id, role and version (always 1).");
  metrics::Line(&out, "dsec_node_info",
                metrics::Labels({{"node", st.ctx->options.node_id}, {"role", "all"}, {"version", DSEC_VERSION}}), 1);
  metrics::Describe(&out, "dsec_uptime_seconds", "gauge", "Seconds since this dsecd started.");
  metrics::Line(&out, "dsec_uptime_seconds", "", static_cast<double>(WallClockMs() - st.host->started_ms()) / 1000);
  metrics::Describe(&out, "dsec_sessions_open", "gauge", "Open rollout sessions on this node.");
  metrics::Line(&out, "dsec_sessions_open", "", static_cast<double>(st.dir.sessions().size()));
  metrics::Describe(&out, "dsec_runs_in_flight", "gauge", "One-shot runs (fncall) in flight.");
  metrics::Line(&out, "dsec_runs_in_flight", "", static_cast<double>(st.host->runs().size()));
  metrics::Describe(&out, "dsec_runs_total", "counter", "One-shot runs by how they ended: ok or platform error.");
  metrics::Line(&out, "dsec_runs_total", "result=\"ok\"", static_cast<double>(c.runs_ok));
  metrics::Line(&out, "dsec_runs_total", "result=\"platform_error\"", static_cast<double>(c.runs_platform_error));
  metrics::Describe(&out, "dsec_requests_rejected_total", "counter", "Requests refused at admission.");
  metrics::Line(&out, "dsec_requests_rejected_total", "", static_cast<double>(c.rejected));
  metrics::Describe(&out, "dsec_supervisor_restarts_total", "counter", "Sandbox and session actors restarted.");
  metrics::Line(&out, "dsec_supervisor_restarts_total", "", static_cast<double>(st.supervisor->restarts()));
  if (const FrontDoor* door = st.ctx->door) {
    metrics::Describe(&out, "dsec_door_connections_total", "counter",
                      "Connections to dsecd's ports by how their handshake ended.");
    for (const char* port : {"sdk", "console", "http"}) {
      if (!door->has(port)) continue;
      auto s = door->stats(port);
      const std::pair<const char*, uint64_t> results[] = {
          {"admitted", s.admitted}, {"rejected", s.rejected}, {"timed_out", s.timed_out}, {"evicted", s.evicted}};
      for (const auto& [result, n] : results)
        metrics::Line(&out, "dsec_door_connections_total", metrics::Labels({{"port", port}, {"result", result}}),
                      static_cast<double>(n));
    }
  }
  return out + metrics::Render();
}

// `overview` (for the status page): the nodes (here: this one), their
// load, and the sandboxes on them (the first 500 rows; a scan, off the
// node's thread).
caf::result<std::string> Overview(NodeSelf self) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  std::vector<std::string> kinds, unavailable;
  ctx.kinds->Kinds(&kinds, &unavailable);
  auto h = metrics::ReadHostFigures();
  json node{{"node", ctx.options.node_id},
            {"role", "all"},
            {"boot", ctx.options.boot},
            {"version", DSEC_VERSION},
            {"uptime_s", (WallClockMs() - st.host->started_ms()) / 1000},
            {"sdk", ctx.options.sdk_address},
            {"admin", ctx.options.admin_address},
            {"http", ctx.options.http_address},
            {"kinds", kinds},
            {"unavailable", unavailable},
            {"sandboxes", st.dir.sandboxes().size()},
            {"sessions", st.dir.sessions().size()},
            {"flags", FlagsRaised()},
            {"runs_in_flight", st.host->runs().size()},
            {"memory", json{{"total", h.memory_total}, {"available", h.memory_available}}},
            {"cpus", h.cpus},
            {"load1", h.load1}};
  if (ctx.lazy) node["lazy_images"] = LazyJson(ctx.lazy->stats());  // the status page's "Images on demand"
  size_t sessions = st.dir.sessions().size();
  return OffThread(self, [store = ctx.store, node = std::move(node), sessions]() mutable {
    json list = json::array();
    Status scanned = state::TypedTable<store::v1::SandboxRow>(store, state::Table::kSandboxes)
        .Scan("", [&](const std::string&, store::v1::SandboxRow&& row) {
          auto& r = *row.mutable_record();
          json j{{"id", r.id()},
                 {"kind", KindName(r.spec().kind())},
                 {"image", r.spec().image().empty() ? "host" : r.spec().image()},
                 {"phase", PhaseName(r.phase())},
                 {"created_ms", r.created_ms()},
                 {"session", r.session()}};
          list.push_back(std::move(j));
          return list.size() < 500;
        });
    node["sandbox_list"] = std::move(list);
    if (!scanned.ok()) node["sandbox_list_error"] = scanned.message();  // the page says why the list is short
    return Dump(json{{"ok", true}, {"role", "all"}, {"now_ms", WallClockMs()}, {"sessions", sessions},
                     {"nodes", json::array({std::move(node)})}, {"e2b_calls", E2bCallsJson()}});
  });
}

// inspect / kill of a sandbox or session: asks its actor and turns the reply
// into one JSON line: {"ok":true,"<what>":{record},"killed":id}.
template <class Reply, class Child, class KillRequest, class GetRequest, class ToJson>
caf::result<std::string> AskChild(NodeSelf self, const Child& child, bool kill, const KillRequest& kill_req,
                                  const GetRequest& get_req, const std::string& what, const std::string& id,
                                  ToJson to_json) {
  auto rp = self->make_response_promise<std::string>();
  auto on_reply = [rp, kill, what, id, to_json](const Reply& r) mutable {
    if (r.status().code() != v1::Status::OK) {
      rp.deliver(Error(r.status().message()));
      return;
    }
    json j{{"ok", true}, {what, to_json(r)}};
    if (kill) j["killed"] = id;
    rp.deliver(Dump(j));
  };
  auto on_error = [rp, what, id](caf::error& e) mutable { rp.deliver(Error(what + " " + id + ": " + caf::to_string(e))); };
  if (kill) self->request(child, std::chrono::seconds(30), kill_req).then(on_reply, on_error);
  else self->request(child, std::chrono::seconds(5), get_req).then(on_reply, on_error);
  return rp;
}

}  // namespace

cluster::v1::NodeJoin ClusterInfo(NodeSelf self) {
  auto& st = self->state;
  cluster::v1::NodeJoin j;
  for (const auto& [id, a] : st.dir.sandboxes()) j.add_sandboxes(id);
  for (const auto& [name, a] : st.dir.sessions()) j.add_sessions(name);
  // What ended before the join is no longer in the lists above.
  st.ended_sandboxes.clear();
  st.ended_sessions.clear();
  st.started_sandboxes.clear();
  *j.mutable_load() = ClusterLoad(self);
  return j;
}

cluster::v1::NodeLoad ClusterLoad(NodeSelf self) {
  auto& st = self->state;
  cluster::v1::NodeLoad l;
  l.set_sandboxes(st.dir.sandboxes().size());
  l.set_sessions(st.dir.sessions().size());
  for (auto& id : st.ended_sandboxes) l.add_ended_sandboxes(std::move(id));
  for (auto& name : st.ended_sessions) l.add_ended_sessions(std::move(name));
  for (auto& id : st.started_sandboxes) l.add_started_sandboxes(std::move(id));
  st.ended_sandboxes.clear();
  st.ended_sessions.clear();
  st.started_sandboxes.clear();
  return l;
}

caf::result<std::string> HandleAdmin(NodeSelf self, const std::string& cmd,
                                     const std::vector<std::string>& args) {
  auto& st = self->state;
  auto need_id = [&]() -> std::string {
    return args.size() == 1 ? std::string() : "usage: " + cmd + " ID (a sandbox, session or run id)";
  };
  if (cmd == "status") return Status_(self);
  if (cmd == "nodes") {
    return OffThread(self, [store = st.ctx->store] {
      json nodes = json::array();
      Status s = state::TypedTable<cluster::v1::NodeRecord>(store, state::Table::kNodes)
                     .Scan("", [&](const std::string&, cluster::v1::NodeRecord&& r) {
                       nodes.push_back(ProtoJson(r));
                       return true;
                     });
      if (!s.ok()) return Error("nodes: " + s.message());
      return Dump(json{{"ok", true}, {"nodes", nodes}});
    });
  }
  if (cmd == "ls") return Ls(self, args);
  if (cmd == "drain" || cmd == "undrain") return Error(cmd + " is a controller's command (dsecctl --admin CONTROLLER)");
  if (cmd == "sessions") return OffThread(self, [store = st.ctx->store] { return Sessions(store); });
  if (cmd == "stats") return Stats(self);
  if (cmd == "metrics") return Metrics(self);
  if (cmd == "overview") return Overview(self);
  if (cmd == "e2b-key") {
    if (!st.ctx->e2b_keys) return Error("this dsecd serves no E2B door (--e2b off)");
    return OffThread(self, [keys = st.ctx->e2b_keys, args] { return keys(args); });
  }
  if (cmd == "inspect" || cmd == "kill") {
    if (auto u = need_id(); !u.empty()) return Error(u);
    const std::string& id = args[0];
    bool kill = cmd == "kill";
    if (auto r = st.host->runs().find(id); r != st.host->runs().end()) {
      if (!kill)
        return json{{"ok", true}, {"run", {{"id", id}, {"argv0", r->second.argv0},
                                           {"age_ms", WallClockMs() - r->second.started_ms}}}}
            .dump(-1, ' ', false, json::error_handler_t::replace);
      // One-shot runs (HandleRun); execs in sandboxes go through their actors.
      Status s = st.host->KillRun(id, "killed by an operator (admin console)");
      if (!s.ok()) return Error(s.message());
      return Dump(json{{"ok", true}, {"killed", id}});
    }
    if (auto sb = st.dir.FindSandbox(id); sb && !kill) {
      // Its own account: the record and its driver's state, decoded.
      auto rp = self->make_response_promise<std::string>();
      self->request(sb, std::chrono::seconds(5), describe_atom::value)
          .then([rp](const std::string& j) mutable { rp.deliver("{\"ok\":true,\"sandbox\":" + j + "}"); },
                [rp, id](caf::error& e) mutable { rp.deliver(Error("sandbox " + id + ": " + caf::to_string(e))); });
      return rp;
    }
    if (auto sb = st.dir.FindSandbox(id)) {
      v1::DestroyRequest destroy;
      destroy.set_sandbox_id(id);
      destroy.set_reason("destroyed by an operator (admin console kill)");
      v1::GetSandboxRequest get;
      get.set_sandbox_id(id);
      return AskChild<v1::SandboxReply>(self, sb, kill, destroy, get, "sandbox", id,
                      [](const v1::SandboxReply& r) { return ProtoJson(r.sandbox()); });
    }
    if (auto se = st.dir.FindSession(id)) {
      v1::CloseSessionRequest close;
      close.set_name(id);
      close.set_reason("killed by an operator (admin console)");
      v1::GetSessionRequest get;
      get.set_name(id);
      return AskChild<v1::SessionReply>(self, se, kill, close, get, "session", id,
                      [](const v1::SessionReply& r) { return ProtoJson(r.session()); });
    }
    // A closed session has no actor; its record is in the store.
    auto closed = state::TypedTable<v1::SessionRecord>(st.ctx->store, state::Table::kSessions).Get(id);
    if (closed.ok()) {
      if (kill) return Dump(json{{"ok", true}, {"session", ProtoJson(*closed)}, {"note", "already closed"}});
      return Dump(json{{"ok", true}, {"session", ProtoJson(*closed)}});
    }
    return Error("no sandbox, session or run '" + id + "' on this node (ls lists them)");
  }
  if (cmd == "fault" && st.ctx->options.test_hooks) {
    // Test hook: make a kind's driver fail or hold its calls (drivers/fault_driver.hpp).
    if (args.empty()) return Error(drivers::FaultDriver::Usage());
    auto faults = st.ctx->kinds->Faults(args[0]);
    auto done = faults.ok() ? (*faults)->Command({args.begin() + 1, args.end()}) : Result<std::string>(faults.status());
    if (!done.ok()) return Error(done.status().message());
    return Dump(json{{"ok", true}, {"fault", *done}});
  }
  if (cmd == "crash" && st.ctx->options.test_hooks) {
    // Test hook: make a sandbox or session actor throw (supervision tests).
    if (auto u = need_id(); !u.empty()) return Error(u);
    if (auto sb = st.dir.FindSandbox(args[0])) {
      self->send(sb, crash_atom::value);
      return Dump(json{{"ok", true}, {"crashed", args[0]}});
    }
    if (auto se = st.dir.FindSession(args[0])) {
      self->send(se, crash_atom::value);
      return Dump(json{{"ok", true}, {"crashed", args[0]}});
    }
    return Error("no sandbox or session '" + args[0] + "'");
  }
  if (cmd == "crash" || cmd == "fault")
    return Error(cmd + " is a test hook: this node runs without --test-hooks (tests only)");
  return Error("unknown command '" + cmd + "' (help lists the commands)");
}

}  // namespace dsec
