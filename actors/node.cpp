#include "actors/node.hpp"

#include <algorithm>
#include <cctype>

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

// A sandbox id a user (or a session) picked: [a-z0-9-], at most 64 bytes.
Status CheckSandboxId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 64 && id[0] != '-';
  for (char c : id) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (ok) return Status::Ok();
  return Status::InvalidArgument("sandbox id '" + id + "' must be 1-64 characters of [a-z0-9-], not starting with '-'");
}

void Watch(NodeSelf self, const std::string& id, const sandbox_actor& a) {
  self->state.sandboxes[id] = a;
  self->state.sandbox_of[a.address()] = id;
}

// Run by a sandbox (or session) actor right before it answers its destroy (close): the node
// forgets it first (its mailbox has this before any request a client sends
// after the reply), so later requests get NotFound, not a quitting actor.
// `children` / `of` are the node's maps of one kind (sandboxes or sessions);
// `tag` prefixes the key in the restart-intensity history.
template <class Children, class Of>
std::function<void()> Gone(NodeSelf self, Children NodeState::*children, Of NodeState::*of, std::string tag,
                           const std::string& key) {
  auto handle = caf::actor_cast<node_actor>(self);
  return [handle, self, children, of, tag, key] {
    Post(handle, [self, children, of, tag, key] {
      auto& st = self->state;
      auto it = (st.*children).find(key);
      if (it == (st.*children).end()) return;
      (st.*of).erase(it->second.address());
      (st.*children).erase(it);
      st.intensity->Forget(tag + key);
    });
  };
}

// Remembers why sandbox `id` ended (bounded), and forgets its owner's claim.
void Ended(NodeSelf self, const std::string& id, const std::string& owner, const std::string& why) {
  auto& st = self->state;
  st.clients.owner_of.erase(id);
  if (!owner.empty()) {
    auto it = st.clients.owned.find(owner);
    if (it != st.clients.owned.end()) {
      it->second.erase(id);
      if (it->second.empty()) {
        st.clients.owned.erase(it);
        st.clients.gone_since.erase(owner);
      }
    }
  }
  if (why.empty()) return;
  if (st.ended.emplace(id, why).second) st.ended_order.push_back(id);
  else st.ended[id] = why;
  while (st.ended_order.size() > NodeState::kMaxEnded) {
    st.ended.erase(st.ended_order.front());
    st.ended_order.pop_front();
  }
}

bool OwnerConnected(NodeSelf self, const std::string& owner) {
  auto it = self->state.clients.connections.find(owner);
  return !owner.empty() && it != self->state.clients.connections.end() && it->second > 0;
}

sandbox_actor Spawn(NodeSelf self, const v1::SandboxRecord& rec, std::function<void()> readopted = nullptr) {
  auto gone = Gone(self, &NodeState::sandboxes, &NodeState::sandbox_of, "sb/", rec.id());
  auto handle = caf::actor_cast<node_actor>(self);
  std::string id = rec.id(), owner = rec.owner();
  if (!owner.empty()) {
    self->state.clients.owned[owner].insert(id);
    self->state.clients.owner_of[id] = owner;
    if (!OwnerConnected(self, owner)) self->state.clients.gone_since.emplace(owner, NowMs());
  }
  return SpawnSandbox(
      self, self->state.ctx, rec,
      [gone, handle, self, id, owner](const std::string& why) {
        gone();
        Post(handle, [self, id, owner, why] { Ended(self, id, owner, why); });
      },
      OwnerConnected(self, owner), std::move(readopted));
}

void Watch(NodeSelf self, const std::string& name, const session_actor& a) {
  self->state.sessions[name] = a;
  self->state.session_of[a.address()] = name;
}

// Like Gone for sandboxes: a closing session is forgotten before its close
// is answered; from then on the node answers for it from the store.
session_actor SpawnSessionActor(NodeSelf self, const v1::SessionRecord& rec) {
  auto gone = Gone(self, &NodeState::sessions, &NodeState::session_of, "se/", rec.name());
  return SpawnSession(self, self->state.ctx, caf::actor_cast<entry_actor>(self), rec, std::move(gone));
}

