// The controller's answers to the admin console and the HTTP server: its
// own status and metrics, and the cluster's listings gathered from every
// node (each row tagged with its node).
#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include "actors/node/context.hpp"
#include "actors/controller/state.hpp"
#include "drivers/images/chunks.hpp"
#include "runtime/metrics.hpp"
#include "runtime/proto_json.hpp"
#include "state/group_commit.hpp"

namespace dsec::controller_detail {

namespace {

using json = nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string Error(const std::string& msg) { return Dump(json{{"ok", false}, {"error", msg}}); }


json NodeJson(const NodeEntry& n, const ControllerState& st) {
  json j = ProtoJson(n.rec);
  j["id"] = n.rec.node().id();
  if (n.in_process) {
    // Role all: the node in this process is reached at the controller's
    // own ports (it joined before they opened).
    const auto& c = *st.ctx;
    j["node"]["sdk_address"] = c.sdk_address;
    j["node"]["admin_address"] = c.admin_address;
    j["node"]["http_address"] = c.http_address;
  }
  j["state"] = n.up() ? (n.rec.draining() ? "draining" : "up") : "down";
  size_t sb = 0;
  for (const auto& [id, node] : st.sandbox_node) sb += node == n.rec.node().id();
  j["directory_sandboxes"] = sb;
  return j;
}

// Asks `cmd args` of each node in `ids` that is up; `done` gets the parsed
// answers by node (and the nodes that could not answer, with why).
struct FanIn {
  std::map<std::string, json> answers;
  std::map<std::string, std::string> unreachable;
  size_t left = 0;
  std::function<void(FanIn&)> done;
};

void FanOut(Self self, const std::vector<std::string>& ids, const std::string& cmd,
            const std::vector<std::string>& args, std::function<void(FanIn&)> done) {
  auto fan = std::make_shared<FanIn>();
  fan->done = std::move(done);
  for (const auto& id : ids) {
    auto it = self->state.nodes.find(id);
    if (it == self->state.nodes.end() || !it->second.up()) {
      fan->unreachable[id] = it == self->state.nodes.end() ? "unknown node" : "down: " + it->second.rec.down_reason();
      continue;
    }
    fan->left++;
  }
  if (fan->left == 0) return fan->done(*fan);
  for (const auto& id : ids) {
    auto it = self->state.nodes.find(id);
    if (it == self->state.nodes.end() || !it->second.up()) continue;
    self->request(it->second.entry, std::chrono::seconds(10), admin_atom::value, cmd, args)
        .then(
            [fan, id](std::string& text) {
              fan->answers[id] = json::parse(text, nullptr, false);
              if (--fan->left == 0) fan->done(*fan);
            },
            [fan, id](caf::error& e) {
              fan->unreachable[id] = caf::to_string(e);
              if (--fan->left == 0) fan->done(*fan);
            });
  }
}

std::vector<std::string> AllNodeIds(Self self) {
  std::vector<std::string> ids;
  for (const auto& [id, n] : self->state.nodes) ids.push_back(id);
  return ids;
}

// `ls [--node N] [other filters, passed on]`, `sessions`: every node's rows, each with its node.
caf::result<std::string> Merged(Self self, const std::string& cmd, std::vector<std::string> args,
                                std::vector<std::string> lists) {
  std::vector<std::string> ids;
  std::vector<std::string> pass;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--node" && i + 1 < args.size()) ids.push_back(args[++i]);
    else pass.push_back(args[i]);
  }
  if (ids.empty()) ids = AllNodeIds(self);
  else
    for (const auto& id : ids)
      if (!self->state.nodes.count(id)) return Error("no node '" + id + "' in this cluster (dsecctl nodes lists them)");
  auto rp = self->make_response_promise<std::string>();
  FanOut(self, ids, cmd, pass, [rp, lists](FanIn& fan) mutable {
    json out{{"ok", true}};
    for (const auto& l : lists) out[l] = json::array();
    for (auto& [node, answer] : fan.answers) {
      if (!answer.is_object() || !answer.value("ok", false)) {
        fan.unreachable[node] = answer.is_object() ? answer.value("error", "no answer") : "a malformed answer";
        continue;
      }
      for (const auto& l : lists) {
        if (!answer.contains(l) || !answer[l].is_array()) continue;
        for (auto& row : answer[l]) {
          row["node"] = node;
          out[l].push_back(std::move(row));
        }
      }
    }
    json unreachable = json::object();
    for (const auto& [node, why] : fan.unreachable) unreachable[node] = why;
    out["unreachable"] = unreachable;
    rp.deliver(Dump(out));
  });
  return rp;
}

std::string Status_(Self self) {
  auto& st = self->state;
  size_t up = 0;
  for (const auto& [id, n] : st.nodes) up += n.up();
  const auto& c = *st.ctx;
  return Dump(json{{"ok", true},
                   {"node", c.id},
                   {"boot", c.boot},
                   {"role", "controller"},
                   {"version", DSEC_VERSION},
                   {"uptime_s", (WallClockMs() - st.started_ms) / 1000},
                   {"sdk", c.sdk_address},
                   {"admin", c.admin_address},
                   {"http", c.http_address.empty() ? json(nullptr) : json(c.http_address)},
                   {"cluster", c.cluster_address},
                   {"data", c.store->Describe()},
                   {"nodes", st.nodes.size()},
                   {"nodes_up", up},
                   {"sandboxes", st.sandbox_node.size()},
                   {"sessions", st.session_node.size()},
                   {"placed", st.placed}});
}

std::string Metrics(Self self) {
  auto& st = self->state;
  std::string out;
  metrics::Describe(&out, "dsec_node_info", "gauge", "This dsecd: its id, role and version (always 1).");
  metrics::Line(&out, "dsec_node_info",
                metrics::Labels({{"node", st.ctx->id}, {"role", "controller"}, {"version", DSEC_VERSION}}), 1);
  metrics::Describe(&out, "dsec_uptime_seconds", "gauge", "Seconds since this dsecd started.");
  metrics::Line(&out, "dsec_uptime_seconds", "", static_cast<double>(WallClockMs() - st.started_ms) / 1000);
  metrics::Describe(&out, "dsec_cluster_nodes", "gauge", "Nodes this controller knows, by state.");
  std::map<std::string, int> by_state{{"up", 0}, {"draining", 0}, {"down", 0}};
  for (const auto& [id, n] : st.nodes) by_state[n.up() ? (n.rec.draining() ? "draining" : "up") : "down"]++;
  for (const auto& [s, k] : by_state) metrics::Line(&out, "dsec_cluster_nodes", metrics::Labels({{"state", s}}), k);
  metrics::Describe(&out, "dsec_cluster_node_sandboxes", "gauge", "Live sandboxes on each node (its last heartbeat).");
  metrics::Describe(&out, "dsec_cluster_node_slots", "gauge", "Sandboxes each node takes.");
  metrics::Describe(&out, "dsec_cluster_node_memory_available_bytes", "gauge", "Each node's available memory.");
  metrics::Describe(&out, "dsec_cluster_node_load1", "gauge", "Each node's 1-minute load average.");
  for (const auto& [id, n] : st.nodes) {
    auto l = metrics::Labels({{"node", id}});
    metrics::Line(&out, "dsec_cluster_node_sandboxes", l, static_cast<double>(n.rec.load().sandboxes()));
    metrics::Line(&out, "dsec_cluster_node_slots", l, static_cast<double>(n.rec.load().slots()));
    metrics::Line(&out, "dsec_cluster_node_memory_available_bytes", l,
                  static_cast<double>(n.rec.load().memory_available_bytes()));
    metrics::Line(&out, "dsec_cluster_node_load1", l, n.rec.load().load1());
  }
  metrics::Describe(&out, "dsec_cluster_directory_entries", "gauge", "Sandboxes and sessions in the directory.");
  metrics::Line(&out, "dsec_cluster_directory_entries", "kind=\"sandbox\"", static_cast<double>(st.sandbox_node.size()));
  metrics::Line(&out, "dsec_cluster_directory_entries", "kind=\"session\"", static_cast<double>(st.session_node.size()));
  metrics::Describe(&out, "dsec_placements_total", "counter", "Sandboxes and sessions placed on nodes.");
  metrics::Line(&out, "dsec_placements_total", "", static_cast<double>(st.placed));
  return out + metrics::Render();
}

caf::result<std::string> Overview(Self self) {
  auto rp = self->make_response_promise<std::string>();
  std::vector<std::string> ids = AllNodeIds(self);
  json known = json::object();
  for (const auto& [id, n] : self->state.nodes) known[id] = NodeJson(n, self->state);
  size_t sessions = self->state.session_node.size();
  FanOut(self, ids, "overview", {}, [rp, known, sessions](FanIn& fan) mutable {
    json nodes = json::array();
    for (auto& [id, rec] : known.items()) {
      auto a = fan.answers.find(id);
      json node;
      if (a != fan.answers.end() && a->second.is_object() && a->second.contains("nodes") &&
          a->second["nodes"].is_array() && !a->second["nodes"].empty()) {
        node = a->second["nodes"][0];
        node["role"] = "node";
      } else {
        node = json{{"node", id}, {"role", "node"}, {"sdk", rec["node"].value("sdk_address", "")},
                    {"sandboxes", 0}, {"sandbox_list", json::array()}};
      }
      node["state"] = rec["state"];
      if (rec["state"] == "down") node["down_reason"] = rec.value("down_reason", "");
      nodes.push_back(std::move(node));
    }
    rp.deliver(Dump(json{{"ok", true}, {"role", "controller"}, {"now_ms", WallClockMs()}, {"sessions", sessions},
                         {"nodes", nodes}, {"e2b_calls", E2bCallsJson()}}));
  });
  return rp;
}

}  // namespace

