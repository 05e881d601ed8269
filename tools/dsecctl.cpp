// dsecctl: sandbox commands through the SDK (run, create, exec, rm, pause,
// resume, cp, session)
// and admin commands through the admin console (status, ls, inspect, kill,
// stats). `dsecctl run` behaves like `docker run`: the program's own exit
// code; 124 time limit; 128+N killed by signal N (137 for the memory and
// output limits, which kill); 125 platform error; 126/127 not executable /
// not found.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "dsec/client.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "runtime/line_client.hpp"
#include "runtime/proto_json.hpp"

namespace {

constexpr int kPlatformError = 125;

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct Common {
  std::string addr = Env("DSEC_ADDR", "");    // empty: <data-dir>/dsecd.json, else 127.0.0.1:7400
  std::string admin = Env("DSEC_ADMIN", "");  // empty: <data-dir>/dsecd.json, else 127.0.0.1:7401
  std::string data_dir = Env("DSEC_DATA_DIR", "./dsec-data");
  std::string token = Env("DSEC_TOKEN", "");
  std::string token_file;
  std::string sdk_token_file;
  double connect_timeout_s = 5;
};

struct LimitFlags {
  std::string kind = "fncall";
  std::string image;
  double timeout_s = 0;
  double cpu_time_s = 0;
  std::string memory;
  std::string output_limit;
  std::string disk;
  uint32_t pids = 0;
  double cpus = 0;
  std::vector<std::string> env;
  std::string cwd;
};

void AddLimitFlags(CLI::App* c, LimitFlags* l, bool spec_only = false) {
  if (!spec_only) {
    c->add_option("--kind", l->kind,
                  "fncall | container | microvm | vm | auto (`dsecctl status` lists the kinds this node runs "
                  "and why others are unavailable)")
        ->capture_default_str();
    c->add_option("--image", l->image, "image name (default: the built-in host image)");
  }
  c->add_option("--timeout", l->timeout_s, "wall-clock limit, seconds (default 30)");
  c->add_option("--cpu-time", l->cpu_time_s, "CPU-time limit, seconds");
  c->add_option("--memory", l->memory, "memory limit: bytes or 64k/64m/1g (default 512m)");
  c->add_option("--output-limit", l->output_limit, "cap per output stream (default 1m)");
  if (!spec_only)
    c->add_option("--disk", l->disk,
                  "disk limit of a container: bytes or 512m/10g (default 10g); writes past it fail with EDQUOT");
  c->add_option("--pids", l->pids, "max processes (default 256)");
  c->add_option("--cpus", l->cpus, "CPU quota in cores, e.g. 0.5");
  c->add_option("-e,--env", l->env, "KEY=VALUE, repeatable");
  c->add_option("--cwd", l->cwd, "working directory (default /work)");
}

bool ParseSize(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return false;
  std::string unit(end);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (unit == "" || unit == "b") *out = static_cast<uint64_t>(v);
  else if (unit == "k" || unit == "kb" || unit == "kib") *out = static_cast<uint64_t>(v * 1024);
  else if (unit == "m" || unit == "mb" || unit == "mib") *out = static_cast<uint64_t>(v * 1024 * 1024);
  else if (unit == "g" || unit == "gb" || unit == "gib") *out = static_cast<uint64_t>(v * 1024 * 1024 * 1024);
  else if (unit == "t" || unit == "tb" || unit == "tib") *out = static_cast<uint64_t>(v * 1024 * 1024 * 1024 * 1024);
  else return false;
  return true;
}

// "90", "90s", "10m", "2h", "1d" -> seconds; false when it is not one.
bool ParseDuration(const std::string& s, uint32_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return false;
  std::string unit(end);
  double mult = unit == "" || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : -1;
  if (mult < 0 || v * mult > 4e9) return false;
  *out = static_cast<uint32_t>(v * mult);
  return true;
}

struct LifetimeFlags {
  std::string ttl, idle_timeout, on_idle;
};

void AddLifetimeFlags(CLI::App* c, LifetimeFlags* l) {
  c->add_option("--ttl", l->ttl,
                "destroy the sandbox this long after creation: 90, 90s, 10m, 2h, 1d; 0: never, if the node allows "
                "(default: the node's, dsecd --sandbox-ttl)");
  c->add_option("--idle-timeout", l->idle_timeout,
                "after this long without exec or file call, --on-idle (default: the node's; 0: never)");
  c->add_option("--on-idle", l->on_idle, "pause | destroy (default: the node's)")
      ->check(CLI::IsMember({"pause", "destroy"}));
}

std::string ApplyLifetime(const LifetimeFlags& l, dsec::v1::SandboxSpec* spec) {
  uint32_t v = 0;
  if (!l.ttl.empty()) {
    if (!ParseDuration(l.ttl, &v)) return "--ttl '" + l.ttl + "' is not a duration (e.g. 90, 10m, 2h, 1d)";
    spec->set_ttl_s(v);
  }
  if (!l.idle_timeout.empty()) {
    if (!ParseDuration(l.idle_timeout, &v))
      return "--idle-timeout '" + l.idle_timeout + "' is not a duration (e.g. 90, 10m, 2h)";
    spec->set_idle_timeout_s(v);
  }
  if (l.on_idle == "pause") spec->set_on_idle(dsec::v1::IDLE_ACTION_PAUSE);
  if (l.on_idle == "destroy") spec->set_on_idle(dsec::v1::IDLE_ACTION_DESTROY);
  return {};
}

// Fills spec and exec limits from flags; "" or what is wrong.
std::string ApplyLimits(const LimitFlags& l, dsec::v1::Limits* lim) {
  if (l.timeout_s < 0 || l.cpu_time_s < 0 || l.cpus < 0) return "limits must not be negative";
  if (l.timeout_s > 0) lim->set_timeout_ms(static_cast<uint32_t>(l.timeout_s * 1000));
  if (l.cpu_time_s > 0) lim->set_cpu_time_ms(static_cast<uint32_t>(l.cpu_time_s * 1000));
  uint64_t v = 0;
  if (!l.memory.empty()) {
    if (!ParseSize(l.memory, &v)) return "--memory '" + l.memory + "' is not a size (e.g. 64m)";
    lim->set_memory_bytes(v);
  }
  if (!l.output_limit.empty()) {
    if (!ParseSize(l.output_limit, &v)) return "--output-limit '" + l.output_limit + "' is not a size";
    lim->set_output_bytes(v);
  }
  if (!l.disk.empty()) {
    if (!ParseSize(l.disk, &v)) return "--disk '" + l.disk + "' is not a size (e.g. 512m, 10g)";
    lim->set_disk_bytes(v);
  }
  if (l.pids) lim->set_pids(l.pids);
  if (l.cpus > 0) lim->set_cpu_millis(static_cast<uint32_t>(l.cpus * 1000));
  return {};
}

std::string BuildSpec(const LimitFlags& l, dsec::v1::SandboxSpec* spec) {
  dsec::v1::Kind kind;
  if (!dsec::ParseKind(l.kind, &kind)) return "--kind '" + l.kind + "' is not one of fncall, container, microvm, vm, auto";
  spec->set_kind(kind);
  spec->set_image(l.image);
  return ApplyLimits(l, spec->mutable_limits());
}

std::string BuildExec(const LimitFlags& l, const std::vector<std::string>& cmd, dsec::v1::ExecRequest* exec) {
  for (const auto& a : cmd) exec->add_argv(a);
  for (const auto& kv : l.env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) return "--env '" + kv + "' is not KEY=VALUE";
    (*exec->mutable_env())[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  exec->set_cwd(l.cwd);
  return {};
}

int Fail(const std::string& msg, int code = kPlatformError) {
  std::fprintf(stderr, "dsecctl: %s\n", msg.c_str());
  return code;
}

std::unique_ptr<dsec::Client> ConnectOrDie(const Common& c, int* rc) {
  dsec::ClientOptions o;
  o.address = c.addr;
  o.data_dir = c.data_dir;
  o.token_file = c.sdk_token_file;
  o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.connect_timeout_s * 1000));
  o.threads = 1;
  auto client = dsec::Client::Connect(o);
  if (!client.ok()) {
    // The SDK's message already says where it looked and what to check.
    *rc = Fail(client.status().message());
    return nullptr;
  }
  return std::move(*client);
}