// A session without an actor: closed (or failed, or never opened). Its
// record from the store, or NotFound.
Result<v1::SessionRecord> StoredSession(NodeSelf self, const std::string& name) {
  auto rec = state::TypedTable<v1::SessionRecord>(self->state.ctx->store, state::Table::kSessions).Get(name);
  if (!rec.ok() && rec.status().code() == Status::Code::kNotFound)
    return Status::NotFound("session '" + name + "' not found (never opened, or past the retention limit); open it first");
  return rec;
}

// The actor of session `name`: the running one, or, for a record that is
// open in the store but has no actor (its actor quit on a failure that left
// the record), one respawned from the record. nullptr: not open here.
session_actor OpenSessionActor(NodeSelf self, const std::string& name, Result<v1::SessionRecord>* stored) {
  auto& st = self->state;
  if (auto it = st.sessions.find(name); it != st.sessions.end()) return it->second;
  *stored = StoredSession(self, name);
  if (!stored->ok() || (*stored)->phase() != v1::SESSION_PHASE_OPEN) return session_actor{};
  auto child = SpawnSessionActor(self, **stored);
  Watch(self, name, child);
  return child;
}

Status NotOpen(const v1::SessionRecord& rec) {
  if (rec.phase() == v1::SESSION_PHASE_FAILED)
    return Status::FailedPrecondition("session " + rec.name() + " failed (" + rec.error() +
                                      "); its log is kept; open a new session name");
  return Status::FailedPrecondition("session " + rec.name() + " is closed (" + rec.close_reason() +
                                    "); its log is kept; open a new session name");
}

// ---- annotation batches ----------------------------------------------------

constexpr int kMaxBatchCalls = 4096;

void FlushAnnotations(NodeSelf self, const caf::actor_addr& to) {
  auto& st = self->state;
  auto it = st.annotate_out.find(to);
  if (it == st.annotate_out.end()) return;
  AnnotateOut out = std::move(it->second);
  st.annotate_out.erase(it);
  caf::anon_send(out.to, std::move(out.results));
}

// Queues the answer to call `id` of `to`'s batch; the first answer queued
// posts the flush, so every answer that arrives before it goes in the same
// message.
void AnnotateDone(NodeSelf self, const caf::actor& to, uint64_t id, v1::StepReply reply) {
  auto& out = self->state.annotate_out[to.address()];
  if (!out.to) out.to = to;
  auto* r = out.results.add_results();
  r->set_call_id(id);
  *r->mutable_reply() = std::move(reply);
  if (out.flush_posted) return;
  out.flush_posted = true;
  Post(caf::actor_cast<node_actor>(self), [self, addr = to.address()] { FlushAnnotations(self, addr); });
}

// One batched call's answer, shared by the copies of its `done`. A
// LocalAnnotate is a one-way message: if the session actor quits or crashes
// before answering (the message still queued, or held behind a running step
// or a write), CAF drops it without a word. So when the last copy goes
// unanswered, the node answers `unavailable` itself.
class BatchAnswer {
 public:
  BatchAnswer(NodeSelf self, caf::actor to, uint64_t id, std::string session, uint64_t index)
      : self_(self), node_(caf::actor_cast<node_actor>(self)), to_(std::move(to)), id_(id),
        session_(std::move(session)), index_(index) {}
  BatchAnswer(const BatchAnswer&) = delete;
  BatchAnswer& operator=(const BatchAnswer&) = delete;
  // Runs on the session's thread.
  void Give(v1::StepReply reply) {
    answered_ = true;
    Send(std::move(reply));
  }
  // On whatever thread dropped the last copy: only handles are touched here.
  ~BatchAnswer() {
    if (answered_) return;
    Send(ErrorReply<v1::StepReply>(Status::Unavailable(
        "session " + session_ + ": annotation of step " + std::to_string(index_) +
        ": the session ended (crashed or closed) before it answered; send it again")));
  }

 private:
  // The answer hops back to the node, which queues it for the sender.
  void Send(v1::StepReply reply) {
    Post(node_, [self = self_, to = to_, id = id_, reply = std::move(reply)]() mutable {
      AnnotateDone(self, to, id, std::move(reply));
    });
  }
  NodeSelf self_;  // dereferenced only on the node's own thread
  node_actor node_;
  caf::actor to_;
  uint64_t id_;
  std::string session_;
  uint64_t index_;
  bool answered_ = false;
};