caf::result<std::string> Admin(Self self, const std::string& cmd, const std::vector<std::string>& args) {
  auto& st = self->state;
  if (cmd == "status") return Status_(self);
  if (cmd == "nodes") {
    json nodes = json::array();
    for (const auto& [id, n] : st.nodes) nodes.push_back(NodeJson(n, st));
    return Dump(json{{"ok", true}, {"nodes", nodes}});
  }
  if (cmd == "drain" || cmd == "undrain") {
    if (args.size() != 1) return Error("usage: " + cmd + " NODE (dsecctl nodes lists them)");
    auto it = st.nodes.find(args[0]);
    if (it == st.nodes.end()) return Error("no node '" + args[0] + "' in this cluster (dsecctl nodes lists them)");
    bool drain = cmd == "drain";
    it->second.rec.set_draining(drain);
    if (it->second.up()) it->second.rec.set_state(drain ? "draining" : "up");
    PersistNode(self, it->second);
    st.ctx->log->info("node {} {} by an operator", args[0], drain ? "drained (no new placements)" : "undrained");
    return Dump(json{{"ok", true}, {"node", NodeJson(it->second, st)}});
  }
  if (cmd == "ls") return Merged(self, "ls", args, {"sandboxes", "sessions", "runs"});
  if (cmd == "sessions") return Merged(self, "sessions", args, {"sessions"});
  if (cmd == "metrics") return Metrics(self);
  if (cmd == "overview") return Overview(self);
  if (cmd == "e2b-key") {  // a write or two of its store: rare, and small
    if (!st.ctx->e2b_keys) return Error("this controller serves no E2B door (--e2b off)");
    return st.ctx->e2b_keys(args);
  }
  if (cmd == "stats") {
    auto cs = st.ctx->committer->stats();
    return Dump(json{{"ok", true}, {"placed", st.placed}, {"store_writes", cs.writes}, {"store_batches", cs.batches}});
  }
  if (cmd == "fault") {  // tests: the next N chunks the image service serves have a byte flipped
    if (!st.ctx->test_hooks) return Error("fault is a test hook: start dsecd with --test-hooks");
    if (args.size() != 2 || args[0] != "chunk-corrupt" || args[1].empty() || args[1].size() > 6 ||
        args[1].find_first_not_of("0123456789") != std::string::npos)
      return Error("usage (a controller): fault chunk-corrupt N");
    images::CorruptNextServedChunks(std::stoi(args[1]));
    return Dump(json{{"ok", true}});
  }
  if (cmd == "inspect" || cmd == "kill") {
    if (args.size() != 1) return Error("usage: " + cmd + " ID (a sandbox id or session name)");
    std::string node;
    if (auto it = st.sandbox_node.find(args[0]); it != st.sandbox_node.end()) node = it->second;
    else if (auto se = st.session_node.find(args[0]); se != st.session_node.end()) node = se->second;
    else return Error("no sandbox or session '" + args[0] + "' in this cluster (dsecctl ls lists them)");
    auto n = st.nodes.find(node);
    if (n == st.nodes.end() || !n->second.up()) return Error(NodeGone(self, node, args[0]).message());
    auto rp = self->make_response_promise<std::string>();
    self->request(n->second.entry, std::chrono::seconds(60), admin_atom::value, cmd, args)
        .then(
            [rp, node](std::string& text) mutable {
              json j = json::parse(text, nullptr, false);
              if (j.is_object()) j["node"] = node;
              rp.deliver(j.is_object() ? Dump(j) : text);
            },
            [rp, node](caf::error& e) mutable { rp.deliver(Error("node " + node + ": " + caf::to_string(e))); });
    return rp;
  }
  return Error("unknown command '" + cmd + "' (a controller answers status, nodes, ls, sessions, inspect, kill, "
               "drain, undrain, stats, e2b-key)");
}

}  // namespace dsec::controller_detail
