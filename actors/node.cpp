#include "actors/node.hpp"

#include "actors/node_state.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

template <class Reply>
Reply ErrorReply(const Status& st) {
  Reply r;
  ToProto(st, r.mutable_status());
  return r;
}

Status CheckSessionName(const std::string& name) {
  if (name.empty()) return Status::InvalidArgument("session name is empty (use job/prompt/sample)");
  if (name.size() > 512)
    return Status::InvalidArgument("session name is " + std::to_string(name.size()) +
                                   " bytes; the limit is 512");
  for (unsigned char c : name)
    if (c < 0x20 || c > 0x7e)
      return Status::InvalidArgument("session name may hold printable ASCII only");
  return Status::Ok();
}

void Watch(NodeSelf self, const std::string& id, const sandbox_actor& a) {
  self->state.sandboxes[id] = a;
  self->state.sandbox_of[a.address()] = id;
}

// Run by a sandbox actor right before it answers its destroy: the node
// forgets it first (its mailbox has this before any request a client sends
// after the reply), so later requests get NotFound, not a quitting actor.
std::function<void()> Gone(NodeSelf self, const std::string& id) {
  auto handle = caf::actor_cast<node_actor>(self);
  return [handle, self, id] {
    Post(handle, [self, id] {
      auto& st = self->state;
      auto it = st.sandboxes.find(id);
      if (it == st.sandboxes.end()) return;
      st.sandbox_of.erase(it->second.address());
      st.sandboxes.erase(it);
      st.intensity->Forget("sb/" + id);
    });
  };
}

sandbox_actor Spawn(NodeSelf self, const v1::SandboxRecord& rec) {
  return SpawnSandbox(self, self->state.ctx, rec, Gone(self, rec.id()));
}

void Watch(NodeSelf self, const std::string& name, const session_actor& a) {
  self->state.sessions[name] = a;
  self->state.session_of[a.address()] = name;
}

// Rebuilds sandbox and session actors from the store (daemon start).
void Restore(NodeSelf self) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  size_t sandboxes = 0, sessions = 0, dropped = 0;
  state::WriteBatch cleanup;
  // One corrupt row must not keep the others from coming back: log it, skip it.
  size_t corrupt = 0;
  auto s1 = ctx.store->Scan(state::Table::kSandboxes, "", [&](const std::string& key, const std::string& raw) {
    v1::SandboxRecord rec;
    if (!rec.ParseFromString(raw)) {
      ctx.log->error("restore: sandboxes row '{}' is not a SandboxRecord; skipped", key);
      ++corrupt;
      return true;
    }
    if (rec.phase() == v1::SANDBOX_PHASE_STOPPED || rec.phase() == v1::SANDBOX_PHASE_STOPPING) {
      cleanup.Delete(state::Table::kSandboxes, key);
      ++dropped;
      return true;
    }
    if (rec.phase() == v1::SANDBOX_PHASE_RUNNING || rec.phase() == v1::SANDBOX_PHASE_PAUSED) {
      auto d = ctx.DriverFor(rec.spec());
      Status re = d.ok() ? (*d)->Readopt(rec) : d.status();
      if (!re.ok()) {
        rec.set_phase(v1::SANDBOX_PHASE_FAILED);
        rec.set_error("not re-adopted after restart: " + re.message());
        state::TypedTable<v1::SandboxRecord>(ctx.store, state::Table::kSandboxes).Put(&cleanup, key, rec);
      }
    }
    Watch(self, rec.id(), Spawn(self, rec));
    ++sandboxes;
    return true;
  });
  auto s2 = ctx.store->Scan(state::Table::kSessions, "", [&](const std::string& key, const std::string& raw) {
    v1::SessionRecord rec;
    if (!rec.ParseFromString(raw)) {
      ctx.log->error("restore: sessions row '{}' is not a SessionRecord; skipped", key);
      ++corrupt;
      return true;
    }
    Watch(self, rec.name(), SpawnSession(self, st.ctx, rec));
    ++sessions;
    return true;
  });
  // Only with every record seen may a driver drop what no record claims.
  if (s1.ok())
    for (auto* d : ctx.Drivers()) d->Restored();
  if (!s1.ok()) ctx.log->error("restore sandboxes: {}", s1.message());
  if (!s2.ok()) ctx.log->error("restore sessions: {}", s2.message());
  if (!cleanup.empty()) {
    Status w = ctx.committer->WriteSync(std::move(cleanup));
    if (!w.ok()) ctx.log->error("restore: cleanup write: {}", w.message());
  }
  ctx.log->info("restored {} sandbox(es) and {} session(s) from {}{}{}", sandboxes, sessions,
                ctx.store->Describe(),
                dropped ? " (" + std::to_string(dropped) + " stopped sandbox row(s) removed)" : "",
                corrupt ? " (" + std::to_string(corrupt) + " corrupt row(s) skipped)" : "");
}