// Hands each call to its session actor as if its sender had sent it alone.
void AnnotateBatch(NodeSelf self, v1::AnnotateBatch& batch) {
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (!sender) return;  // an anonymous batch: nobody to answer
  if (batch.calls_size() > kMaxBatchCalls) {
    auto refused = ErrorReply<v1::StepReply>(Status::InvalidArgument(
        "an AnnotateBatch of " + std::to_string(batch.calls_size()) + " calls is over the limit of " +
        std::to_string(kMaxBatchCalls) + "; send smaller batches"));
    for (const auto& call : batch.calls()) AnnotateDone(self, sender, call.call_id(), refused);
    return;
  }
  for (auto& call : *batch.mutable_calls()) {
    uint64_t id = call.call_id();
    Result<v1::SessionRecord> stored = Status::NotFound("");
    auto session = OpenSessionActor(self, call.request().session(), &stored);
    if (!session) {
      AnnotateDone(self, sender, id, ErrorReply<v1::StepReply>(stored.ok() ? NotOpen(*stored) : stored.status()));
      continue;
    }
    auto answer =
        std::make_shared<BatchAnswer>(self, sender, id, call.request().session(), call.request().index());
    auto done = [answer](v1::StepReply reply) { answer->Give(std::move(reply)); };
    caf::send_as(sender, session, LocalAnnotate{std::move(*call.mutable_request()), std::move(done)});
  }
}

// Deletes closed sessions (record and log) older than the retention limit,
// then looks again later (a quarter of the limit, at most an hour).
void SweepSessions(NodeSelf self) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  int64_t cutoff = NowMs() - int64_t{ctx.options.session_retention_s} * 1000;
  state::WriteBatch b;
  size_t n = 0;
  Status s = state::TypedTable<v1::SessionRecord>(ctx.store, state::Table::kSessions)
                 .Scan("", [&](const std::string& key, v1::SessionRecord&& r) {
                   if (r.phase() == v1::SESSION_PHASE_OPEN || st.sessions.count(key)) return true;
                   // A sandbox of a closed session whose destroy failed: again.
                   for (const auto& sb : r.sandboxes()) {
                     auto it = sb.id().empty() ? st.sandboxes.end() : st.sandboxes.find(sb.id());
                     if (it == st.sandboxes.end()) continue;
                     ctx.log->warn("session {} is closed but its sandbox {} is still there; removing it", key, sb.id());
                     v1::DestroyRequest req;
                     req.set_sandbox_id(sb.id());
                     self->request(it->second, std::chrono::seconds(60), std::move(req))
                         .then([](v1::SandboxReply&) {}, [](caf::error&) {});
                   }
                   int64_t ended = r.closed_ms() ? r.closed_ms() : r.updated_ms();
                   if (ended > cutoff) return true;
                   b.Delete(state::Table::kSessions, key);
                   b.DeletePrefix(state::Table::kSteps, state::StepPrefix(key));
                   ++n;
                   return true;
                 });
  if (!s.ok()) ctx.log->warn("session retention sweep: {}", s.message());
  if (n) {
    ctx.committer->Submit(std::move(b), [log = ctx.log, n](const Status& w) {
      if (w.ok()) log->info("removed {} closed session(s) past the retention limit", n);
      else log->warn("removing closed sessions: {}", w.message());
    });
  }
  auto next = std::chrono::seconds(std::clamp<uint32_t>(ctx.options.session_retention_s / 4, 1, 3600));
  self->delayed_send(caf::actor_cast<node_actor>(self), next, Continuation{[self] { SweepSessions(self); }});
}

// Once every sandbox's driver has answered its Readopt: drivers may drop
// what no record claims, and the restore is done.
void MaybeRestoreDone(NodeSelf self) {
  auto& st = self->state;
  auto& r = st.restore;
  if (!r.scanned || r.readopting || r.done) return;
  r.done = true;
  for (auto* d : st.ctx->kinds->Drivers()) d->Restored();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r.started).count();
  st.ctx->log->info("re-adopted {} sandbox(es) in {:.1f} ms", r.readopted, ms);
}