std::string ReadAllStdin(size_t max) {
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(0, buf, sizeof buf);
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > max) break;
  }
  return data;
}

// The one JSON shape (runtime/proto_json.hpp), pretty, with a newline.
std::string ToJson(const google::protobuf::Message& m) { return dsec::DumpJson(dsec::ProtoJson(m), 2) + "\n"; }

// dsecctl's exit code for a result (as docker run's); `say` gets why, for
// the non-zero ones a human should read about.
int ExitCode(const dsec::v1::ExecResult& r, const std::function<void(const std::string&)>& say) {
  switch (r.verdict()) {
    case dsec::v1::VERDICT_OK: return 0;
    case dsec::v1::VERDICT_TIME_LIMIT: say(r.error()); return 124;
    case dsec::v1::VERDICT_MEMORY_LIMIT: say(r.error()); return 137;
    case dsec::v1::VERDICT_OUTPUT_LIMIT: say(r.error()); return 137;
    case dsec::v1::VERDICT_RUNTIME_ERROR:
      if (r.exec_failed()) {
        say(r.error());
        return r.exit_code();
      }
      if (r.signal()) {
        say(r.error());
        return 128 + r.signal();
      }
      return r.exit_code();
    default: say(r.error().empty() ? "platform error" : r.error()); return kPlatformError;
  }
}