// Supervision: a child that ended abnormally is restarted from its
// checkpoint, unless it failed too often (restart intensity).
void OnDown(NodeSelf self, caf::down_msg& dm) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  bool normal = !dm.reason || dm.reason == caf::exit_reason::user_shutdown;
  std::string why = self->system().render(dm.reason);
  if (auto it = st.sandbox_of.find(dm.source); it != st.sandbox_of.end()) {
    std::string id = it->second;
    st.sandbox_of.erase(it);
    st.sandboxes.erase(id);
    if (normal) {
      st.intensity->Forget("sb/" + id);
      return;
    }
    auto rec = state::TypedTable<v1::SandboxRecord>(ctx.store, state::Table::kSandboxes).Get(id);
    if (!rec.ok()) {
      ctx.log->error("sandbox {} died ({}) and has no checkpoint: {}", id, why, rec.status().message());
      return;
    }
    if (!st.intensity->Allow("sb/" + id)) {
      ++st.counters.gave_up;
      rec->set_phase(v1::SANDBOX_PHASE_FAILED);
      rec->set_error("crashed " + std::to_string(ctx.options.max_restarts + 1) + " times within " +
                     std::to_string(ctx.options.restart_window_s) + " s; last: " + why);
      state::WriteBatch b;
      state::TypedTable<v1::SandboxRecord>(ctx.store, state::Table::kSandboxes).Put(&b, id, *rec);
      ctx.committer->Submit(std::move(b), [](const Status&) {});
      ctx.log->error("sandbox {}: {}; left failed", id, rec->error());
      Watch(self, id, Spawn(self, *rec));  // still answers get/destroy
      return;
    }
    ++st.counters.restarts;
    rec->set_restarts(rec->restarts() + 1);
    ctx.log->warn("sandbox {} crashed ({}); restarted from its checkpoint (restart {} in the window)", id,
                  why, st.intensity->Recent("sb/" + id));
    Watch(self, id, Spawn(self, *rec));
    return;
  }
  if (auto it = st.session_of.find(dm.source); it != st.session_of.end()) {
    std::string name = it->second;
    st.session_of.erase(it);
    st.sessions.erase(name);
    if (normal) {
      st.intensity->Forget("se/" + name);
      return;
    }
    auto rec = state::TypedTable<v1::SessionRecord>(ctx.store, state::Table::kSessions).Get(name);
    if (!rec.ok()) {
      ctx.log->warn("session {} died ({}) before it was durable; dropped", name, why);
      return;
    }
    if (!st.intensity->Allow("se/" + name)) {
      ++st.counters.gave_up;
      rec->set_phase(v1::SESSION_PHASE_FAILED);
      state::WriteBatch b;
      state::TypedTable<v1::SessionRecord>(ctx.store, state::Table::kSessions).Put(&b, name, *rec);
      ctx.committer->Submit(std::move(b), [](const Status&) {});
      ctx.log->error("session {} crashed too often (last: {}); left failed", name, why);
      Watch(self, name, SpawnSession(self, st.ctx, *rec));
      return;
    }
    ++st.counters.restarts;
    rec->set_restarts(rec->restarts() + 1);
    ctx.log->warn("session {} crashed ({}); restarted from its log ({} steps)", name, why, rec->step_count());
    Watch(self, name, SpawnSession(self, st.ctx, *rec));
  }
}

// A request for one sandbox goes to its actor, which answers the sender.
template <class Reply, class Request>
caf::result<Reply> ToSandbox(NodeSelf self, Request& req) {
  auto it = self->state.sandboxes.find(req.sandbox_id());
  if (it == self->state.sandboxes.end())
    return ErrorReply<Reply>(
        Status::NotFound("sandbox '" + req.sandbox_id() + "' not found on this node (dsecctl ls lists sandboxes)"));
  return self->delegate(it->second, std::move(req));
}