// Rebuilds sandbox and session actors from the store (daemon start). The
// scan is quick; re-adopting sandboxes (a ping to each one's agent) is not,
// so drivers do it on their threads while the node answers: a sandbox's own
// actor holds its requests until its driver has answered.
void Restore(NodeSelf self) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  st.restore.started = std::chrono::steady_clock::now();
  size_t sandboxes = 0, sessions = 0, dropped = 0;
  state::WriteBatch cleanup;
  // One corrupt row must not keep the others from coming back: log it, skip it.
  size_t corrupt = 0;
  auto handle = caf::actor_cast<node_actor>(self);
  std::vector<v1::SandboxRecord> restored;
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
    restored.push_back(std::move(rec));
    return true;
  });
  st.restore.readopting = restored.size();
  for (auto& rec : restored) {
    auto readopted = [handle, self] {
      Post(handle, [self] {
        auto& r = self->state.restore;
        ++r.readopted;
        --r.readopting;
        MaybeRestoreDone(self);
      });
    };
    Watch(self, rec.id(), Spawn(self, rec, readopted));
    ++sandboxes;
  }
  size_t closed = 0;
  auto s2 = ctx.store->Scan(state::Table::kSessions, "", [&](const std::string& key, const std::string& raw) {
    v1::SessionRecord rec;
    if (!rec.ParseFromString(raw)) {
      ctx.log->error("restore: sessions row '{}' is not a SessionRecord; skipped", key);
      ++corrupt;
      return true;
    }
    // A closed session needs no actor: the node answers for it from the store.
    if (rec.phase() == v1::SESSION_PHASE_CLOSED) {
      ++closed;
      return true;
    }
    Watch(self, rec.name(), SpawnSessionActor(self, rec));
    ++sessions;
    return true;
  });
  if (!s1.ok()) ctx.log->error("restore sandboxes: {}", s1.message());
  if (!s2.ok()) ctx.log->error("restore sessions: {}", s2.message());
  if (!cleanup.empty()) {
    Status w = ctx.committer->WriteSync(std::move(cleanup));
    if (!w.ok()) ctx.log->error("restore: cleanup write: {}", w.message());
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - st.restore.started).count();
  ctx.log->info("restored {} sandbox(es) and {} session(s) ({} closed ones kept for replay) from {} in {:.1f} ms{}{}{}",
                sandboxes, sessions, closed, ctx.store->Describe(), ms,
                dropped ? " (" + std::to_string(dropped) + " stopped sandbox row(s) removed)" : "",
                corrupt ? " (" + std::to_string(corrupt) + " corrupt row(s) skipped)" : "",
                sandboxes ? "; their drivers re-adopt them now" : "");
  // Only with every record seen may a driver drop what no record claims.
  st.restore.scanned = s1.ok();
  MaybeRestoreDone(self);
}

bool ClientDown(NodeSelf self, const caf::down_msg& dm);

