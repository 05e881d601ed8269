#include "actors/node/node_host.hpp"

#include "actors/error_reply.hpp"
#include "dsec/status_proto.hpp"
#include "state/table.hpp"

namespace dsec {

Status WriteNodeRecord(const NodeContext& ctx) {
  cluster::v1::NodeRecord nr;
  nr.set_id(ctx.options.node_id);
  nr.set_sdk_address(ctx.options.sdk_address);
  nr.set_admin_address(ctx.options.admin_address);
  nr.set_boot_count(ctx.options.boot);
  nr.set_started_ms(WallClockMs());
  nr.set_version(DSEC_VERSION);
  std::vector<std::string> available, unavailable;
  ctx.kinds->Kinds(&available, &unavailable);
  for (auto& k : available) nr.add_kinds(k);
  for (auto& u : unavailable) nr.add_unavailable(u);
  state::WriteBatch b;
  state::TypedTable<cluster::v1::NodeRecord>(ctx.store, state::Table::kNodes).Put(&b, ctx.options.node_id, nr);
  return ctx.committer->WriteSync(std::move(b));
}

NodeHost::NodeHost(std::shared_ptr<NodeContext> ctx, PostFn post)
    : ctx_(std::move(ctx)), post_(std::move(post)), started_ms_(WallClockMs()) {}

Result<drivers::Driver*> NodeHost::Admit(const v1::SandboxSpec& spec) {
  auto d = ctx_->kinds->DriverFor(spec);
  Status s = d.ok() ? drivers::Admissible(ctx_->options.limits, **d, spec) : d.status();
  if (!s.ok()) {
    ++counters_.rejected;
    return s;
  }
  return *d;
}

void NodeHost::Run(v1::RunRequest& req, std::function<void(v1::RunReply)> done) {
  auto& ctx = *ctx_;
  auto reject = [&](const Status& s) {
    ++counters_.rejected;
    done(ErrorReply<v1::RunReply>(s));
  };
  auto d = ctx.kinds->DriverFor(req.spec());
  if (!d.ok()) return reject(d.status());
  Status s = Status::Ok();
  if ((*d)->traits().stateful)
    s = Status::InvalidArgument(std::string("one-shot runs are for kinds without state (fncall); for a ") +
                                (*d)->name() + " create a sandbox (dsecctl create) and exec in it");
  if (s.ok()) s = drivers::Admissible(ctx.options.limits, **d, req.spec());
  if (s.ok()) s = drivers::CheckExecRequest(ctx.options.limits, req.exec());
  if (s.ok() && !req.exec().idempotency_key().empty())
    s = Status::InvalidArgument("an idempotency_key needs a sandbox with state; a one-shot run is always fresh");
  if (!s.ok()) return reject(s);
  auto limits = drivers::EffectiveLimits(ctx.options.limits, (*d)->traits(), req.spec(), req.exec());
  if (!limits.ok()) return reject(limits.status());
  if (runs_.size() >= ctx.options.max_inflight_runs)
    return reject(Status::ResourceExhausted("node has " + std::to_string(runs_.size()) +
                                            " runs in flight (the limit); retry later"));
  std::string id = "run-" + std::to_string(ctx.options.boot) + "-" + std::to_string(++next_run_);
  runs_[id] = RunInfo{req.exec().argv(0), WallClockMs(), *d};
  v1::ExecRequest exec = std::move(*req.mutable_exec());
  *exec.mutable_limits() = *limits;
  v1::SandboxRecord sandbox;
  *sandbox.mutable_spec() = std::move(*req.mutable_spec());
  // On the driver's thread only the post function (a copy) is touched: the
  // host lives in the node's state, gone once the node has quit, and the
  // posted function runs only while the node is there.
  (*d)->Exec(sandbox, id, exec, [post = post_, this, id, done = std::move(done)](Result<v1::ExecResult> r) mutable {
    post([this, id, done = std::move(done), r = std::move(r)]() mutable {
      runs_.erase(id);
      ++counters_.runs;
      v1::RunReply reply;
      if (r.ok()) {
        if (r->verdict() == v1::VERDICT_OK) ++counters_.runs_ok;
        if (r->verdict() == v1::VERDICT_PLATFORM_ERROR) ++counters_.runs_platform_error;
        *reply.mutable_result() = std::move(*r);
      } else {
        ++counters_.runs_platform_error;
        ToProto(r.status(), reply.mutable_status());
      }
      done(std::move(reply));
    });
  });
}

Status NodeHost::KillRun(const std::string& id, const std::string& why) {
  auto it = runs_.find(id);
  if (it == runs_.end()) return Status::NotFound("no one-shot run '" + id + "' in flight");
  return it->second.driver->Kill(id, why);
}

NodeHost::Restored NodeHost::Restore() {
  auto& ctx = *ctx_;
  restore_.started = std::chrono::steady_clock::now();
  Restored out;
  size_t dropped = 0, closed = 0, corrupt = 0;  // one corrupt row must not keep the others from coming back
  state::WriteBatch cleanup;
  auto s1 = ctx.store->Scan(state::Table::kSandboxes, "", [&](const std::string& key, const std::string& raw) {
    store::v1::SandboxRow row;
    if (!row.ParseFromString(raw) || row.record().id() != key) {
      ctx.log->error("restore: sandboxes row '{}' is not a SandboxRow; skipped", key);
      ++corrupt;
      return true;
    }
    auto phase = row.record().phase();
    if (phase == v1::SANDBOX_PHASE_STOPPED || phase == v1::SANDBOX_PHASE_STOPPING) {
      cleanup.Delete(state::Table::kSandboxes, key);
      ++dropped;
      return true;
    }
    out.sandboxes.push_back(std::move(row));
    return true;
  });
  auto s2 = ctx.store->Scan(state::Table::kSessions, "", [&](const std::string& key, const std::string& raw) {
    v1::SessionRecord rec;
    if (!rec.ParseFromString(raw)) {
      ctx.log->error("restore: sessions row '{}' is not a SessionRecord; skipped", key);
      ++corrupt;
      return true;
    }
    // A closed session needs no actor: the router answers for it from the store.
    if (rec.phase() == v1::SESSION_PHASE_CLOSED) ++closed;
    else out.sessions.push_back(std::move(rec));
    return true;
  });
  if (!s1.ok()) ctx.log->error("restore sandboxes: {}", s1.message());
  if (!s2.ok()) ctx.log->error("restore sessions: {}", s2.message());
  if (!cleanup.empty()) {
    Status w = ctx.committer->WriteSync(std::move(cleanup));
    if (!w.ok()) ctx.log->error("restore: cleanup write: {}", w.message());
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - restore_.started).count();
  ctx.log->info("restored {} sandbox(es) and {} session(s) ({} closed ones kept for replay) from {} in {:.1f} ms{}{}{}",
                out.sandboxes.size(), out.sessions.size(), closed, ctx.store->Describe(), ms,
                dropped ? " (" + std::to_string(dropped) + " stopped sandbox row(s) removed)" : "",
                corrupt ? " (" + std::to_string(corrupt) + " corrupt row(s) skipped)" : "",
                out.sandboxes.empty() ? "" : "; their drivers re-adopt them now");
  restore_.readopting = out.sandboxes.size();
  // Only with every record seen may a driver drop what no record claims.
  restore_.scanned = s1.ok();
  MaybeRestoreDone();
  return out;
}

void NodeHost::Readopted() {
  ++restore_.readopted;
  --restore_.readopting;
  MaybeRestoreDone();
}

// Once every sandbox's driver has answered its Readopt: drivers may drop
// what no record claims, and the restore is done.
void NodeHost::MaybeRestoreDone() {
  auto& r = restore_;
  if (!r.scanned || r.readopting || r.done) return;
  r.done = true;
  for (auto* d : ctx_->kinds->Drivers()) d->Restored();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r.started).count();
  ctx_->log->info("re-adopted {} sandbox(es) in {:.1f} ms", r.readopted, ms);
}

}  // namespace dsec
