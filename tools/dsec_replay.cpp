// dsec-replay: a rollout session's timeline, for a researcher debugging it.
//
//   dsec-replay NAME                      from ./dsec-data (stopped or running daemon)
//   dsec-replay NAME --data-dir DIR
//   dsec-replay NAME --addr HOST:PORT     from a running daemon, through the SDK
//   dsec-replay NAME --json               the whole log as JSON (docs/replay.md)
//   dsec-replay NAME --rerun [--addr A]   runs every step again in fresh sandboxes
//                                         and reports the first that differs
//
// Exit codes: 0 shown (rerun: every step gave the logged result); 1 rerun:
// a step differs; 2 bad usage; 3 the session or its store cannot be read;
// 4 rerun could not run (no daemon, sandbox creation failed).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsec/client.hpp"
#include "dsec/status_proto.hpp"
#include "state/store.hpp"
#include "state/table.hpp"

namespace {

using nlohmann::json;

struct Log {
  dsec::v1::SessionRecord session;
  std::vector<dsec::v1::StepRecord> steps;
};

dsec::Result<Log> FromStore(const std::string& data_dir, const std::string& name) {
  dsec::state::RocksOptions o;
  o.create_if_missing = false;
  o.read_only = true;
  auto store = dsec::state::OpenRocksStore(data_dir + "/db", o);
  if (!store.ok()) return store.status().Annotate("data dir " + data_dir);
  Log log;
  auto rec = dsec::state::TypedTable<dsec::v1::SessionRecord>(store->get(), dsec::state::Table::kSessions).Get(name);
  if (!rec.ok()) {
    if (rec.status().code() == dsec::Status::Code::kNotFound)
      return dsec::Status::NotFound("no session '" + name + "' in " + data_dir +
                                    " (never opened there, or past the retention limit)");
    return rec.status();
  }
  log.session = std::move(*rec);
  dsec::Status s = dsec::state::TypedTable<dsec::v1::StepRecord>(store->get(), dsec::state::Table::kSteps)
                       .Scan(dsec::state::StepPrefix(name), [&](const std::string&, dsec::v1::StepRecord&& step) {
                         log.steps.push_back(std::move(step));
                         return true;
                       });
  if (!s.ok()) return s;
  return log;
}

dsec::Result<Log> FromDaemon(dsec::Client& client, const std::string& name) {
  auto session = client.AttachSession(name);
  if (!session.ok()) return session.status();
  Log log;
  for (uint64_t from = 0;;) {
    auto page = session->Steps(from, 1000);
    if (!page.ok()) return page.status();
    log.session = page->session();
    for (auto& st : *page->mutable_steps()) log.steps.push_back(std::move(st));
    if (page->steps_size() == 0 || page->steps().rbegin()->index() + 1 >= page->session().step_count()) break;
    from = log.steps.back().index() + 1;
  }
  return log;
}

std::string RoleOf(const dsec::v1::StepRecord& s) { return s.sandbox().empty() ? "agent" : s.sandbox(); }

std::string PhaseText(dsec::v1::SessionPhase p) {
  switch (p) {
    case dsec::v1::SESSION_PHASE_OPEN: return "open";
    case dsec::v1::SESSION_PHASE_CLOSED: return "closed";
    case dsec::v1::SESSION_PHASE_FAILED: return "failed";
    default: return "opening";
  }
}

std::string Time(int64_t ms) {
  if (!ms) return "-";
  time_t t = ms / 1000;
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
  return std::string(buf) + "." + std::to_string(1000 + ms % 1000).substr(1) + "Z";
}

// The JSON schema of --json, documented in docs/replay.md ("dsec-replay/1").
json ToJson(const Log& log) {
  const auto& r = log.session;
  json sandboxes = json::array();
  for (const auto& sb : r.sandboxes())
    sandboxes.push_back({{"role", sb.role()},
                         {"id", sb.id()},
                         {"kind", dsec::KindName(sb.spec().kind())},
                         {"image", sb.spec().image().empty() ? "host" : sb.spec().image()}});
  json steps = json::array();
  for (const auto& s : log.steps) {
    const auto& q = s.request();
    const auto& x = s.result();
    json env = json::object();
    for (const auto& [k, v] : q.env()) env[k] = v;
    json meta = {{"prompt_tokens", s.meta().prompt_tokens()}, {"completion_tokens", s.meta().completion_tokens()}};
    if (s.meta().has_reward()) meta["reward"] = s.meta().reward();
    json notes = json::object();
    for (const auto& [k, v] : s.meta().notes()) notes[k] = v;
    meta["notes"] = notes;
    json flags = json::array();
    for (const auto& f : s.flags()) flags.push_back({{"what", f.what()}, {"evidence", f.evidence()}});
    steps.push_back({{"index", s.index()},
                     {"sandbox", RoleOf(s)},
                     {"started_ms", s.started_ms()},
                     {"finished_ms", s.finished_ms()},
                     {"argv", std::vector<std::string>(q.argv().begin(), q.argv().end())},
                     {"env", env},
                     {"cwd", q.cwd()},
                     {"stdin", q.stdin()},
                     {"verdict", dsec::VerdictName(x.verdict())},
                     {"exit_code", x.exit_code()},
                     {"signal", x.signal()},
                     {"stdout", x.stdout()},
                     {"stderr", x.stderr()},
                     {"stdout_truncated", x.stdout_truncated()},
                     {"stderr_truncated", x.stderr_truncated()},
                     {"cpu_us", x.cpu_us()},
                     {"wall_us", x.wall_us()},
                     {"peak_memory_bytes", x.peak_memory_bytes()},
                     {"error", x.error()},
                     {"meta", meta},
                     {"flags", flags}});
  }
  return {{"schema", "dsec-replay/1"},
          {"session",
           {{"name", r.name()},
            {"phase", PhaseText(r.phase())},
            {"created_ms", r.created_ms()},
            {"closed_ms", r.closed_ms()},
            {"close_reason", r.close_reason()},
            {"error", r.error()},
            {"lease_s", r.lease_s()},
            {"step_count", r.step_count()},
            {"restarts", r.restarts()},
            {"sandboxes", sandboxes}}},
          {"steps", steps}};
}

std::string Indent(const std::string& text, size_t max_lines, bool* cut) {
  std::string out;
  size_t lines = 0, pos = 0;
  *cut = false;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (lines == max_lines) {
      *cut = true;
      break;
    }
    out += "      " + line + "\n";
    ++lines;
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  return out;
}

void PrintTimeline(const Log& log, size_t max_lines) {
  const auto& r = log.session;
  std::printf("session %s  %s  %zu step(s)  opened %s", r.name().c_str(), PhaseText(r.phase()).c_str(),
              log.steps.size(), Time(r.created_ms()).c_str());
  if (r.closed_ms()) std::printf("  closed %s (%s)", Time(r.closed_ms()).c_str(), r.close_reason().c_str());
  if (!r.error().empty()) std::printf("  error: %s", r.error().c_str());
  std::printf("\n");
  for (const auto& sb : r.sandboxes())
    std::printf("  sandbox %-8s %-10s %s %s\n", sb.role().c_str(), dsec::KindName(sb.spec().kind()),
                sb.spec().image().empty() ? "host" : sb.spec().image().c_str(),
                sb.id().empty() ? "(fresh per step)" : sb.id().c_str());
  double reward_sum = 0;
  bool any_reward = false;
  for (const auto& s : log.steps) {
    const auto& x = s.result();
    std::string cmd;
    for (const auto& a : s.request().argv()) cmd += (cmd.empty() ? "" : " ") + a;
    std::printf("\n#%llu  +%.3f s  [%s]  $ %s\n", static_cast<unsigned long long>(s.index()),
                (s.started_ms() - r.created_ms()) / 1000.0, RoleOf(s).c_str(), cmd.c_str());
    std::printf("    -> %s", dsec::VerdictName(x.verdict()));
    if (x.signal()) std::printf(", signal %d", x.signal());
    else std::printf(", exit %d", x.exit_code());
    std::printf(", %.1f ms wall, %.1f ms cpu", x.wall_us() / 1000.0, x.cpu_us() / 1000.0);
    if (s.meta().has_reward()) {
      std::printf(", reward %g", s.meta().reward());
      reward_sum += s.meta().reward();
      any_reward = true;
    }
    if (s.meta().prompt_tokens() || s.meta().completion_tokens())
      std::printf(", tokens %llu+%llu", static_cast<unsigned long long>(s.meta().prompt_tokens()),
                  static_cast<unsigned long long>(s.meta().completion_tokens()));
    std::printf("\n");
    if (!x.error().empty() && x.verdict() != dsec::v1::VERDICT_OK) std::printf("    error: %s\n", x.error().c_str());
    for (const auto& [k, v] : s.meta().notes()) std::printf("    note %s: %s\n", k.c_str(), v.c_str());
    for (const auto& f : s.flags()) std::printf("    FLAG %s: %s\n", f.what().c_str(), f.evidence().c_str());
    bool cut = false;
    if (!x.stdout().empty()) {
      std::printf("    stdout%s:\n%s", x.stdout_truncated() ? " (truncated at the limit)" : "",
                  Indent(x.stdout(), max_lines, &cut).c_str());
      if (cut) std::printf("      ... (--lines 0 shows all)\n");
    }
    if (!x.stderr().empty()) {
      std::printf("    stderr%s:\n%s", x.stderr_truncated() ? " (truncated at the limit)" : "",
                  Indent(x.stderr(), max_lines, &cut).c_str());
      if (cut) std::printf("      ... (--lines 0 shows all)\n");
    }
  }
  if (any_reward) std::printf("\ntotal reward %g\n", reward_sum);
}

// What must be equal for a rerun step to "give the logged result".
std::string Difference(const dsec::v1::ExecResult& logged, const dsec::v1::ExecResult& now) {
  auto shorten = [](const std::string& s) {
    std::string t = s.size() > 200 ? s.substr(0, 200) + "..." : s;
    return json(t).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  if (logged.verdict() != now.verdict())
    return std::string("verdict: logged ") + dsec::VerdictName(logged.verdict()) + ", now " +
           dsec::VerdictName(now.verdict());
  if (logged.exit_code() != now.exit_code())
    return "exit code: logged " + std::to_string(logged.exit_code()) + ", now " + std::to_string(now.exit_code());
  if (logged.signal() != now.signal())
    return "signal: logged " + std::to_string(logged.signal()) + ", now " + std::to_string(now.signal());
  if (logged.stdout() != now.stdout())
    return "stdout: logged " + shorten(logged.stdout()) + ", now " + shorten(now.stdout());
  if (logged.stderr() != now.stderr())
    return "stderr: logged " + shorten(logged.stderr()) + ", now " + shorten(now.stderr());
  return "";
}

// Re-executes the log in fresh sandboxes (one per role, as the session had)
// and stops at the first step whose result differs.
int Rerun(dsec::Client& client, const Log& log) {
  // A role without a sandbox id ran each step as a fresh fncall run.
  std::map<std::string, dsec::v1::SandboxSpec> specs;
  std::map<std::string, bool> fresh_per_step;
  for (const auto& sb : log.session.sandboxes()) {
    specs[sb.role()] = sb.spec();
    fresh_per_step[sb.role()] = sb.id().empty();
  }
  if (specs.empty()) {
    specs["agent"] = log.session.spec();
    fresh_per_step["agent"] = true;
  }
  std::map<std::string, dsec::Sandbox> sandboxes;
  auto cleanup = [&] {
    for (auto& [role, sb] : sandboxes) {
      dsec::Status s = sb.Destroy();
      if (!s.ok()) std::fprintf(stderr, "dsec-replay: removing sandbox %s: %s\n", sb.id().c_str(), s.message().c_str());
    }
  };
  int rc = 0;
  for (const auto& step : log.steps) {
    std::string role = RoleOf(step);
    auto spec = specs.find(role);
    if (spec == specs.end()) {
      std::fprintf(stderr, "dsec-replay: step %llu ran in sandbox '%s', which the session does not list\n",
                   static_cast<unsigned long long>(step.index()), role.c_str());
      rc = 3;
      break;
    }
    dsec::Result<dsec::v1::ExecResult> now = dsec::Status::Internal("not run");
    if (fresh_per_step[role]) {
      now = client.Run(spec->second, step.request());
    } else {
      auto it = sandboxes.find(role);
      if (it == sandboxes.end()) {
        auto sb = client.Create(spec->second);
        if (!sb.ok()) {
          std::fprintf(stderr, "dsec-replay: creating a fresh '%s' sandbox: %s\n", role.c_str(),
                       sb.status().message().c_str());
          rc = 4;
          break;
        }
        it = sandboxes.emplace(role, *sb).first;
      }
      now = it->second.Exec(step.request());
    }
    if (!now.ok()) {
      std::fprintf(stderr, "dsec-replay: step %llu could not run: %s\n", static_cast<unsigned long long>(step.index()),
                   now.status().message().c_str());
      rc = 4;
      break;
    }
    std::string diff = Difference(step.result(), *now);
    if (!diff.empty()) {
      std::printf("step %llu differs: %s\n", static_cast<unsigned long long>(step.index()), diff.c_str());
      rc = 1;
      break;
    }
    std::printf("step %llu same\n", static_cast<unsigned long long>(step.index()));
  }
  if (rc == 0) std::printf("all %zu step(s) gave the logged results\n", log.steps.size());
  cleanup();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsec-replay: a rollout session's timeline, its JSON export, and a re-run that finds where it diverges"};
  const char* env_data = std::getenv("DSEC_DATA_DIR");
  std::string name, data_dir = env_data && *env_data ? env_data : "./dsec-data", addr, token_file;
  bool as_json = false, rerun = false;
  size_t lines = 20;
  app.add_option("name", name, "session name (job/prompt/sample)")->required();
  auto* dd = app.add_option("--data-dir", data_dir,
                            "read the log from this data dir (works while dsecd runs; $DSEC_DATA_DIR)")
                 ->capture_default_str();
  app.add_option("--addr", addr,
                 "read from the dsecd at HOST:PORT instead; with --rerun, the dsecd to re-run on (default: "
                 "$DSEC_ADDR, else <data-dir>/dsecd.json, else 127.0.0.1:7400)");
  app.add_option("--sdk-token-file", token_file,
                 "the SDK token of the dsecd at --addr ($DSEC_SDK_TOKEN; default <data-dir>/sdk.token)");
  app.add_flag("--json", as_json, "print the log as JSON (schema dsec-replay/1, docs/replay.md)");
  app.add_flag("--rerun", rerun, "re-execute every step in fresh sandboxes; report the first that differs");
  app.add_option("--lines", lines, "output lines shown per stream and step (0: all)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (as_json && rerun) {
    std::fprintf(stderr, "dsec-replay: --json and --rerun do not go together\n");
    return 2;
  }
  std::unique_ptr<dsec::Client> client;
  auto connect = [&](const std::string& a) -> bool {
    dsec::ClientOptions o;
    o.address = a;
    o.data_dir = data_dir;
    o.token_file = token_file;
    auto c = dsec::Client::Connect(o);
    if (!c.ok()) {
      std::fprintf(stderr, "dsec-replay: %s\n", c.status().message().c_str());
      return false;
    }
    client = std::move(*c);
    return true;
  };
  // The log comes from the daemon when --addr is given without --data-dir.
  bool from_daemon = !addr.empty() && dd->count() == 0;
  dsec::Result<Log> log = dsec::Status::Internal("unread");
  if (from_daemon) {
    if (!connect(addr)) return 3;
    log = FromDaemon(*client, name);
  } else {
    log = FromStore(data_dir, name);
  }
  if (!log.ok()) {
    std::fprintf(stderr, "dsec-replay: %s\n", log.status().message().c_str());
    return 3;
  }
  if (as_json) {
    std::cout << ToJson(*log).dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  if (!rerun) {
    PrintTimeline(*log, lines == 0 ? static_cast<size_t>(-1) : lines);
    return 0;
  }
  if (!client && !connect(addr)) return 4;
  return Rerun(*client, *log);
}