// Supervision: a child that ended abnormally is restarted from its
// checkpoint, unless it failed too often (restart intensity).
void OnDown(NodeSelf self, caf::down_msg& dm) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  if (ClientDown(self, dm)) return;
  bool normal = !dm.reason || dm.reason == caf::exit_reason::user_shutdown;
  std::string why = self->system().render(dm.reason);
  if (auto it = st.sandbox_of.find(dm.source); it != st.sandbox_of.end()) {
    std::string id = it->second;
    st.sandbox_of.erase(it);
    // Only if the map still names this actor (not a newer one by that id).
    if (auto cur = st.sandboxes.find(id); cur != st.sandboxes.end() && cur->second.address() == dm.source)
      st.sandboxes.erase(cur);
    if (normal) {
      st.intensity->Forget("sb/" + id);
      st.restart_counts.erase("sb/" + id);
      // Quit without a destroy (a creation that failed): its owner's claim goes too.
      if (auto o = st.clients.owner_of.find(id); o != st.clients.owner_of.end()) Ended(self, id, o->second, "");
      return;
    }
    auto rec = state::TypedTable<v1::SandboxRecord>(ctx.store, state::Table::kSandboxes).Get(id);
    if (!rec.ok()) {
      ctx.log->error("sandbox {} died ({}) and has no checkpoint: {}", id, why, rec.status().message());
      return;
    }
    if (!st.intensity->Allow("sb/" + id)) {
      ++st.counters.gave_up;
      rec->set_restarts(std::max(rec->restarts(), st.restart_counts["sb/" + id]));
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
    // Counted here and in the checkpoint: a crash before that write is done
    // still counts from here.
    uint32_t& count = st.restart_counts["sb/" + id];
    count = std::max(count, rec->restarts()) + 1;
    rec->set_restarts(count);
    state::WriteBatch b;
    state::TypedTable<v1::SandboxRecord>(ctx.store, state::Table::kSandboxes).Put(&b, id, *rec);
    ctx.committer->Submit(std::move(b), [log = ctx.log, id](const Status& w) {
      if (!w.ok()) log->warn("sandbox {}: writing its restart count: {}", id, w.message());
    });
    ctx.log->warn("sandbox {} crashed ({}); restarted from its checkpoint (restart {} in the window)", id,
                  why, st.intensity->Recent("sb/" + id));
    Watch(self, id, Spawn(self, *rec));
    return;
  }
  if (auto it = st.session_of.find(dm.source); it != st.session_of.end()) {
    std::string name = it->second;
    st.session_of.erase(it);
    if (auto cur = st.sessions.find(name); cur != st.sessions.end() && cur->second.address() == dm.source)
      st.sessions.erase(cur);
    if (normal) {
      st.intensity->Forget("se/" + name);
      st.restart_counts.erase("se/" + name);
      return;
    }
    auto rec = state::TypedTable<v1::SessionRecord>(ctx.store, state::Table::kSessions).Get(name);
    if (!rec.ok()) {
      ctx.log->warn("session {} died ({}) before it was durable; dropped", name, why);
      return;
    }
    if (!st.intensity->Allow("se/" + name)) {
      ++st.counters.gave_up;
      rec->set_restarts(std::max(rec->restarts(), st.restart_counts["se/" + name]));
      rec->set_phase(v1::SESSION_PHASE_FAILED);
      rec->set_error("its actor crashed " + std::to_string(ctx.options.max_restarts + 1) + " times within " +
                     std::to_string(ctx.options.restart_window_s) + " s; last: " + why);
      state::WriteBatch b;
      state::TypedTable<v1::SessionRecord>(ctx.store, state::Table::kSessions).Put(&b, name, *rec);
      ctx.committer->Submit(std::move(b), [](const Status&) {});
      ctx.log->error("session {} crashed too often (last: {}); left failed", name, why);
      Watch(self, name, SpawnSessionActor(self, *rec));
      return;
    }
    ++st.counters.restarts;
    uint32_t& count = st.restart_counts["se/" + name];  // as for sandboxes, above
    count = std::max(count, rec->restarts()) + 1;
    rec->set_restarts(count);
    state::WriteBatch b;
    state::TypedTable<v1::SessionRecord>(ctx.store, state::Table::kSessions).Put(&b, name, *rec);
    ctx.committer->Submit(std::move(b), [log = ctx.log, name](const Status& w) {
      if (!w.ok()) log->warn("session {}: writing its restart count: {}", name, w.message());
    });
    ctx.log->warn("session {} crashed ({}); restarted from its log ({} steps)", name, why, rec->step_count());
    Watch(self, name, SpawnSessionActor(self, *rec));
  }
}

// A request for one sandbox goes to its actor, which answers the sender.
template <class Reply, class Request>
caf::result<Reply> ToSandbox(NodeSelf self, Request& req) {
  auto it = self->state.sandboxes.find(req.sandbox_id());
  if (it == self->state.sandboxes.end()) {
    if (auto e = self->state.ended.find(req.sandbox_id()); e != self->state.ended.end())
      return ErrorReply<Reply>(
          Status::NotFound("sandbox '" + req.sandbox_id() + "' not found: it ended (" + e->second + ")"));
    return ErrorReply<Reply>(
        Status::NotFound("sandbox '" + req.sandbox_id() + "' not found on this node (dsecctl ls lists sandboxes)"));
  }
  return self->delegate(it->second, std::move(req));
}

