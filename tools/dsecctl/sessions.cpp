// `dsecctl sessions` (a table of the console's session rows, filtered) and
// `dsecctl session close` of many sessions at once (by name or job prefix).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "runtime/clock.hpp"
#include "runtime/proto_json.hpp"
#include "dsec/report.hpp"
#include "tools/dsecctl/cli.hpp"

namespace dsec::ctl {

void AddSessionsFlags(CLI::App* c, SessionsFlags* f) {
  c->add_option("--prefix", f->prefix, "only sessions whose name starts so, e.g. a job: demo/");
  c->add_option("--state", f->states, "only sessions in this state: open, closed, failed (repeatable)")
      ->check(CLI::IsMember({"open", "closed", "failed", "opening"}));
  c->add_flag("-a,--all", f->all, "closed sessions too (by default only the others are listed)");
  c->add_flag("--json", f->json, "one JSON object: the rows as the admin console gives them, filtered");
}

namespace {

bool Keeps(const SessionsFlags& f, const nlohmann::json& row) {
  std::string name = row.value("name", ""), phase = row.value("phase", "");
  if (!f.prefix.empty() && name.rfind(f.prefix, 0) != 0) return false;
  if (!f.states.empty()) return std::find(f.states.begin(), f.states.end(), phase) != f.states.end();
  return f.all || phase != "closed";
}

std::string AgeOf(int64_t ms) {
  int64_t s = std::max<int64_t>(0, ms) / 1000;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 172800) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

// The console's session rows (every node's, from a controller).
Result<nlohmann::json> SessionRows(const Common& c) {
  std::string reply;
  if (int rc = AdminReply(c, "sessions", &reply); rc != 0) return Status::Unavailable(reply);
  auto j = nlohmann::json::parse(reply, nullptr, false);
  if (j.is_discarded() || !j.contains("sessions") || !j["sessions"].is_array())
    return Status::Internal("the admin console's sessions reply is not what dsecctl expects: " + reply.substr(0, 200));
  return j;
}

}  // namespace

int ListSessions(const Common& c, const SessionsFlags& f) {
  auto rows = SessionRows(c);
  if (!rows.ok()) return Fail(rows.status());
  nlohmann::json kept = nlohmann::json::array();
  for (const auto& row : (*rows)["sessions"])
    if (Keeps(f, row)) kept.push_back(row);
  if (f.json) {
    nlohmann::json out{{"sessions", kept}};
    if (rows->contains("unreachable")) out["unreachable"] = (*rows)["unreachable"];
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  int64_t now = WallClockMs();
  std::printf("%-36s %-7s %5s %5s %-9s %-12s %-20s %-7s %s\n", "NAME", "STATE", "STEPS", "FLAGS", "KIND", "IMAGE",
              "AGENT", "UPDATED", "NODE");
  for (const auto& row : kept) {
    std::string agent = row.contains("sandboxes") && row["sandboxes"].is_object() ? row["sandboxes"].value("agent", "") : "";
    std::printf("%-36s %-7s %5llu %5llu %-9s %-12s %-20s %-7s %s\n", row.value("name", "").c_str(),
                row.value("phase", "").c_str(), static_cast<unsigned long long>(row.value("steps", uint64_t{0})),
                static_cast<unsigned long long>(row.value("flags", uint64_t{0})),
                row.value("kind", "").c_str(), row.value("image", "").c_str(), agent.empty() ? "-" : agent.c_str(),
                AgeOf(now - row.value("updated_ms", int64_t{0})).c_str(), row.value("node", "").c_str());
  }
  size_t hidden = (*rows)["sessions"].size() - kept.size();
  if (hidden && f.states.empty() && f.prefix.empty() && !f.all)
    std::fprintf(stderr, "dsecctl: %zu closed session(s) not shown (--all shows them)\n", hidden);
  if (rows->contains("unreachable") && !(*rows)["unreachable"].empty())
    std::fprintf(stderr, "dsecctl: nodes that did not answer: %s\n", (*rows)["unreachable"].dump().c_str());
  return 0;
}

int CloseSessions(const Common& c, std::vector<std::string> names, const std::string& prefix) {
  if (names.empty() == prefix.empty())
    return Fail("session close takes session names or --prefix P (every open session whose name starts so)", kUsage);
  if (!prefix.empty()) {
    auto rows = SessionRows(c);
    if (!rows.ok()) return Fail(rows.status());
    for (const auto& row : (*rows)["sessions"]) {
      std::string name = row.value("name", ""), phase = row.value("phase", "");
      if (name.rfind(prefix, 0) == 0 && phase != "closed" && phase != "failed") names.push_back(name);
    }
    if (names.empty()) {
      std::fprintf(stderr, "dsecctl: no open session's name starts with '%s'\n", prefix.c_str());
      return 0;
    }
  }
  int rc = 0;
  auto client = ConnectOrDie(c, &rc);
  if (!client) return rc;
  for (const auto& name : names) {
    auto s = client->AttachSession(name);
    Status st = s.ok() ? s->Close() : s.status();
    if (!st.ok()) rc = Fail(st);
    else std::cout << name << "\n";
  }
  return rc;
}

int ReportSession(const Session& session, bool json) {
  auto flags = dsec::Report(session);
  if (!flags.ok()) return Fail(flags.status());
  for (const auto& f : *flags) {
    if (json) {
      std::cout << nlohmann::json{{"step", f.step}, {"what", f.flag.what()}, {"evidence", f.flag.evidence()}}.dump()
                << "\n";
    } else {
      std::printf("step %llu  %s  %s\n", static_cast<unsigned long long>(f.step), f.flag.what().c_str(),
                  f.flag.evidence().c_str());
    }
  }
  if (!json && flags->empty()) std::fprintf(stderr, "dsecctl: session %s: no flags\n", session.name().c_str());
  return 0;
}

}  // namespace dsec::ctl