// Prints a result like a local program would and returns dsecctl's exit code.
int Report(const dsec::v1::ExecResult& r, bool json) {
  if (json) {
    std::cout << ToJson(r);
    return ExitCode(r, [](const std::string&) {});
  }
  std::fwrite(r.stdout().data(), 1, r.stdout().size(), stdout);
  std::fflush(stdout);
  std::fwrite(r.stderr().data(), 1, r.stderr().size(), stderr);
  if (r.stdout_truncated()) std::fprintf(stderr, "dsecctl: stdout was truncated at the output limit\n");
  if (r.stderr_truncated()) std::fprintf(stderr, "dsecctl: stderr was truncated at the output limit\n");
  return ExitCode(r, [](const std::string& m) { std::fprintf(stderr, "dsecctl: %s\n", m.c_str()); });
}

// `dsecctl session show`: the record, then one line per step (or all of it
// as JSON).
int ShowSession(const dsec::Session& session, bool json) {
  nlohmann::json steps = nlohmann::json::array();
  dsec::v1::SessionRecord rec;
  std::vector<dsec::v1::StepRecord> all;
  for (uint64_t from = 0;;) {
    auto page = session.Steps(from, 1000);
    if (!page.ok()) return Fail(page.status().message());
    rec = page->session();
    for (auto& st : *page->mutable_steps()) all.push_back(std::move(st));
    if (page->steps_size() == 0 || page->steps().rbegin()->index() + 1 >= page->session().step_count()) break;
    from = all.back().index() + 1;
  }
  if (json) {
    auto out = dsec::ProtoJson(rec);
    for (const auto& st : all) steps.push_back(dsec::ProtoJson(st));
    out["steps"] = steps;
    std::cout << dsec::DumpJson(out, 2) << "\n";
    return 0;
  }
  const char* phase = rec.phase() == dsec::v1::SESSION_PHASE_OPEN     ? "open"
                      : rec.phase() == dsec::v1::SESSION_PHASE_CLOSED ? "closed"
                                                                      : "failed";
  std::printf("session %s: %s, %llu step(s), lease %u s", rec.name().c_str(), phase,
              static_cast<unsigned long long>(rec.step_count()), rec.lease_s());
  if (!rec.close_reason().empty()) std::printf(" (%s)", rec.close_reason().c_str());
  if (!rec.error().empty()) std::printf(" (%s)", rec.error().c_str());
  std::printf("\n");
  for (const auto& sb : rec.sandboxes())
    std::printf("  sandbox %-8s %s %s\n", sb.role().c_str(), sb.id().empty() ? "(fncall)" : sb.id().c_str(),
                sb.spec().image().empty() ? "host" : sb.spec().image().c_str());
  for (const auto& st : all) {
    std::string cmd;
    for (const auto& a : st.request().argv()) cmd += (cmd.empty() ? "" : " ") + a;
    if (cmd.size() > 60) cmd = cmd.substr(0, 57) + "...";
    std::printf("  #%-4llu %-6s exit %-3d %-14s %6lld ms  %s", static_cast<unsigned long long>(st.index()),
                st.sandbox().c_str(), st.result().signal() ? 128 + st.result().signal() : st.result().exit_code(),
                dsec::VerdictName(st.result().verdict()), static_cast<long long>(st.finished_ms() - st.started_ms()),
                cmd.c_str());
    if (st.meta().has_reward()) std::printf("  reward %g", st.meta().reward());
    std::printf("\n");
  }
  return 0;
}

