// dsecctl: sandbox commands through the SDK (run, create, exec, rm, pause,
// resume, cp, timeout, ls, session, snapshot, fork) and admin commands through the admin
// console (status, nodes, sessions, inspect, kill, stats, drain). `dsecctl
// run` behaves like `docker run`: the program's own exit code; 124 time
// limit; 128+N killed by signal N (137 for the memory and output limits,
// which kill); 125 platform error; 126/127 not executable / not found.
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "dsec/client.hpp"
#include "dsec/report.hpp"
#include "dsec/snapshot.hpp"
#include "dsec/status_proto.hpp"
#include "tools/dsecctl/cli.hpp"

using namespace dsec::ctl;  // NOLINT: this file is dsecctl's main

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
  std::string create_id, create_snapshot;
  create->add_option("--id", create_id, "name the sandbox ([a-z0-9-], at most 64 bytes; default: made up)");
  create->add_option("--snapshot", create_snapshot,
                     "start from this snapshot (dsecctl snapshot ls): its state, image and kind, on its node");

  std::vector<std::string> rm_ids;
  auto* rm = app.add_subcommand("rm", "destroy sandboxes");
  rm->add_option("ids", rm_ids, "sandbox ids")->required();

  std::string timeout_id, timeout_for;
  auto* timeout = app.add_subcommand(
      "timeout", "end a sandbox this long from now, sooner or later than its ttl said (within the node's maximum)");
  timeout->add_option("id", timeout_id, "sandbox id")->required();
  timeout->add_option("duration", timeout_for, "from now: 90, 90s, 10m, 2h, 1d")->required();

  std::string net_id, net_mode;
  std::vector<std::string> net_allow;
  bool net_replace = false, net_add = false;
  auto* network = app.add_subcommand(
      "network",
      "change a running sandbox's network policy (one made with --network allow or open), for new connections; "
      "say --replace (the whole new policy) or --add (entries joining its allow-list)");
  network->add_option("id", net_id, "sandbox id")->required();
  auto* net_r = network->add_flag("--replace", net_replace, "the policy given replaces the one in force");
  auto* net_a = network->add_flag("--add", net_add, "the --allow entries join the allow-list in force");
  net_r->excludes(net_a);
  network->add_option("--network", net_mode, "none | allow | open (with --replace; default allow when --allow is given)")
      ->check(CLI::IsMember({"none", "allow", "open"}));
  network->add_option("--allow", net_allow, "an allow-list entry, repeatable (as for create)");

  std::string pf_id;
  uint32_t pf_port = 0;
  auto* port_forward = app.add_subcommand(
      "port-forward",
      "where the host reaches a sandbox's exposed TCP port (dsecd serves it while the sandbox lives; create the "
      "sandbox with --expose PORT); prints HOST:PORT");
  port_forward->add_option("id", pf_id, "sandbox id")->required();
  port_forward->add_option("port", pf_port, "the TCP port inside the sandbox")->required()->check(CLI::Range(1, 65535));

  std::vector<std::string> pause_ids, resume_ids;
  bool pause_memory = false;
  auto* pause = app.add_subcommand("pause", "freeze every process of sandboxes (memory kept, no CPU)");
  pause->add_option("ids", pause_ids, "sandbox ids")->required();
  pause->add_flag("--memory", pause_memory,
                  "free their memory too: a microVM's goes to the node's disk and its QEMU ends (resume restores "
                  "it); a container's is reclaimed");
  auto* resume = app.add_subcommand("resume", "continue paused sandboxes");
  resume->add_option("ids", resume_ids, "sandbox ids")->required();

  std::string cp_src, cp_dst;
  auto* cp = app.add_subcommand("cp",
                                "copy a file into or out of a sandbox: cp ID:/path LOCAL, cp LOCAL ID:/path "
                                "(LOCAL may be - for stdin/stdout). Sandbox paths are absolute and resolve "
                                "inside the sandbox; '..' is refused.");
  cp->add_option("src", cp_src, "ID:/path or a local file")->required();
  cp->add_option("dst", cp_dst, "ID:/path or a local file")->required();
  CopyFlags cp_flags;
  cp->add_option("--user", cp_flags.user,
                 "(into a sandbox) the file, and the parents --parents makes, belong to this user of the sandbox's "
                 "/etc/passwd (name or uid)");
  cp->add_flag("--parents", cp_flags.parents, "(into a sandbox) make the directories the path lacks");
  cp->add_option("--xattr", cp_flags.xattrs,
                 "(into a sandbox) NAME=VALUE: set as the file's user.NAME extended attribute (E2B's file metadata; "
                 "dsecctl fs ls shows them), repeatable");

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
  std::string s_grade_cmd, s_grader_image;
  uint32_t s_grade_timeout = 0;
  std::vector<std::string> s_grade_allow;
  s_open->add_option("--grade", s_grade_cmd,
                     "the grade command (sh -c), which `session grade` runs in a fresh sandbox with the agent's "
                     "changes under --task-root");
  s_open->add_option("--grade-timeout", s_grade_timeout, "seconds the grade may take (default 600)");
  s_open->add_option("--grader-image", s_grader_image, "an image whose files the grade sandbox gets (never the agent)");
  s_open->add_option("--grade-allow", s_grade_allow,
                     "what the grade sandbox may reach (as --allow; default: no network); repeatable");
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
  auto* s_grade = session->add_subcommand(
      "grade", "grade the session as step INDEX (the log's next) in a fresh grade sandbox; prints its output, "
               "and its reward on stderr; exits like dsecctl run");
  s_grade->add_option("name", s_name, "the session (job/prompt/sample)")->required();
  s_grade->add_option("index", s_index, "the step's number: the log's length, or a logged grade's")->required();
  s_grade->add_flag("--json", s_json, "print the step record as JSON");
  auto* s_show = session->add_subcommand("show", "a session's record and its steps, one line each");
  s_show->add_option("name", s_name, "the session (job/prompt/sample)")->required();
  s_show->add_flag("--json", s_json, "the record and every step as JSON");
  auto* s_report = session->add_subcommand(
      "report", "the session's misbehaviour report: every flag its steps raised (task guard, network policy)");
  s_report->add_option("name", s_name, "the session (job/prompt/sample)")->required();
  s_report->add_flag("--json", s_json, "one JSON object per flag: step, what, evidence");
  uint32_t s_fork_count = 0;
  std::vector<std::string> s_fork_names;
  auto* s_fork = session->add_subcommand(
      "fork", "COUNT sessions that go on from the session's current step (its log's first steps and its agent "
              "sandbox's state now); prints their names");
  s_fork->add_option("name", s_name, "the session (job/prompt/sample)")->required();
  s_fork->add_option("count", s_fork_count, "1 to 100")->required();
  s_fork->add_option("--names", s_fork_names, "the new sessions' names, one each (default NAME/fork-I)");
  std::vector<std::string> s_close_names;
  std::string s_close_prefix;
  auto* s_close = session->add_subcommand("close", "close sessions (their sandboxes go; their logs stay)");
  s_close->add_option("names", s_close_names, "the sessions (job/prompt/sample)");
  s_close->add_option("--prefix", s_close_prefix, "every open session whose name starts so, e.g. a job: demo/");

  // Admin commands.
  bool raw = false;
  std::string admin_id;
  SnapshotFlags snap_f;
  AddSnapshotCommands(&app, &snap_f);
  FsFlags fs_f;
  AddFsCommands(&app, &fs_f);
  ExecFlags exec_f;
  AddExecCommands(&app, &exec_f);

  auto* status = app.add_subcommand("status", "node status (admin console)");
  auto* nodes = app.add_subcommand("nodes", "node records (admin console)");
  auto* ls = app.add_subcommand("ls", "sandboxes: a table, filtered (a controller lists every node's)");
  LsFlags ls_f;
  AddLsFlags(ls, &ls_f);
  auto* sessions_cmd =
      app.add_subcommand("sessions", "rollout sessions: a table of state, steps, sandbox (admin console)");
  SessionsFlags sessions_f;
  AddSessionsFlags(sessions_cmd, &sessions_f);
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
  std::string key_verb, key_name;
  auto* e2b_key = app.add_subcommand("e2b-key", "the E2B door's API keys: ls, issue NAME (prints the key once), "
                                                "revoke NAME (admin console; docs/e2b.md)");
  e2b_key->add_option("verb", key_verb, "ls, issue or revoke")
      ->required()
      ->check(CLI::IsMember({"ls", "issue", "revoke"}));
  e2b_key->add_option("name", key_name, "the key's name ([a-z0-9._-]); for issue and revoke");
  for (auto* a : {status, nodes, stats, inspect, kill, drain, undrain, e2b_key})
    a->add_flag("--raw", raw, "print the reply line as is");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0 && ExplainBadCommandLine(&app, argc, argv)) return kUsage;
    int rc = app.exit(e);
    if (rc != 0) HintAfterParseError(e, argc, argv);
    return rc == 0 ? 0 : kUsage;
  }

  if (*status) return Admin(c, "status", raw);
  if (*nodes) return Admin(c, "nodes", raw);
  if (*ls) return ListSandboxes(c, ls_f);
  if (*drain) return Admin(c, "drain " + drain_node, raw);
  if (*undrain) return Admin(c, "undrain " + drain_node, raw);
  if (*sessions_cmd) return ListSessions(c, sessions_f);
  if (*stats) return Admin(c, "stats", raw);
  if (*inspect) return Admin(c, "inspect " + admin_id, raw);
  if (*kill) return Admin(c, "kill " + admin_id, raw);
  if (*e2b_key) {
    if (key_verb != "ls" && key_name.empty()) return Fail("e2b-key " + key_verb + " needs the key's NAME", kUsage);
    return Admin(c, "e2b-key " + key_verb + (key_name.empty() ? "" : " " + key_name), raw);
  }
  if (*snap_f.snapshot || *snap_f.fork) return RunSnapshotCommand(c, snap_f);
  if (*fs_f.fs) return RunFsCommand(c, fs_f);

  int rc = 0;
  if (*run) {
    dsec::v1::SandboxSpec spec;
    dsec::v1::ExecRequest req;
    if (auto e = BuildSpec(run_l, &spec); !e.empty()) return Fail(e, kUsage);
    if (auto e = BuildExec(run_l, run_cmd, &req); !e.empty()) return Fail(e, kUsage);
    if (!no_stdin && !::isatty(0)) {
      std::string in = ReadAllStdin(64u << 20);
      req.set_stdin(std::move(in));
    }
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto r = client->Run(spec, req);
    if (!r.ok()) return Fail(r.status());
    return Report(*r, run_json);
  }
  if (*create) {
    dsec::v1::SandboxSpec spec;
    if (auto e = BuildSpec(create_l, &spec); !e.empty()) return Fail(e, kUsage);
    if (auto e = ApplyLifetime(create_life, &spec); !e.empty()) return Fail(e, kUsage);
    if (!create_snapshot.empty()) {  // its kind and image come with it, unless given
      spec.set_snapshot(create_snapshot);
      if (create->count("--kind") == 0) spec.clear_kind();
    }
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    dsec::CreateOptions co;
    co.id = create_id;
    co.detached = true;  // this process ends now; the sandbox must not
    auto sb = client->Create(spec, co);
    if (!sb.ok()) return Fail(sb.status());
    std::cout << sb->id() << "\n";
    return 0;
  }
  if (*exec_f.exec || *exec_f.ps || *exec_f.usage || *exec_f.signal || *exec_f.attach || *exec_f.watch)
    return RunExecCommand(c, exec_f);
  if (*pause || *resume) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    for (const auto& id : *pause ? pause_ids : resume_ids) {
      auto sb = client->Attach(id);
      dsec::Status st = !sb.ok() ? sb.status() : *pause ? sb->Pause(pause_memory) : sb->Resume();
      if (!st.ok()) rc = Fail(st);
      else std::cout << id << "\n";
    }
    return rc;
  }
  if (*cp) return Copy(c, cp_src, cp_dst, cp_flags);
  if (*timeout) {
    uint32_t secs = 0;
    if (!ParseDuration(timeout_for, &secs) || secs == 0)
      return Fail("'" + timeout_for + "' is not a duration of 1 s or more (e.g. 90, 10m, 2h, 1d)", kUsage);
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto sb = client->Attach(timeout_id);
    auto rec = sb.ok() ? sb->SetTimeout(secs) : dsec::Result<dsec::v1::SandboxRecord>(sb.status());
    if (!rec.ok()) return Fail(rec.status());
    std::printf("%s ends in %u s (%s)\n", timeout_id.c_str(), secs, rec->expires_because().c_str());
    return 0;
  }
  if (*network) {
    if (net_replace == net_add) return Fail("dsecctl network: say --replace or --add", kUsage);
    if (net_add && !net_mode.empty() && net_mode != "allow")
      return Fail("dsecctl network --add takes --allow entries only (--network " + net_mode + " replaces)", kUsage);
    if (net_mode.empty() && net_allow.empty())
      return Fail("dsecctl network: give --network MODE or --allow entries", kUsage);
    dsec::v1::NetworkPolicy p;
    std::string mode = !net_mode.empty() ? net_mode : "allow";
    p.set_mode(mode == "allow" ? dsec::v1::NETWORK_MODE_ALLOW
               : mode == "open" ? dsec::v1::NETWORK_MODE_OPEN
                                : dsec::v1::NETWORK_MODE_NONE);
    for (const auto& a : net_allow) p.add_allow(a);
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto sb = client->Attach(net_id);
    auto rec = sb.ok() ? sb->SetNetwork(p, net_add ? dsec::v1::NETWORK_CHANGE_ADD : dsec::v1::NETWORK_CHANGE_REPLACE)
                       : dsec::Result<dsec::v1::SandboxRecord>(sb.status());
    if (!rec.ok()) return Fail(rec.status());
    const auto& n = rec->spec().network();
    std::string entries;
    for (const auto& a : n.allow()) entries += (entries.empty() ? "" : " ") + a;
    std::printf("%s: network %s%s%s\n", net_id.c_str(),
                n.mode() == dsec::v1::NETWORK_MODE_ALLOW ? "allow" : n.mode() == dsec::v1::NETWORK_MODE_OPEN ? "open" : "none",
                entries.empty() ? "" : ": ", entries.c_str());
    return 0;
  }
  if (*port_forward) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    auto sb = client->Attach(pf_id);
    auto rec = sb.ok() ? sb->Get() : dsec::Result<dsec::v1::SandboxRecord>(sb.status());
    if (!rec.ok()) return Fail(rec.status());
    for (const auto& e : rec->network().exposed())
      if (e.port() == pf_port) {
        std::printf("%s\n", e.address().c_str());
        return 0;
      }
    return Fail("sandbox " + pf_id + ": port " + std::to_string(pf_port) + " is not exposed (create it with --expose " +
                    std::to_string(pf_port) + ")",
                kPlatformError);
  }
  if (*rm) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    for (const auto& id : rm_ids) {
      auto sb = client->Attach(id);
      dsec::Status st = sb.ok() ? sb->Destroy() : sb.status();
      if (!st.ok()) rc = Fail(st);
      else std::cout << id << "\n";
    }
    return rc;
  }
  if (*s_close) return CloseSessions(c, s_close_names, s_close_prefix);
  if (*session) {
    auto client = ConnectOrDie(c, &rc);
    if (!client) return rc;
    if (*s_open) {
      dsec::v1::SandboxSpec spec;
      if (auto e = BuildSpec(s_l, &spec); !e.empty()) return Fail(e, kUsage);
      dsec::SessionOptions options;
      options.lease_s = s_lease;
      if (!s_grade_cmd.empty()) {
        for (const char* a : {"/bin/sh", "-c"}) options.grade.add_command(a);
        options.grade.add_command(s_grade_cmd);
        options.grade.set_timeout_s(s_grade_timeout);
        options.grade.set_grader_image(s_grader_image);
        if (!s_grade_allow.empty()) options.grade.mutable_network()->set_mode(dsec::v1::NETWORK_MODE_ALLOW);
        for (const auto& a : s_grade_allow) options.grade.mutable_network()->add_allow(a);
      } else if (s_grade_timeout || !s_grader_image.empty() || !s_grade_allow.empty()) {
        return Fail("--grade-timeout, --grader-image and --grade-allow go with --grade (the grade command)", kUsage);
      }
      auto s = client->OpenSession(s_name, spec, options);
      if (!s.ok()) return Fail(s.status());
      std::cout << ToJson(s->record());
      return 0;
    }
    auto session = client->AttachSession(s_name);
    if (!session.ok()) return Fail(session.status());
    if (*s_step) {
      dsec::v1::ExecRequest req;
      if (auto e = ApplyLimits(s_step_l, req.mutable_limits()); !e.empty()) return Fail(e, kUsage);
      if (auto e = BuildExec(s_step_l, s_cmd, &req); !e.empty()) return Fail(e, kUsage);
      if (!::isatty(0)) req.set_stdin(ReadAllStdin(64u << 20));
      dsec::StepOptions options;
      options.sandbox = s_role;
      if (*reward_opt) options.meta.set_reward(s_reward);
      auto r = session->Step(s_index, req, options);
      if (!r.ok()) return Fail(r.status());
      if (r->fast_forwarded())
        std::fprintf(stderr, "dsecctl: step %llu answered from the log (not run again)\n",
                     static_cast<unsigned long long>(s_index));
      for (const auto& f : r->step().flags())
        std::fprintf(stderr, "dsecctl: step %llu flagged: %s: %s\n", static_cast<unsigned long long>(s_index),
                     f.what().c_str(), f.evidence().c_str());
      if (!s_json) return Report(r->step().result(), false);
      std::cout << ToJson(r->step());
      return ExitCode(r->step().result(), [](const std::string&) {});
    }
    if (*s_grade) {
      auto r = dsec::Grade(*session, s_index);
      if (!r.ok()) return Fail(r.status());
      const auto& meta = r->step().meta();
      auto note = meta.notes().find("grade");
      std::fprintf(stderr, "dsecctl: step %llu%s: reward %g (%s)\n", static_cast<unsigned long long>(s_index),
                   r->fast_forwarded() ? ", graded before (from the log)" : " graded", meta.reward(),
                   note == meta.notes().end() ? "" : note->second.c_str());
      if (!s_json) return Report(r->step().result(), false);
      std::cout << ToJson(r->step());
      return ExitCode(r->step().result(), [](const std::string&) {});
    }
    if (*s_fork) {
      auto forks = dsec::ForkSession(*client, *session, s_fork_count, s_fork_names);
      if (!forks.ok()) return Fail(forks.status());
      for (const auto& f : *forks) std::cout << f.name() << "\n";
      return 0;
    }
    if (*s_show) return ShowSession(*session, s_json);
    if (*s_report) return ReportSession(*session, s_json);
  }
  return 0;
}
