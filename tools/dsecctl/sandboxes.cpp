// `dsecctl ls`: sandboxes through the SDK's ListSandboxes (a controller
// lists every node's), filtered, as a table (as `docker ps`) or JSON.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "dsec/status_proto.hpp"
#include "runtime/clock.hpp"
#include "runtime/proto_json.hpp"
#include "tools/dsecctl/cli.hpp"

namespace dsec::ctl {

void AddLsFlags(CLI::App* c, LsFlags* f) {
  c->add_option("--state", f->states, "only sandboxes in this state: running, paused, failed, ... (repeatable)");
  c->add_option("--kind", f->kinds, "only sandboxes of this kind: fncall, container, microvm, vm (repeatable)");
  c->add_option("-l,--label", f->labels, "only sandboxes with this label, KEY=VALUE (repeatable: all of them)");
  c->add_option("--image", f->image, "only sandboxes on this image (host: the built-in one)");
  c->add_option("--owner", f->owner, "only sandboxes of this SDK client id");
  c->add_option("--session", f->session, "only this session's sandboxes");
  c->add_option("--node", f->node, "only this node's (against a controller)");
  c->add_option("--since", f->since, "only sandboxes created within this long: 90s, 10m, 2h, 1d");
  c->add_option("--limit", f->limit,
                "list at most this many; when more match, the last line says how to go on (default: all)");
  c->add_option("--page-token", f->page_token, "go on from where a --limit listing stopped");
  c->add_flag("--json", f->json, "one JSON object: the records (every field) and the next page's token");
}

namespace {

std::string Age(int64_t ms) {
  int64_t s = ms / 1000;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 172800) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string Labels(const v1::SandboxRecord& r) {
  std::vector<std::string> kv;
  for (const auto& [k, v] : r.spec().labels()) kv.push_back(k + "=" + v);
  std::sort(kv.begin(), kv.end());
  std::string out;
  for (const auto& s : kv) out += (out.empty() ? "" : ",") + s;
  return out.size() > 48 ? out.substr(0, 45) + "..." : out;
}

// Builds the request from the flags; "" or what is wrong.
std::string Filter(const LsFlags& f, v1::ListSandboxesRequest* req) {
  for (const auto& s : f.states) {
    const auto* v = EnumByName(v1::SandboxPhase_descriptor(), s);
    if (!v || v->number() == v1::SANDBOX_PHASE_UNSPECIFIED)
      return "--state '" + s + "' is not one of pending, starting, running, paused, stopping, failed";
    req->add_phases(static_cast<v1::SandboxPhase>(v->number()));
  }
  for (const auto& k : f.kinds) {
    v1::Kind kind;
    if (!ParseKind(k, &kind) || kind == v1::KIND_AUTO) return "--kind '" + k + "' is not one of fncall, container, microvm, vm";
    req->add_kinds(kind);
  }
  if (auto e = ParseLabels(f.labels, "--label", req->mutable_labels()); !e.empty()) return e;
  req->set_image(f.image);
  req->set_owner(f.owner);
  req->set_session(f.session);
  req->set_node(f.node);
  if (!f.since.empty()) {
    uint32_t s = 0;
    if (!ParseDuration(f.since, &s)) return "--since '" + f.since + "' is not a duration (e.g. 90s, 10m, 2h, 1d)";
    req->set_created_after_ms(WallClockMs() - int64_t{s} * 1000);
  }
  req->set_page_token(f.page_token);
  return {};
}

}  // namespace

int ListSandboxes(const Common& c, const LsFlags& f) {
  v1::ListSandboxesRequest req;
  if (auto e = Filter(f, &req); !e.empty()) return Fail(e, kUsage);
  int rc = 0;
  auto client = ConnectOrDie(c, &rc);
  if (!client) return rc;
  std::vector<v1::SandboxRecord> all;
  std::string next;
  // Pages of at most 1000 until --limit is reached or none is left.
  for (;;) {
    uint32_t want = f.limit ? f.limit - static_cast<uint32_t>(all.size()) : 1000;
    req.set_limit(std::min<uint32_t>(want, 1000));
    auto page = client->ListSandboxes(req);
    if (!page.ok()) return Fail(page.status());
    for (auto& r : *page->mutable_sandboxes()) all.push_back(std::move(r));
    next = page->next_page_token();
    if (next.empty() || (f.limit && all.size() >= f.limit)) break;
    req.set_page_token(next);
  }
  if (f.json) {
    nlohmann::json out{{"sandboxes", nlohmann::json::array()}, {"next_page_token", next}};
    for (const auto& r : all) out["sandboxes"].push_back(ProtoJson(r));
    std::cout << DumpJson(out, 2) << "\n";
    return 0;
  }
  int64_t now = WallClockMs();
  std::printf("%-20s %-9s %-12s %-9s %-14s %-5s %-14s %s\n", "ID", "KIND", "IMAGE", "STATE", "NODE", "AGE",
              "ENDS", "LABELS");
  for (const auto& r : all) {
    std::string image = r.spec().image().empty() ? "host" : r.spec().image();
    std::string ends = r.expires_ms() ? std::string(r.expiry_action()) + " in " + Age(std::max<int64_t>(0, r.expires_ms() - now))
                                      : "-";
    std::printf("%-20s %-9s %-12s %-9s %-14s %-5s %-14s %s\n", r.id().c_str(), KindName(r.spec().kind()),
                image.c_str(), PhaseName(r.phase()), r.node_id().c_str(), Age(now - r.created_ms()).c_str(),
                ends.c_str(), Labels(r).c_str());
  }
  if (!next.empty())
    std::fprintf(stderr, "dsecctl: more sandboxes match; go on with: dsecctl ls ... --page-token %s\n", next.c_str());
  return 0;
}

}  // namespace dsec::ctl