caf::result<v1::RunReply> HandleRun(NodeSelf self, v1::RunRequest& req) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  auto reject = [&](const Status& s) {
    ++st.counters.rejected;
    return ErrorReply<v1::RunReply>(s);
  };
  auto d = ctx.DriverFor(req.spec());
  if (!d.ok()) return reject(d.status());
  Status s = drivers::CheckSpec(ctx.options.limits, req.spec());
  if (s.ok() && (*d)->kind() != v1::KIND_FNCALL)
    s = Status::InvalidArgument(std::string("one-shot runs are fncall only; for a ") + (*d)->name() +
                                " create a sandbox (dsecctl create) and exec in it");
  if (s.ok()) s = (*d)->CanHandle(req.spec());
  if (s.ok()) s = drivers::CheckExecRequest(ctx.options.limits, req.exec());
  if (!s.ok()) return reject(s);
  auto limits = drivers::EffectiveLimits(ctx.options.limits, req.spec(), req.exec());
  if (!limits.ok()) return reject(limits.status());
  if (st.runs.size() >= ctx.options.max_inflight_runs)
    return reject(Status::ResourceExhausted("node has " + std::to_string(st.runs.size()) +
                                            " runs in flight (the limit); retry later"));
  std::string id = "run-" + std::to_string(ctx.options.boot) + "-" + std::to_string(++st.next_run);
  st.runs[id] = RunInfo{req.exec().argv(0), NowMs()};
  v1::ExecRequest exec = std::move(*req.mutable_exec());
  *exec.mutable_limits() = *limits;
  v1::SandboxRecord sandbox;
  *sandbox.mutable_spec() = std::move(*req.mutable_spec());
  auto rp = self->make_response_promise<v1::RunReply>();
  auto handle = caf::actor_cast<node_actor>(self);
  (*d)->Exec(sandbox, id, exec, [handle, self, rp, id](Result<v1::ExecResult> r) mutable {
    Post(handle, [self, rp, id, r = std::move(r)]() mutable {
      auto& st = self->state;
      st.runs.erase(id);
      ++st.counters.runs;
      v1::RunReply reply;
      if (r.ok()) {
        if (r->verdict() == v1::VERDICT_OK) ++st.counters.runs_ok;
        if (r->verdict() == v1::VERDICT_PLATFORM_ERROR) ++st.counters.runs_platform_error;
        *reply.mutable_result() = std::move(*r);
      } else {
        ++st.counters.runs_platform_error;
        ToProto(r.status(), reply.mutable_status());
      }
      rp.deliver(std::move(reply));
    });
  });
  return rp;
}

