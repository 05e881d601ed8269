#include "drivers/agent/agent_driver.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <map>

#include "drivers/agent/agent.pb.h"
#include "drivers/verdict.hpp"
#include "runtime/clock.hpp"

namespace dsec::drivers {

namespace {


// The agent's account of an exec (fields 1-14 of run::Outcome) with what
// only the host knows added: OOM kills (the container's memory cgroup), a
// kill on request, and the CPU-time limit (RLIMIT_CPU: SIGXCPU at the soft
// limit, SIGKILL at the hard one). Fields 15 and up from the agent itself
// are not trusted: a program in the sandbox cannot make its run a
// platform error. Then every kind's verdict is the same (ToExecResult).
run::Outcome Completed(run::Outcome o, const v1::Limits& lim, bool oom, const std::string& killed) {
  bool exited = o.exited();
  int sig = o.signal();
  o.set_oom_killed(oom && !exited);
  o.set_killed(!killed.empty());
  o.set_kill_reason(killed);
  o.set_platform_error("");
  o.set_cpu_time_exceeded(lim.cpu_time_ms() && !exited &&
                          (sig == SIGXCPU || (sig == SIGKILL && o.cpu_us() / 1000 >= lim.cpu_time_ms())));
  return o;
}

v1::FileInfo ToInfo(const agent::FileInfo& a) {
  v1::FileInfo f;
  f.set_name(a.name());
  f.set_mode(a.mode());
  f.set_size(a.size());
  f.set_mtime_ms(a.mtime_ms());
  f.set_link_target(a.link_target());
  f.set_uid(a.uid());
  f.set_gid(a.gid());
  f.set_owner(a.owner());
  f.set_group(a.group());
  f.mutable_xattrs()->insert(a.xattrs().begin(), a.xattrs().end());
  return f;
}

}  // namespace

Status AgentDriver::ConnectAgent(AgentBox& box, const std::string& socket, int timeout_ms,
                                 std::function<void(const std::string&)> log, bool vm_channel) const {
  AgentClientOptions ao;
  ao.name = std::string(name()) + " " + box.id;
  ao.log = std::move(log);
  auto c = vm_channel ? AgentClient::ConnectChannel(socket, timeout_ms, ao) : AgentClient::Connect(socket, ao);
  if (!c.ok()) return c.status();
  auto pong = (*c)->PingSync(std::chrono::milliseconds(timeout_ms));
  if (!pong.ok()) return pong.status().Annotate(ao.name + ": the agent does not answer");
  box.agent = std::move(*c);
  return Status::Ok();
}

size_t AgentDriver::RunsInFlight() const {
  std::lock_guard<std::mutex> lk(runs_mu_);
  return runs_.size();
}

void AgentDriver::Exec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                       ExecCallback done) {
  StartExec(sb, run_id, req, nullptr, std::move(done));
}

void AgentDriver::ExecStreaming(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                                OutputCallback on_output, ExecCallback done) {
  StartExec(sb, run_id, req, std::move(on_output), std::move(done));
}

