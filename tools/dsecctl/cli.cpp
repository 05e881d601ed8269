// dsecctl's shared parts: flags every command takes, building specs and
// execs from flags, connecting, and printing results with docker run's exit
// codes. See cli.hpp.
#include "tools/dsecctl/cli.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <iostream>

#include "dsec/files.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "runtime/line_client.hpp"
#include "runtime/proto_json.hpp"

namespace dsec::ctl {

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
CLI::Validator Seconds(const std::string& what) {
  return CLI::Validator(
      [what](std::string& v) -> std::string {
        char* end = nullptr;
        double d = std::strtod(v.c_str(), &end);
        if (v.empty() || end != v.c_str() + v.size() || !(d >= 0)) return "'" + v + "' is not " + what;
        return {};
      },
      "");
}

void AddLimitFlags(CLI::App* c, LimitFlags* l, bool spec_only) {
  if (!spec_only) {
    c->add_option("--kind", l->kind,
                  "fncall | container | microvm | vm | auto (`dsecctl status` lists the kinds this node runs "
                  "and why others are unavailable)")
        ->capture_default_str();
    c->add_option("--image", l->image, "image name (default: the built-in host image)");
  }
  c->add_option("--timeout", l->timeout_s,
                spec_only ? "wall-clock limit of this command, seconds (default 30)"
                          : "wall-clock limit of each command, seconds (default 30); not the sandbox's lifetime"
                            " (create: --ttl)")
      ->check(Seconds());
  c->add_option("--cpu-time", l->cpu_time_s, "CPU-time limit of each command, seconds")->check(Seconds());
  c->add_option("--memory", l->memory,
                spec_only ? "memory limit of this command: bytes or 64k/64m/1g. Only a fncall session's step has its"
                            " own: a container's, microVM's or VM's memory, pids and cpus are set when it is created"
                            " (dsecctl create --memory), and an exec asking for other ones is refused"
                          : "memory limit: bytes or 64k/64m/1g (default 512m; a container's, microVM's or VM's is"
                            " its whole memory)");
  c->add_option("--output-limit", l->output_limit, "cap per output stream (default 1m)");
  if (!spec_only)
    c->add_option("--disk", l->disk,
                  "disk limit of a container: bytes or 512m/10g (default 10g); writes past it fail with EDQUOT");
  c->add_option("--pids", l->pids, spec_only ? "max processes (as --memory: set at create)" : "max processes (default 256)");
  c->add_option("--cpus", l->cpus, "CPU quota in cores, e.g. 0.5")->check(Seconds("a number of cores (e.g. 0.5)"));
  c->add_option("-e,--env", l->env, "KEY=VALUE, repeatable");
  c->add_option("--cwd", l->cwd, "working directory (default /work)");
  if (!spec_only)
    c->add_option("-l,--label", l->labels,
                  "KEY=VALUE metadata kept with the sandbox, shown by ls and inspect, filtered on by ls --label; "
                  "repeatable");
  if (!spec_only) {
    c->add_option("--network", l->network,
                  "none (default: a loopback of its own, nothing else) | allow (only what --allow lists) | open "
                  "(any public address, where the node's operator enables it); docs/running.md, \"Network\"")
        ->check(CLI::IsMember({"none", "allow", "open"}));
    c->add_option("--allow", l->allow,
                  "an allow-list entry (implies --network allow), repeatable: ADDRESS[/PREFIX][:PORTS][/tcp|/udp] "
                  "or NAME[:PORTS][/tcp|/udp], NAME exact or *.suffix; PORTS 443 or 80,443 or 8000-8100");
    c->add_option("--expose", l->expose, "a TCP port inside the sandbox reachable from the host through dsec; repeatable");
    c->add_option("--task-root", l->task_root,
                  "container: the task's directory in the image, which --protect and --hide globs are relative to "
                  "(docs/running.md, \"Guarding a task's paths\")");
    c->add_option("--protect", l->protect,
                  "container: a glob of task paths kept read-only, root included (tests/**, **/conftest.py); new "
                  "files matching it are flagged in the session's steps; repeatable");
    c->add_option("--hide", l->hide, "container: a glob of task paths taken out of the sandbox (grader/**); repeatable");
  }
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


void AddLifetimeFlags(CLI::App* c, LifetimeFlags* l) {
  c->add_option("--ttl", l->ttl,
                "the sandbox's lifetime (E2B's \"timeout\"): destroy it this long after creation: 90, 90s, 10m, "
                "2h, 1d; 0: never, if the node allows (default: the node's, dsecd --sandbox-ttl; change it later "
                "with dsecctl timeout)");
  c->add_option("--idle-timeout", l->idle_timeout,
                "after this long without exec or file call, --on-idle (default: the node's; 0: never)");
  c->add_option("--on-idle", l->on_idle, "pause | destroy (default: the node's)")
      ->check(CLI::IsMember({"pause", "destroy"}));
  c->add_option("--on-ttl", l->on_ttl,
                "what the end of its ttl does: destroy (the default) | pause (with memory where the kind can; its "
                "ttl starts again when it is resumed: E2B's autoPause)")
      ->check(CLI::IsMember({"pause", "destroy"}));
  c->add_flag("--resume-on-call", l->resume_on_call,
              "a call (exec, file) while it is paused resumes it first instead of being refused");
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
  if (l.on_ttl == "pause") spec->set_on_ttl(dsec::v1::IDLE_ACTION_PAUSE);
  if (l.on_ttl == "destroy") spec->set_on_ttl(dsec::v1::IDLE_ACTION_DESTROY);
  if (l.resume_on_call) spec->set_resume_on_call(true);
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
  if (auto e = ParseLabels(l.labels, "--label", spec->mutable_labels()); !e.empty()) return e;
  if (!l.network.empty() || !l.allow.empty() || !l.expose.empty()) {
    // Checked by the node, which names a bad entry.
    auto* net = spec->mutable_network();
    std::string mode = !l.network.empty() ? l.network : l.allow.empty() ? "none" : "allow";
    net->set_mode(mode == "allow"  ? dsec::v1::NETWORK_MODE_ALLOW
                  : mode == "open" ? dsec::v1::NETWORK_MODE_OPEN
                                   : dsec::v1::NETWORK_MODE_NONE);
    for (const auto& a : l.allow) net->add_allow(a);
    for (uint32_t p : l.expose) net->add_expose(p);
  }
  if (!l.task_root.empty() || !l.protect.empty() || !l.hide.empty()) {
    // Checked by the node, which names a bad glob.
    auto* task = spec->mutable_task();
    task->set_root(l.task_root);
    for (const auto& g : l.protect) task->add_protected_paths(g);
    for (const auto& g : l.hide) task->add_hidden_paths(g);
  }
  return ApplyLimits(l, spec->mutable_limits());
}

std::string ParseLabels(const std::vector<std::string>& kvs, const char* flag,
                        google::protobuf::Map<std::string, std::string>* out) {
  for (const auto& kv : kvs) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) return std::string(flag) + " '" + kv + "' is not KEY=VALUE";
    (*out)[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return {};
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

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "dsecctl: %s\n", msg.c_str());
  return code;
}

int Fail(const Status& s) { return Fail(s.message(), s.code() == Status::Code::kInvalidArgument ? kUsage : kPlatformError); }

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
    *rc = Fail(client.status());
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
    if (!page.ok()) return Fail(page.status());
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

int AdminReply(const Common& c, const std::string& line, std::string* reply) {
  auto fail = [reply](const std::string& why) {
    *reply = why;
    return kPlatformError;
  };
  std::string token = c.token;
  if (token.empty()) {
    std::string path = c.token_file.empty() ? c.data_dir + "/admin.token" : c.token_file;
    auto t = dsec::ReadFileToString(path);
    if (!t.ok())
      return fail("no admin token: " + t.status().message() +
                  " (pass --token, $DSEC_TOKEN, --token-file, or --data-dir of the daemon)");
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
    return fail("admin console: " + st.message() + " (is dsecd running? point --admin / $DSEC_ADMIN at it)");
  auto ask = [&con](const std::string& cmd) -> dsec::Result<std::string> {
    DSEC_RETURN_IF_ERROR(con.Send(cmd + "\n"));
    return con.ReadLine(60000);
  };
  auto auth = ask("AUTH " + token);
  if (!auth.ok()) return fail("admin console: " + auth.status().message());
  auto aj = nlohmann::json::parse(*auth, nullptr, false);
  if (aj.is_discarded() || !aj.value("ok", false))
    return fail("admin console refused the token: " + (aj.is_discarded() ? *auth : aj.value("error", *auth)));
  auto answer = ask(line);
  if (!answer.ok()) return fail("admin console: " + answer.status().message());
  *reply = *answer;
  return 0;
}

int Admin(const Common& c, const std::string& line, bool raw) {
  std::string reply;
  if (int rc = AdminReply(c, line, &reply); rc != 0) return Fail(reply, rc);
  auto j = nlohmann::json::parse(reply, nullptr, false);
  bool ok = !j.is_discarded() && j.is_object() && j.value("ok", false);
  if (!ok && !raw && j.is_object() && j.contains("error") && j["error"].is_string())
    return Fail(j["error"].get<std::string>());
  if (raw || j.is_discarded()) std::cout << reply << "\n";
  else std::cout << j.dump(2) << "\n";
  return ok ? 0 : kPlatformError;
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

int Copy(const Common& c, const std::string& src, const std::string& dst, const CopyFlags& flags) {
  std::string src_id, src_path, dst_id, dst_path;
  bool from = SandboxPath(src, &src_id, &src_path), to = SandboxPath(dst, &dst_id, &dst_path);
  if (from == to)
    return Fail(from ? "cp copies between a sandbox and this host, not between two sandboxes"
                     : "cp needs one side in a sandbox: ID:/absolute/path",
                kUsage);
  if (from && (!flags.user.empty() || flags.parents || !flags.xattrs.empty()))
    return Fail("--user, --parents and --xattr are for a copy into a sandbox", kUsage);
  v1::WriteFileRequest req;
  for (const auto& x : flags.xattrs) {
    size_t eq = x.find('=');
    if (eq == std::string::npos || eq == 0) return Fail("--xattr " + x + ": give NAME=VALUE", kUsage);
    (*req.mutable_xattrs())[x.substr(0, eq)] = x.substr(eq + 1);
  }
  int rc = 0;
  auto client = ConnectOrDie(c, &rc);
  if (!client) return rc;
  auto sb = client->Attach(from ? src_id : dst_id);
  if (!sb.ok()) return Fail(sb.status());
  if (from) {
    auto data = sb->ReadFile(src_path);
    if (!data.ok()) return Fail(data.status());
    if (dst == "-") {
      std::fwrite(data->data(), 1, data->size(), stdout);
      return std::fflush(stdout) == 0 ? 0 : Fail(std::string("write stdout: ") + std::strerror(errno), kLocal);
    }
    auto st = dsec::WriteFileAtomic(dst, *data, 0644);
    return st.ok() ? 0 : Fail(st.message(), kLocal);
  }
  std::string data;
  uint32_t mode = 0644;
  if (src == "-") {
    data = ReadAllStdin(64u << 20);
  } else {
    auto d = dsec::ReadFileToString(src);
    if (!d.ok()) return Fail(d.status().message(), kLocal);
    data = std::move(*d);
    struct stat st;
    if (::stat(src.c_str(), &st) == 0) mode = st.st_mode & 07777;
  }
  req.set_path(dst_path);
  req.set_content(std::move(data));
  req.set_mode(mode);
  req.set_make_parents(flags.parents);
  req.set_user(flags.user);
  auto st = Write(*sb, std::move(req));
  return st.ok() ? 0 : Fail(st);
}

}  // namespace dsec::ctl