// --- admin console -------------------------------------------------------

int Admin(const Common& c, const std::string& line, bool raw) {
  std::string token = c.token;
  if (token.empty()) {
    std::string path = c.token_file.empty() ? c.data_dir + "/admin.token" : c.token_file;
    auto t = dsec::ReadFileToString(path);
    if (!t.ok())
      return Fail("no admin token: " + t.status().message() +
                      " (pass --token, $DSEC_TOKEN, --token-file, or --data-dir of the daemon)",
                  1);
    token = *t;
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  }
  std::string admin = c.admin;
  if (admin.empty()) {
    // A running dsecd says where its console is.
    auto ep = dsec::ReadFileToString(c.data_dir + "/dsecd.json");
    auto j = ep.ok() ? nlohmann::json::parse(*ep, nullptr, false) : nlohmann::json();
    admin = j.is_object() && j.contains("admin") && j["admin"].is_string() ? j["admin"].get<std::string>()
                                                                           : "127.0.0.1:7401";
  }
  dsec::LineClient con;
  if (auto st = con.Connect(admin); !st.ok())
    return Fail("admin console: " + st.message() + " (is dsecd running? point --admin / $DSEC_ADMIN at it)", 1);
  auto ask = [&con](const std::string& cmd) -> dsec::Result<std::string> {
    DSEC_RETURN_IF_ERROR(con.Send(cmd + "\n"));
    return con.ReadLine(60000);
  };
  auto auth = ask("AUTH " + token);
  if (!auth.ok()) return Fail("admin console: " + auth.status().message(), 1);
  auto aj = nlohmann::json::parse(*auth, nullptr, false);
  if (aj.is_discarded() || !aj.value("ok", false))
    return Fail("admin console refused the token: " + (aj.is_discarded() ? *auth : aj.value("error", *auth)), 1);
  auto answer = ask(line);
  if (!answer.ok()) return Fail("admin console: " + answer.status().message(), 1);
  const std::string& reply = *answer;
  auto j = nlohmann::json::parse(reply, nullptr, false);
  if (raw || j.is_discarded()) std::cout << reply << "\n";
  else std::cout << j.dump(2) << "\n";
  return !j.is_discarded() && j.value("ok", false) ? 0 : 1;
}

// "ID:/path" names a file in a sandbox; anything else is local (write
// ./a:b for a local name that looks like one).
bool SandboxPath(const std::string& arg, std::string* id, std::string* path) {
  size_t colon = arg.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= arg.size() || arg[colon + 1] != '/') return false;
  for (size_t i = 0; i < colon; ++i) {
    char ch = arg[i];
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') return false;
  }
  *id = arg.substr(0, colon);
  *path = arg.substr(colon + 1);
  return true;
}