// ---- SDK clients and what they own ------------------------------------------

// The owner's sandboxes learn it is connected again, or gone.
void TellOwned(NodeSelf self, const std::string& client, bool present) {
  auto& st = self->state;
  auto it = st.clients.owned.find(client);
  if (it == st.clients.owned.end()) return;
  for (const auto& id : it->second)
    if (auto sb = st.sandboxes.find(id); sb != st.sandboxes.end()) self->send(sb->second, owner_atom::value, present);
}

void OnHello(NodeSelf self, const v1::Hello& hello) {
  auto& st = self->state;
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  const std::string& id = hello.client_id();
  bool ok = sender && !id.empty() && id.size() <= 64;
  for (char c : id) ok = ok && std::isalnum(static_cast<unsigned char>(c));
  if (!ok) return;  // nothing to answer a one-way message with; it owns nothing
  if (!st.clients.id_of.emplace(sender.address(), id).second) return;  // said hello before
  self->monitor(sender);
  if (++st.clients.connections[id] == 1) {
    st.clients.gone_since.erase(id);
    TellOwned(self, id, true);
  }
}

// True when `dm` was about an SDK client.
bool ClientDown(NodeSelf self, const caf::down_msg& dm) {
  auto& st = self->state;
  auto it = st.clients.id_of.find(dm.source);
  if (it == st.clients.id_of.end()) return false;
  std::string id = it->second;
  st.clients.id_of.erase(it);
  if (--st.clients.connections[id] <= 0) {
    st.clients.connections.erase(id);
    if (st.clients.owned.count(id)) st.clients.gone_since[id] = NowMs();
    TellOwned(self, id, false);
  }
  return true;
}

// Fills in a new plain sandbox's lifetime from its request and the node's
// defaults, or says what is out of range.
Status SetLifetime(NodeSelf self, const v1::CreateRequest& req, const drivers::Driver& driver,
                   v1::SandboxRecord* rec) {
  const auto& o = self->state.ctx->options;
  auto* spec = rec->mutable_spec();
  std::string what = "sandbox " + rec->id();
  // A session's own sandboxes end with the session; only dsecd's own actors may say so.
  bool local = self->current_sender() && self->current_sender()->node() == self->node();
  if (!req.session().empty() && local) {
    rec->set_session(req.session());
    spec->set_ttl_s(0);
    spec->set_idle_timeout_s(0);
    return Status::Ok();
  }
  uint32_t ttl = spec->has_ttl_s() ? spec->ttl_s() : o.sandbox_ttl_s;
  if (o.sandbox_max_ttl_s && (ttl == 0 || ttl > o.sandbox_max_ttl_s))
    return Status::InvalidArgument(what + ": a ttl of " + (ttl ? std::to_string(ttl) + " s" : std::string("0 (none)")) +
                                   " is above this node's maximum of " + std::to_string(o.sandbox_max_ttl_s) +
                                   " s (dsecd --sandbox-max-ttl)");
  uint32_t idle = spec->has_idle_timeout_s() ? spec->idle_timeout_s() : o.sandbox_idle_timeout_s;
  if (idle > 30u * 24 * 3600) return Status::InvalidArgument(what + ": an idle timeout above 30 days");
  if (req.lease_s() > 7u * 24 * 3600)
    return Status::InvalidArgument(what + ": a lease of " + std::to_string(req.lease_s()) + " s is above 7 days");
  bool owner_ok = req.owner().size() <= 64;
  for (char c : req.owner()) owner_ok = owner_ok && std::isalnum(static_cast<unsigned char>(c));
  if (!owner_ok)
    return Status::InvalidArgument(what + ": owner '" + req.owner().substr(0, 64) +
                                   "' is not a client id (up to 64 letters and digits, as Hello.client_id)");
  spec->set_ttl_s(ttl);
  spec->set_idle_timeout_s(idle);
  if (spec->on_idle() == v1::IDLE_ACTION_PAUSE && !driver.traits().pause)
    return Status::InvalidArgument(what + ": " + driver.name() +
                                   " sandboxes cannot be paused (nothing runs between calls); ask for on_idle destroy");
  // The node's default, where the kind can do it.
  if (spec->on_idle() == v1::IDLE_ACTION_UNSPECIFIED)
    spec->set_on_idle(o.sandbox_on_idle == v1::IDLE_ACTION_PAUSE && !driver.traits().pause ? v1::IDLE_ACTION_DESTROY
                                                                                        : o.sandbox_on_idle);
  if (ttl) rec->set_ttl_deadline_ms(rec->created_ms() + int64_t{ttl} * 1000);
  rec->set_last_active_ms(rec->created_ms());
  if (!req.detached() && !req.owner().empty()) {
    rec->set_owner(req.owner());
    rec->set_lease_s(req.lease_s() ? req.lease_s() : o.sandbox_lease_s);
  }
  return Status::Ok();
}