node_actor::behavior_type NodeActor(NodeSelf self, std::shared_ptr<NodeContext> ctx) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.started_ms = NowMs();
  st.intensity = std::make_unique<RestartIntensity>(
      st.ctx->options.max_restarts, std::chrono::seconds(st.ctx->options.restart_window_s));
  self->set_down_handler([self](caf::down_msg& dm) { OnDown(self, dm); });
  // Children follow the node down on shutdown.
  self->set_exit_handler([self](caf::exit_msg& em) {
    for (auto& [id, a] : self->state.sandboxes) self->send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& [n, a] : self->state.sessions) self->send_exit(a, caf::exit_reason::user_shutdown);
    if (self->state.images) self->send_exit(self->state.images, caf::exit_reason::user_shutdown);
    self->quit(em.reason);
  });
  Restore(self);
  st.images = SpawnImageWorker(self, st.ctx);
  return {
      [self](v1::RunRequest& req) -> caf::result<v1::RunReply> { return HandleRun(self, req); },
      [self](v1::CreateRequest& req) -> caf::result<v1::SandboxReply> {
        auto& st = self->state;
        auto d = st.ctx->DriverFor(req.spec());
        Status s = d.ok() ? drivers::CheckSpec(st.ctx->options.limits, req.spec()) : d.status();
        if (s.ok()) s = (*d)->CanHandle(req.spec());
        if (!s.ok()) {
          ++st.counters.rejected;
          return ErrorReply<v1::SandboxReply>(s);
        }
        v1::SandboxRecord rec;
        rec.set_id("sb-" + RandomHex(12));
        *rec.mutable_spec() = req.spec();
        if (rec.spec().kind() == v1::KIND_UNSPECIFIED || rec.spec().kind() == v1::KIND_AUTO)
          rec.mutable_spec()->set_kind((*d)->kind());
        rec.set_phase(v1::SANDBOX_PHASE_PENDING);
        rec.set_node_id(st.ctx->options.node_id);
        rec.set_created_ms(NowMs());
        auto child = Spawn(self, rec);
        Watch(self, rec.id(), child);
        return self->delegate(child, std::move(req));
      },
      [self](v1::ExecRequest& req) { return ToSandbox<v1::ExecReply>(self, req); },
      [self](v1::DestroyRequest& req) { return ToSandbox<v1::SandboxReply>(self, req); },
      [self](v1::GetSandboxRequest& req) { return ToSandbox<v1::SandboxReply>(self, req); },
      [self](v1::PauseRequest& req) { return ToSandbox<v1::SandboxReply>(self, req); },
      [self](v1::ResumeRequest& req) { return ToSandbox<v1::SandboxReply>(self, req); },
      [self](v1::ReadFileRequest& req) { return ToSandbox<v1::FileReply>(self, req); },
      [self](v1::WriteFileRequest& req) { return ToSandbox<v1::FileReply>(self, req); },
      [self](v1::ListFilesRequest& req) { return ToSandbox<v1::FileReply>(self, req); },
      [self](v1::OpenSessionRequest& req) -> caf::result<v1::SessionReply> {
        auto& st = self->state;
        Status s = CheckSessionName(req.name());
        if (s.ok()) s = drivers::CheckSpec(st.ctx->options.limits, req.spec());
        if (!s.ok()) return ErrorReply<v1::SessionReply>(s);
        auto it = st.sessions.find(req.name());
        if (it != st.sessions.end()) return self->delegate(it->second, std::move(req));
        v1::SessionRecord rec;
        rec.set_name(req.name());
        auto child = SpawnSession(self, st.ctx, rec);
        Watch(self, req.name(), child);
        return self->delegate(child, std::move(req));
      },
      [self](v1::StepRequest& req) -> caf::result<v1::StepReply> {
        auto it = self->state.sessions.find(req.session());
        if (it == self->state.sessions.end())
          return ErrorReply<v1::StepReply>(
              Status::NotFound("session '" + req.session() + "' not found; open it first"));
        return self->delegate(it->second, std::move(req));
      },
      [self](v1::CloseSessionRequest& req) -> caf::result<v1::SessionReply> {
        auto it = self->state.sessions.find(req.name());
        if (it == self->state.sessions.end())
          return ErrorReply<v1::SessionReply>(Status::NotFound("session '" + req.name() + "' not found"));
        return self->delegate(it->second, std::move(req));
      },
      [self](v1::GetSessionRequest& req) -> caf::result<v1::SessionReply> {
        auto it = self->state.sessions.find(req.name());
        if (it == self->state.sessions.end())
          return ErrorReply<v1::SessionReply>(Status::NotFound("session '" + req.name() + "' not found"));
        return self->delegate(it->second, std::move(req));
      },
      [self](v1::RegisterImageRequest& req) -> caf::result<v1::ImageReply> {
        return self->delegate(self->state.images, std::move(req));
      },
      [self](v1::GetImageRequest& req) -> caf::result<v1::ImageReply> {
        return self->delegate(self->state.images, std::move(req));
      },
      [self](v1::ListImagesRequest& req) -> caf::result<v1::ImagesReply> {
        return self->delegate(self->state.images, std::move(req));
      },
      [self](v1::RemoveImageRequest& req) -> caf::result<v1::ImageReply> {
        return self->delegate(self->state.images, std::move(req));
      },
      [self](admin_atom, const std::string& cmd, const std::vector<std::string>& args)
          -> caf::result<std::string> { return HandleAdmin(self, cmd, args); },
      [self](Continuation& c) { c.fn(); },
  };
}

}  // namespace

node_actor SpawnNode(caf::actor_system& sys, std::shared_ptr<NodeContext> ctx) {
  return sys.spawn(NodeActor, std::move(ctx));
}

}  // namespace dsec