int Copy(const Common& c, const std::string& src, const std::string& dst) {
  std::string src_id, src_path, dst_id, dst_path;
  bool from = SandboxPath(src, &src_id, &src_path), to = SandboxPath(dst, &dst_id, &dst_path);
  if (from == to)
    return Fail(from ? "cp copies between a sandbox and this host, not between two sandboxes"
                     : "cp needs one side in a sandbox: ID:/absolute/path",
                2);
  int rc = 0;
  auto client = ConnectOrDie(c, &rc);
  if (!client) return rc;
  auto sb = client->Attach(from ? src_id : dst_id);
  if (!sb.ok()) return Fail(sb.status().message(), 1);
  if (from) {
    auto data = sb->ReadFile(src_path);
    if (!data.ok()) return Fail(data.status().message(), 1);
    if (dst == "-") {
      std::fwrite(data->data(), 1, data->size(), stdout);
      return std::fflush(stdout) == 0 ? 0 : Fail(std::string("write stdout: ") + std::strerror(errno), 1);
    }
    auto st = dsec::WriteFileAtomic(dst, *data, 0644);
    return st.ok() ? 0 : Fail(st.message(), 1);
  }
  std::string data;
  uint32_t mode = 0644;
  if (src == "-") {
    data = ReadAllStdin(64u << 20);
  } else {
    auto d = dsec::ReadFileToString(src);
    if (!d.ok()) return Fail(d.status().message(), 1);
    data = std::move(*d);
    struct stat st;
    if (::stat(src.c_str(), &st) == 0) mode = st.st_mode & 07777;
  }
  auto st = sb->WriteFile(dst_path, data, mode);
  return st.ok() ? 0 : Fail(st.message(), 1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsecctl: run sandboxes and operate dsecd"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DSEC_VERSION);
  Common c;
  // Global flags work after the subcommand too (dsecctl run --addr A -- cmd).
  app.fallthrough();
  app.add_option("--addr", c.addr,
                 "dsecd SDK entry host:port ($DSEC_ADDR; default: <data-dir>/dsecd.json of a running dsecd, "
                 "else 127.0.0.1:7400)");
  app.add_option("--admin", c.admin,
                 "admin console host:port ($DSEC_ADMIN; default: <data-dir>/dsecd.json, else 127.0.0.1:7401)");
  app.add_option("--data-dir", c.data_dir,
                 "dsecd's data dir: its dsecd.json (addresses), sdk.token and admin.token ($DSEC_DATA_DIR)")
      ->capture_default_str();
  app.add_option("--token", c.token, "admin token ($DSEC_TOKEN)");
  app.add_option("--token-file", c.token_file, "file holding the admin token (default <data-dir>/admin.token)");
  app.add_option("--sdk-token-file", c.sdk_token_file,
                 "file holding the SDK token ($DSEC_SDK_TOKEN; default <data-dir>/sdk.token)");
  app.add_option("--connect-timeout", c.connect_timeout_s, "seconds to wait for dsecd")->capture_default_str();

  LimitFlags run_l;
  std::vector<std::string> run_cmd;
  bool run_json = false, no_stdin = false;
  auto* run = app.add_subcommand("run", "run a command in a fresh sandbox and exit with its status");
  AddLimitFlags(run, &run_l);
  run->add_flag("--json", run_json, "print the whole result as JSON");
  run->add_flag("--no-stdin", no_stdin, "do not pass stdin (it is passed when not a terminal)");
  run->add_option("command", run_cmd, "the command and its arguments (after --)")->required();

  LimitFlags create_l;
  LifetimeFlags create_life;
  auto* create = app.add_subcommand("create",
                                    "create a sandbox; prints its id. It outlives this command (detached): it "
                                    "ends at its ttl, its idle timeout, or dsecctl rm");
  AddLimitFlags(create, &create_l);
  AddLifetimeFlags(create, &create_life);
  std::string create_id;
  create->add_option("--id", create_id, "name the sandbox ([a-z0-9-], at most 64 bytes; default: made up)");

  LimitFlags exec_l;
  std::string exec_id;
  std::vector<std::string> exec_cmd;
  bool exec_json = false;
  auto* exec = app.add_subcommand("exec", "run a command in an existing sandbox");
  exec->add_option("id", exec_id, "sandbox id")->required();
  AddLimitFlags(exec, &exec_l, true);
  exec->add_flag("--json", exec_json, "print the whole result as JSON");
  exec->add_option("command", exec_cmd, "the command (after --)")->required();

  std::vector<std::string> rm_ids;
  auto* rm = app.add_subcommand("rm", "destroy sandboxes");
  rm->add_option("ids", rm_ids, "sandbox ids")->required();

  std::vector<std::string> pause_ids, resume_ids;
  auto* pause = app.add_subcommand("pause", "freeze every process of sandboxes (memory kept, no CPU)");
  pause->add_option("ids", pause_ids, "sandbox ids")->required();
  auto* resume = app.add_subcommand("resume", "continue paused sandboxes");
  resume->add_option("ids", resume_ids, "sandbox ids")->required();

  std::string cp_src, cp_dst;
  auto* cp = app.add_subcommand("cp",
                                "copy a file into or out of a sandbox: cp ID:/path LOCAL, cp LOCAL ID:/path "
                                "(LOCAL may be - for stdin/stdout). Sandbox paths are absolute and resolve "
                                "inside the sandbox; '..' is refused.");
  cp->add_option("src", cp_src, "ID:/path or a local file")->required();
  cp->add_option("dst", cp_dst, "ID:/path or a local file")->required();

  // Sessions.
  auto* session = app.add_subcommand("session", "rollout sessions");
  session->require_subcommand(1);
  std::string s_name;
  LimitFlags s_l;
  uint32_t s_lease = 0;
  auto* s_open = session->add_subcommand("open",
                                         "open (or re-open) a session; prints its record. The session and its "
                                         "sandbox outlive the last command by the lease.");
  s_open->add_option("name", s_name, "job/prompt/sample")->required();
  AddLimitFlags(s_open, &s_l);
  s_open->add_option("--lease", s_lease, "seconds the session lives on without a trainer (default: the node's)");
  uint64_t s_index = 0;
  std::vector<std::string> s_cmd;
  LimitFlags s_step_l;
  std::string s_role;
  double s_reward = 0;
  bool s_json = false;
  auto* s_step = session->add_subcommand("step",
                                         "run step INDEX (or answer it from the log if it ran before); prints "
                                         "the output and exits like dsecctl run");
  s_step->add_option("name", s_name, "the session (job/prompt/sample)")->required();
  s_step->add_option("index", s_index,
                     "the step's number, from 0: the log's length runs it, a lower one is answered from the log")
      ->required();
  AddLimitFlags(s_step, &s_step_l, true);
  s_step->add_option("--sandbox", s_role, "the session's sandbox to run in (default agent)");
  auto* reward_opt = s_step->add_option("--reward", s_reward, "reward to log with the step");
  s_step->add_flag("--json", s_json, "print the step record as JSON");
  s_step->add_option("command", s_cmd, "the command (after --)")->required();
  auto* s_show = session->add_subcommand("show", "a session's record and its steps, one line each");
  s_show->add_option("name", s_name, "the session (job/prompt/sample)")->required();
  s_show->add_flag("--json", s_json, "the record and every step as JSON");
  auto* s_close = session->add_subcommand("close", "close a session");
  s_close->add_option("name", s_name, "the session (job/prompt/sample)")->required();

  // Admin commands.
  bool raw = false;
  std::string admin_id;
  auto* status = app.add_subcommand("status", "node status (admin console)");
  auto* nodes = app.add_subcommand("nodes", "node records (admin console)");
  auto* ls = app.add_subcommand("ls", "sandboxes, sessions and runs (admin console; a controller lists every node's)");
  std::string ls_node, ls_kind, ls_state;
  ls->add_option("--node", ls_node, "only this node's (against a controller)");
  ls->add_option("--kind", ls_kind, "only sandboxes of this kind (fncall, container, microvm, vm)");
  ls->add_option("--state", ls_state, "only sandboxes in this state (pending, running, paused, failed, ...)");
  auto* sessions_cmd = app.add_subcommand("sessions", "rollout sessions: phase, steps, sandboxes (admin console)");
  auto* stats = app.add_subcommand("stats", "counters (admin console)");
  auto* inspect = app.add_subcommand("inspect", "one sandbox, session or run (admin console)");
  inspect->add_option("id", admin_id, "a sandbox id, session name or run id (dsecctl ls lists them)")->required();
  auto* kill = app.add_subcommand("kill", "stop a run, destroy a sandbox, close a session (admin console)");
  kill->add_option("id", admin_id, "a sandbox id, session name or run id (dsecctl ls lists them)")->required();
  std::string drain_node;
  auto* drain = app.add_subcommand("drain", "no new placements on a node; its sandboxes keep working (controller)");
  drain->add_option("node", drain_node, "the node's id (dsecctl nodes lists them)")->required();
  auto* undrain = app.add_subcommand("undrain", "place on a drained node again (controller)");
  undrain->add_option("node", drain_node, "the node's id")->required();
  for (auto* a : {status, nodes, ls, sessions_cmd, stats, inspect, kill, drain, undrain})
    a->add_flag("--raw", raw, "print the reply line as is");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  if (*status) return Admin(c, "status", raw);
  if (*nodes) return Admin(c, "nodes", raw);
  if (*ls) {
    std::string line = "ls";
    for (const auto& [flag, value] : {std::pair<const char*, std::string*>{"--node", &ls_node},
                                      {"--kind", &ls_kind},
                                      {"--state", &ls_state}}) {
      if (value->empty()) continue;
      if (value->find_first_of(" \t\n") != std::string::npos) return Fail(std::string(flag) + " takes one word", 2);
      line += std::string(" ") + flag + " " + *value;
    }
    return Admin(c, line, raw);
  }
  if (*drain) return Admin(c, "drain " + drain_node, raw);
  if (*undrain) return Admin(c, "undrain " + drain_node, raw);
  if (*sessions_cmd) return Admin(c, "sessions", raw);
  if (*stats) return Admin(c, "stats", raw);
  if (*inspect) return Admin(c, "inspect " + admin_id, raw);
  if (*kill) return Admin(c, "kill " + admin_id, raw);

  int rc = 0;
  if (*run) {
    dsec::v1::SandboxSpec spec;
    dsec::v1::ExecRequest req;
    if (auto e = BuildSpec(run_l, &spec); !e.empty()) return Fail(e, 2);
    if (auto e = BuildExec(run_l, run_cmd, &req); !e.empty()) return Fail(e, 2);
    if (!no_stdin && !::isatty(0)) {
      std::string in = ReadAllStdin(64u << 20);
      req.set_stdin(std::move(in));
    }
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto r = client->Run(spec, req);
    if (!r.ok()) return Fail(r.status().message());
    return Report(*r, run_json);
  }
  if (*create) {
    dsec::v1::SandboxSpec spec;
    if (auto e = BuildSpec(create_l, &spec); !e.empty()) return Fail(e, 2);
    if (auto e = ApplyLifetime(create_life, &spec); !e.empty()) return Fail(e, 2);
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    dsec::CreateOptions co;
    co.id = create_id;
    co.detached = true;  // this process ends now; the sandbox must not
    auto sb = client->Create(spec, co);
    if (!sb.ok()) return Fail(sb.status().message());
    std::cout << sb->id() << "\n";
    return 0;
  }
  if (*exec) {
    dsec::v1::ExecRequest req;
    if (auto e = ApplyLimits(exec_l, req.mutable_limits()); !e.empty()) return Fail(e, 2);
    if (auto e = BuildExec(exec_l, exec_cmd, &req); !e.empty()) return Fail(e, 2);
    if (!::isatty(0)) req.set_stdin(ReadAllStdin(64u << 20));
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto sb = client->Attach(exec_id);
    if (!sb.ok()) return Fail(sb.status().message());
    if (exec_json) {
      auto r = sb->Exec(req);
      if (!r.ok()) return Fail(r.status().message());
      return Report(*r, true);
    }
    // Output as the command writes it (a long build, a test run).
    auto r = sb->ExecStream(req, [](const dsec::v1::ExecOutput& o) {
      if (!o.stdout().empty()) {
        std::fwrite(o.stdout().data(), 1, o.stdout().size(), stdout);
        std::fflush(stdout);
      }
      if (!o.stderr().empty()) {
        std::fwrite(o.stderr().data(), 1, o.stderr().size(), stderr);
        std::fflush(stderr);
      }
    });
    // A kind that cannot stream (fncall) refuses before running anything:
    // run it whole instead.
    if (!r.ok() && r.status().code() == dsec::Status::Code::kUnimplemented) r = sb->Exec(req);
    if (!r.ok()) return Fail(r.status().message());
    return Report(*r, false);
  }
  if (*pause || *resume) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    for (const auto& id : *pause ? pause_ids : resume_ids) {
      auto sb = client->Attach(id);
      dsec::Status st = !sb.ok() ? sb.status() : *pause ? sb->Pause() : sb->Resume();
      if (!st.ok()) rc = Fail(st.message(), 1);
      else std::cout << id << "\n";
    }
    return rc;
  }
  if (*cp) return Copy(c, cp_src, cp_dst);
  if (*rm) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    for (const auto& id : rm_ids) {
      auto sb = client->Attach(id);
      dsec::Status st = sb.ok() ? sb->Destroy() : sb.status();
      if (!st.ok()) rc = Fail(st.message(), 1);
      else std::cout << id << "\n";
    }
    return rc;
  }
  if (*session) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    if (*s_open) {
      dsec::v1::SandboxSpec spec;
      if (auto e = BuildSpec(s_l, &spec); !e.empty()) return Fail(e, 2);
      dsec::SessionOptions options;
      options.lease_s = s_lease;
      auto s = client->OpenSession(s_name, spec, options);
      if (!s.ok()) return Fail(s.status().message());
      std::cout << ToJson(s->record());
      return 0;
    }
    auto session = client->AttachSession(s_name);
    if (!session.ok()) return Fail(session.status().message());
    if (*s_step) {
      dsec::v1::ExecRequest req;
      if (auto e = ApplyLimits(s_step_l, req.mutable_limits()); !e.empty()) return Fail(e, 2);
      if (auto e = BuildExec(s_step_l, s_cmd, &req); !e.empty()) return Fail(e, 2);
      if (!::isatty(0)) req.set_stdin(ReadAllStdin(64u << 20));
      dsec::StepOptions options;
      options.sandbox = s_role;
      if (*reward_opt) options.meta.set_reward(s_reward);
      auto r = session->Step(s_index, req, options);
      if (!r.ok()) return Fail(r.status().message());
      if (r->fast_forwarded())
        std::fprintf(stderr, "dsecctl: step %llu answered from the log (not run again)\n",
                     static_cast<unsigned long long>(s_index));
      if (!s_json) return Report(r->step().result(), false);
      std::cout << ToJson(r->step());
      return ExitCode(r->step().result(), [](const std::string&) {});
    }
    if (*s_show) return ShowSession(*session, s_json);
    if (*s_close) {
      auto st = session->Close();
      if (!st.ok()) return Fail(st.message());
      return 0;
    }
  }
  return 0;
}