caf::result<v1::RunReply> HandleRun(NodeSelf self, v1::RunRequest& req) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  auto reject = [&](const Status& s) {
    ++st.counters.rejected;
    return ErrorReply<v1::RunReply>(s);
  };
  auto d = ctx.kinds->DriverFor(req.spec());
  if (!d.ok()) return reject(d.status());
  Status s = drivers::CheckSpec(ctx.options.limits, req.spec());
  if (s.ok() && (*d)->traits().stateful)
    s = Status::InvalidArgument(std::string("one-shot runs are for kinds without state (fncall); for a ") +
                                (*d)->name() + " create a sandbox (dsecctl create) and exec in it");
  if (s.ok()) s = (*d)->CanHandle(req.spec());
  if (s.ok()) s = drivers::CheckExecRequest(ctx.options.limits, req.exec());
  if (s.ok() && !req.exec().idempotency_key().empty())
    s = Status::InvalidArgument("an idempotency_key needs a sandbox with state; a one-shot run is always fresh");
  if (!s.ok()) return reject(s);
  auto limits = drivers::EffectiveLimits(ctx.options.limits, req.spec(), req.exec());
  if (!limits.ok()) return reject(limits.status());
  if (st.runs.size() >= ctx.options.max_inflight_runs)
    return reject(Status::ResourceExhausted("node has " + std::to_string(st.runs.size()) +
                                            " runs in flight (the limit); retry later"));
  std::string id = "run-" + std::to_string(ctx.options.boot) + "-" + std::to_string(++st.next_run);
  st.runs[id] = RunInfo{req.exec().argv(0), NowMs(), *d};
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
  SweepSessions(self);
  st.images = SpawnImageWorker(self, st.ctx);
  return {
      [self](v1::RunRequest& req) -> caf::result<v1::RunReply> { return HandleRun(self, req); },
      [self](v1::CreateRequest& req) -> caf::result<v1::SandboxReply> {
        auto& st = self->state;
        auto d = st.ctx->kinds->DriverFor(req.spec());
        Status s = d.ok() ? drivers::CheckSpec(st.ctx->options.limits, req.spec()) : d.status();
        if (s.ok()) s = (*d)->CanHandle(req.spec());
        if (!s.ok()) {
          ++st.counters.rejected;
          return ErrorReply<v1::SandboxReply>(s);
        }
        if (!req.id().empty()) {
          if (s = CheckSandboxId(req.id()); !s.ok()) {
            ++st.counters.rejected;
            return ErrorReply<v1::SandboxReply>(s);
          }
          // Taken: say so, with the sandbox as it is (a session re-creating
          // its sandbox after a restart learns it is already there).
          if (auto it = st.sandboxes.find(req.id()); it != st.sandboxes.end()) {
            auto rp = self->make_response_promise<v1::SandboxReply>();
            std::string id = req.id();
            self->request(it->second, std::chrono::seconds(30), v1::GetSandboxRequest{})
                .then(
                    [rp, id](v1::SandboxReply& r) mutable {
                      ToProto(Status::AlreadyExists("sandbox id '" + id + "' is taken"), r.mutable_status());
                      rp.deliver(std::move(r));
                    },
                    [rp, id](caf::error& e) mutable {
                      rp.deliver(ErrorReply<v1::SandboxReply>(Status::Unavailable(
                          "sandbox id '" + id + "' is taken and did not answer: " + caf::to_string(e))));
                    });
            return rp;
          }
        }
        v1::SandboxRecord rec;
        rec.set_id(req.id().empty() ? "sb-" + RandomHex(12) : req.id());
        *rec.mutable_spec() = req.spec();
        if (rec.spec().kind() == v1::KIND_UNSPECIFIED || rec.spec().kind() == v1::KIND_AUTO)
          rec.mutable_spec()->set_kind((*d)->kind());
        rec.set_phase(v1::SANDBOX_PHASE_PENDING);
        rec.set_node_id(st.ctx->options.node_id);
        rec.set_created_ms(NowMs());
        if (s = SetLifetime(self, req, **d, &rec); !s.ok()) {
          ++st.counters.rejected;
          return ErrorReply<v1::SandboxReply>(s);
        }
        st.ended.erase(rec.id());  // a new sandbox by that name
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
        Status s = CheckOpenRequest(*st.ctx, req);
        if (!s.ok()) return ErrorReply<v1::SessionReply>(s);
        Result<v1::SessionRecord> stored = Status::NotFound("");
        if (auto a = OpenSessionActor(self, req.name(), &stored)) return self->delegate(a, std::move(req));
        if (stored.ok()) {
          v1::SessionReply r = ErrorReply<v1::SessionReply>(NotOpen(*stored));
          *r.mutable_session() = std::move(*stored);
          return r;
        }
        if (stored.status().code() != Status::Code::kNotFound) return ErrorReply<v1::SessionReply>(stored.status());
        v1::SessionRecord rec;
        rec.set_name(req.name());
        auto child = SpawnSessionActor(self, rec);
        Watch(self, req.name(), child);
        return self->delegate(child, std::move(req));
      },
      [self](v1::StepRequest& req) -> caf::result<v1::StepReply> {
        Result<v1::SessionRecord> stored = Status::NotFound("");
        if (auto a = OpenSessionActor(self, req.session(), &stored)) return self->delegate(a, std::move(req));
        return ErrorReply<v1::StepReply>(stored.ok() ? NotOpen(*stored) : stored.status());
      },
      [self](v1::AnnotateStepRequest& req) -> caf::result<v1::StepReply> {
        Result<v1::SessionRecord> stored = Status::NotFound("");
        if (auto a = OpenSessionActor(self, req.session(), &stored)) return self->delegate(a, std::move(req));
        return ErrorReply<v1::StepReply>(stored.ok() ? NotOpen(*stored) : stored.status());
      },
      [self](v1::AnnotateBatch& batch) { AnnotateBatch(self, batch); },
      [self](const v1::Hello& hello) { OnHello(self, hello); },
      [self](v1::ListStepsRequest& req) -> caf::result<v1::StepsReply> {
        Result<v1::SessionRecord> stored = Status::NotFound("");
        if (auto a = OpenSessionActor(self, req.session(), &stored)) return self->delegate(a, std::move(req));
        if (!stored.ok()) return ErrorReply<v1::StepsReply>(stored.status());
        return ListStepsFromStore(*self->state.ctx, *stored, req.from(), req.limit());
      },
      [self](v1::CloseSessionRequest& req) -> caf::result<v1::SessionReply> {
        Result<v1::SessionRecord> stored = Status::NotFound("");
        if (auto a = OpenSessionActor(self, req.name(), &stored)) return self->delegate(a, std::move(req));
        // Closing a closed session is a no-op.
        v1::SessionReply r = ErrorReply<v1::SessionReply>(stored.status());
        if (stored.ok()) *r.mutable_session() = std::move(*stored);
        return r;
      },
      [self](v1::GetSessionRequest& req) -> caf::result<v1::SessionReply> {
        Result<v1::SessionRecord> stored = Status::NotFound("");
        if (auto a = OpenSessionActor(self, req.name(), &stored)) return self->delegate(a, std::move(req));
        v1::SessionReply r = ErrorReply<v1::SessionReply>(stored.status());
        if (stored.ok()) *r.mutable_session() = std::move(*stored);
        return r;
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