void AgentDriver::StartExec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                            OutputCallback on_output, ExecCallback done) {
  auto running = RunningBox(sb.id());
  if (!running.ok()) {
    done(running.status());
    return;
  }
  auto box = *running;
  agent::Exec e;
  for (const auto& a : req.argv()) e.add_argv(a);
  std::map<std::string, std::string> env = {{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
                                            {"LANG", "C.UTF-8"},
                                            {"TMPDIR", "/tmp"}};
  if (req.user().empty()) env["HOME"] = "/root";  // a user's HOME: the agent's, from its passwd entry
  for (const auto& [k, v] : sb.spec().env()) env[k] = v;
  for (const auto& [k, v] : req.env()) env[k] = v;
  for (const auto& [k, v] : env) e.add_env(k + "=" + v);
  // A user's exec without cwd starts in its home (the agent finds it).
  e.set_cwd(!req.cwd().empty()          ? req.cwd()
            : !req.user().empty()        ? ""
            : !sb.spec().workdir().empty() ? sb.spec().workdir()
                                           : "/work");
  e.set_user(req.user());
  e.set_interactive(req.interactive());
  e.set_attach_pid(static_cast<int32_t>(req.attach_pid()));
  if (req.has_pty()) {
    e.mutable_pty()->set_cols(req.pty().cols());
    e.mutable_pty()->set_rows(req.pty().rows());
  }
  e.set_stdin(req.stdin());
  e.set_stream(on_output != nullptr);
  e.set_key(req.idempotency_key());
  const v1::Limits& lim = req.limits();
  e.mutable_limits()->set_timeout_ms(lim.timeout_ms());
  e.mutable_limits()->set_output_bytes(lim.output_bytes());
  e.mutable_limits()->set_cpu_time_ms(lim.cpu_time_ms());
  e.mutable_limits()->set_file_size_bytes(lim.file_size_bytes());
  e.mutable_limits()->set_open_files(lim.open_files());
  uint64_t oom0 = box->OomKills();
  std::string argv0 = req.argv_size() ? req.argv(0) : "";
  v1::Limits merged = lim;
  merged.set_memory_bytes(box->limits.memory_bytes());
  {
    // Registered before the agent can answer, so the answer always finds it.
    std::lock_guard<std::mutex> lk(runs_mu_);
    runs_[run_id] = RunRef{sb.id(), 0, {}};
  }
  AgentClient::OutputCallback piece;
  if (on_output)
    piece = [on_output](const agent::Output& o) {
      v1::ExecOutput out;
      if (o.stream() == 0) out.set_pid(static_cast<uint32_t>(o.pid()));
      else if (o.stream() == 3) out.set_pty(o.data());
      else if (o.stream() == 2) out.set_stderr(o.data());
      else out.set_stdout(o.data());
      on_output(out);
    };
  {
    std::lock_guard<std::mutex> lk(box->idle_mu);
    ++box->active;
  }
  uint64_t exec_id =
      box->agent->Exec(e, std::move(piece), [this, box, oom0, merged, argv0, run_id, done](Result<run::Outcome> r) {
        {
          std::lock_guard<std::mutex> lk(box->idle_mu);
          --box->active;
          box->last_active_ms = SteadyClockMs();
        }
        std::string kill_reason;
        {
          std::lock_guard<std::mutex> lk(runs_mu_);
          if (auto it = runs_.find(run_id); it != runs_.end()) {
            kill_reason = it->second.kill_reason;
            runs_.erase(it);
          }
        }
        if (!r.ok()) {
          done(r.status().Annotate(std::string(name()) + " " + box->id));
          return;
        }
        bool oom = box->OomKills() > oom0 || (box->TrustsAgentOom() && r.ok() && r->oom_killed());
        auto res = ToExecResult(Completed(std::move(*r), merged, oom, kill_reason), merged, argv0);
        res.set_run_id(run_id);
        done(std::move(res));
      });
  bool kill_now = false;
  {
    std::lock_guard<std::mutex> lk(runs_mu_);
    if (auto it = runs_.find(run_id); it != runs_.end()) {
      it->second.exec_id = exec_id;
      kill_now = !it->second.kill_reason.empty();  // Kill came before we knew the agent's id
    }
  }
  if (kill_now && exec_id) box->agent->Signal(exec_id, SIGKILL, [](const Status&) {});
}

Status AgentDriver::CheckExecLimits(const v1::SandboxRecord& sb, const v1::Limits& asked) const {
  return CheckSandboxWideLimits(name(), sb, asked);
}

Status AgentDriver::Kill(const std::string& run_id, const std::string& reason) {
  std::string id;
  uint64_t exec_id;
  {
    std::lock_guard<std::mutex> lk(runs_mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return Status::NotFound("run " + run_id + " is not in flight");
    it->second.kill_reason = reason.empty() ? "killed" : reason;
    id = it->second.sandbox;
    exec_id = it->second.exec_id;
  }
  if (!exec_id) return Status::Ok();  // StartExec signals it once the agent has it
  auto box = FindBox(id);
  if (!box || !box->agent) return Status::NotFound(std::string(name()) + " " + id + " is gone");
  box->agent->Signal(exec_id, SIGKILL, [](const Status&) {});
  return Status::Ok();
}

void AgentDriver::ReadFile(const v1::SandboxRecord& sb, const v1::ReadFileRequest& req, FileCallback done) {
  auto box = RunningBox(sb.id());
  if (!box.ok()) return done(box.status());
  (*box)->agent->ReadFile(req.path(), req.max_bytes(), [done](Result<std::string> r) {
    if (!r.ok()) return done(r.status());
    v1::FileReply reply;
    reply.set_content(std::move(*r));
    done(std::move(reply));
  });
}

void AgentDriver::WriteFile(const v1::SandboxRecord& sb, const v1::WriteFileRequest& req, FileCallback done) {
  auto box = RunningBox(sb.id());
  if (!box.ok()) return done(box.status());
  agent::WriteFile w;
  w.set_path(req.path());
  w.set_data(req.content());
  w.set_mode(req.mode() ? req.mode() : 0644);
  w.set_mkdirs(req.make_parents());
  w.set_user(req.user());
  w.mutable_xattrs()->insert(req.xattrs().begin(), req.xattrs().end());
  w.set_xattrs_replace(req.xattrs_replace());
  (*box)->agent->WriteFile(w, [done](const Status& st) {
    if (!st.ok()) return done(st);
    done(v1::FileReply());
  });
}

void AgentDriver::ListFiles(const v1::SandboxRecord& sb, const v1::ListFilesRequest& req, FileCallback done) {
  auto running = RunningBox(sb.id());
  if (!running.ok()) return done(running.status());
  auto box = *running;
  const std::string& path = req.path();
  // The path itself first; a directory's entries next.
  box->agent->Stat(path, [box, path, done](Result<agent::FileInfo> st) {
    if (!st.ok()) return done(st.status());
    v1::FileReply reply;
    *reply.mutable_info() = ToInfo(*st);
    if (!S_ISDIR(st->mode())) return done(std::move(reply));
    box->agent->ListDir(path, [reply, done](Result<std::vector<agent::FileInfo>> entries) mutable {
      if (!entries.ok()) return done(entries.status());
      for (const auto& e : *entries) *reply.add_entries() = ToInfo(e);
      done(std::move(reply));
    });
  });
}

void AgentDriver::PathOp(const v1::SandboxRecord& sb, const v1::PathOpRequest& req, FileCallback done) {
  auto box = RunningBox(sb.id());
  if (!box.ok()) return done(box.status());
  agent::PathOp op;
  op.set_op(static_cast<uint32_t>(req.op()));
  op.set_path(req.path());
  op.set_destination(req.destination());
  op.set_user(req.user());
  (*box)->agent->PathOp(op, [done](Result<agent::FileInfo> r) {
    if (!r.ok()) return done(r.status());
    v1::FileReply reply;
    if (!r->name().empty()) *reply.mutable_info() = ToInfo(*r);
    done(std::move(reply));
  });
}

void AgentDriver::Process(const v1::SandboxRecord& sb, const v1::ProcessRequest& req, ProcessCallback done) {
  auto box = RunningBox(sb.id());
  if (!box.ok()) return done(box.status());
  agent::Proc p;
  p.set_op(static_cast<uint32_t>(req.op()));
  p.set_pid(static_cast<int32_t>(req.pid()));
  p.set_signal(req.signal());
  p.set_input(req.input());
  p.mutable_size()->set_cols(req.size().cols());
  p.mutable_size()->set_rows(req.size().rows());
  (*box)->agent->Proc(p, [done](Result<agent::ProcList> r) {
    if (!r.ok()) return done(r.status());
    v1::ProcessReply reply;
    for (const auto& a : r->procs()) {
      auto* p = reply.add_processes();
      p->set_pid(static_cast<uint32_t>(a.pid()));
      p->mutable_argv()->CopyFrom(a.argv());
      p->set_cwd(a.cwd());
      p->set_uid(a.uid());
      p->set_running_ms(a.running_ms());
      p->set_stdin_open(a.stdin_open());
    }
    done(std::move(reply));
  });
}

std::function<void()> AgentDriver::Watch(const v1::SandboxRecord& sb, const v1::WatchRequest& req,
                                         OutputCallback on_events, StatusCallback done) {
  auto running = RunningBox(sb.id());
  if (!running.ok()) {
    done(running.status());
    return nullptr;
  }
  auto box = *running;
  agent::Watch w;
  w.set_path(req.path());
  w.set_recursive(req.recursive());
  AgentClient* client = box->agent.get();
  uint64_t id = client->Watch(
      w,
      [on_events](const agent::FsEvents& fs) {
        v1::ExecOutput piece;
        piece.set_watching(fs.watching());
        for (const auto& e : fs.events()) {
          auto* out = piece.add_events();
          out->set_name(e.name());
          out->set_type(static_cast<v1::FsEventType>(e.type()));
        }
        on_events(piece);
      },
      [done, id = box->id, kind = std::string(name())](const Status& s) { done(s.Annotate(kind + " " + id)); });
  if (!id) return nullptr;
  // The same connection only (another's ids name other requests), its box
  // woken first (a frozen agent would not answer).
  return [this, sandbox = sb.id(), client, id] {
    auto b = RunningBox(sandbox);
    if (b.ok() && (*b)->agent.get() == client) client->Signal(id, 0, [](const Status&) {});
  };
}

void AgentDriver::Usage(const v1::SandboxRecord& sb, UsageCallback done) {
  auto running = RunningBox(sb.id());
  if (!running.ok()) return done(running.status());
  auto box = *running;
  box->agent->Ping(
      [done, box, kind = std::string(name())](Result<agent::Pong> p) {
        if (!p.ok()) return done(p.status().Annotate(kind + " " + box->id + ": usage"));
        if (!p->cpu_count())  // an agent older than Ping.usage (a guest restored from an older snapshot)
          return done(Status::Unimplemented(kind + " " + box->id + ": its agent (" + p->version() +
                                            ") does not say what the sandbox uses"));
        v1::SandboxUsage u;
        u.set_cpu_count(p->cpu_count());
        u.set_cpu_ns(p->cpu_ns());
        u.set_mem_total_bytes(p->mem_total());
        u.set_mem_cache_bytes(p->mem_cache());
        uint64_t taken = p->mem_total() > p->mem_available() ? p->mem_total() - p->mem_available() : 0;
        u.set_mem_used_bytes(taken);
        done(std::move(u));
      },
      /*usage=*/true);
}

}  // namespace dsec::drivers
