#include "actors/node/node.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>

#include "actors/node/node_state.hpp"
#include "actors/error_reply.hpp"
#include "actors/node/lifetime.hpp"
#include "actors/sandbox_list.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "runtime/metrics.hpp"
#include "state/table.hpp"

namespace dsec {

namespace {

// A sandbox id a user (or a session) picked: [a-z0-9-], at most 64 bytes.
Status CheckSandboxId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 64 && id[0] != '-';
  for (char c : id) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (ok) return Status::Ok();
  return Status::InvalidArgument("sandbox id '" + id + "' must be 1-64 characters of [a-z0-9-], not starting with '-'");
}

// Run by a sandbox (or session) actor right before it answers its destroy
// (close): the node forgets it first (its mailbox has this before any
// request a client sends after the reply), so later requests get NotFound,
// not a quitting actor. `why` (sandboxes): why it ended, remembered.
std::function<void(const std::string&)> SandboxGone(NodeSelf self, const std::string& id) {
  auto handle = caf::actor_cast<node_actor>(self);
  return [handle, self, id](const std::string& why) {
    Post(handle, [self, id, why] {
      auto& st = self->state;
      st.dir.ForgetSandbox(id);
      st.supervisor->SandboxEnded(id);
      st.dir.Unclaim(id);
      ReleaseSnapshot(self, id);
      if (!why.empty()) st.dir.NoteEnded(id, why);
      NoteForController(&st.ended_sandboxes, id);
    });
  };
}

std::function<void()> SessionGone(NodeSelf self, const std::string& name) {
  auto handle = caf::actor_cast<node_actor>(self);
  return [handle, self, name] {
    Post(handle, [self, name] {
      self->state.dir.ForgetSession(name);
      self->state.supervisor->SessionEnded(name);
      NoteForController(&self->state.ended_sessions, name);
    });
  };
}

// A sandbox actor for `row`, in the directory (with its owner's claim).
void Spawn(NodeSelf self, store::v1::SandboxRow row, std::function<void()> readopted = nullptr) {
  auto& st = self->state;
  const v1::SandboxRecord& rec = row.record();
  std::string id = rec.id();
  st.dir.Claim(rec.owner(), id, WallClockMs());
  HoldSnapshot(self, rec);
  bool connected = st.dir.Connected(rec.owner());
  auto a = SpawnSandbox(self, st.ctx, std::move(row), SandboxGone(self, id), connected, std::move(readopted));
  st.dir.PutSandbox(id, a);
}

// Like Spawn for sandboxes: a closing session is forgotten before its close
// is answered; from then on the node answers for it from the store.
session_actor SpawnSessionActor(NodeSelf self, const v1::SessionRecord& rec) {
  auto a = SpawnSession(self, self->state.ctx, caf::actor_cast<entry_actor>(self), rec, SessionGone(self, rec.name()));
  self->state.dir.PutSession(rec.name(), a);
  return a;
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
  if (auto a = self->state.dir.FindSession(name)) return a;
  *stored = StoredSession(self, name);
  if (!stored->ok() || (*stored)->phase() != v1::SESSION_PHASE_OPEN) return session_actor{};
  return SpawnSessionActor(self, **stored);
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
// then looks again later (a quarter of the limit, at most an hour). The
// scan (the whole sessions table) runs on a thread of its own; the node
// then acts on what it found.
struct ClosedSession {
  std::string name;
  std::vector<std::string> sandboxes;
  bool expired = false;
};

void SweptSessions(NodeSelf self, const std::vector<ClosedSession>& closed) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  state::WriteBatch b;
  size_t n = 0;
  for (const auto& c : closed) {
    if (st.dir.FindSession(c.name)) continue;  // reopened (or closing) meanwhile
    // A sandbox of a closed session whose destroy failed: again.
    for (const auto& id : c.sandboxes) {
      auto sb = st.dir.FindSandbox(id);
      if (!sb) continue;
      ctx.log->warn("session {} is closed but its sandbox {} is still there; removing it", c.name, id);
      v1::DestroyRequest req;
      req.set_sandbox_id(id);
      self->request(sb, std::chrono::seconds(60), std::move(req)).then([](v1::SandboxReply&) {}, [](caf::error&) {});
    }
    if (!c.expired) continue;
    b.Delete(state::Table::kSessions, c.name);
    b.DeletePrefix(state::Table::kSteps, state::StepPrefix(c.name));
    ++n;
  }
  if (n) {
    ctx.committer->Submit(std::move(b), [log = ctx.log, n](const Status& w) {
      if (w.ok()) log->info("removed {} closed session(s) past the retention limit", n);
      else log->warn("removing closed sessions: {}", w.message());
    });
  }
}

void SweepSessions(NodeSelf self) {
  auto& ctx = *self->state.ctx;
  auto handle = caf::actor_cast<node_actor>(self);
  int64_t cutoff = WallClockMs() - int64_t{ctx.options.session_retention_s} * 1000;
  self->spawn<caf::detached>([handle, self, store = ctx.store, log = ctx.log, cutoff] {
    std::vector<ClosedSession> closed;
    Status s = state::TypedTable<v1::SessionRecord>(store, state::Table::kSessions)
                   .Scan("", [&](const std::string& key, v1::SessionRecord&& r) {
                     if (r.phase() == v1::SESSION_PHASE_OPEN) return true;
                     ClosedSession c;
                     c.name = key;
                     for (const auto& sb : r.sandboxes())
                       if (!sb.id().empty()) c.sandboxes.push_back(sb.id());
                     // A grade's sandbox of a mark left set (session_grade.cpp).
                     if (r.grading()) c.sandboxes.push_back(GradeSandboxId(r, r.grading() - 1));
                     int64_t ended = r.closed_ms() ? r.closed_ms() : r.updated_ms();
                     c.expired = ended <= cutoff;
                     if (c.expired || !c.sandboxes.empty()) closed.push_back(std::move(c));
                     return true;
                   });
    if (!s.ok()) log->warn("session retention sweep: {}", s.message());
    Post(handle, [self, closed = std::move(closed)] { SweptSessions(self, closed); });
  });
  auto next = std::chrono::seconds(std::clamp<uint32_t>(ctx.options.session_retention_s / 4, 1, 3600));
  self->delayed_send(handle, next, Continuation{[self] { SweepSessions(self); }});
}

// Rebuilds sandbox and session actors from the host's records (daemon
// start). The scan is quick; re-adopting sandboxes (a ping to each one's
// agent) is not, so drivers do it on their threads while the node answers:
// a sandbox's own actor holds its requests until its driver has answered.
void Restore(NodeSelf self) {
  auto restored = self->state.host->Restore();
  auto handle = caf::actor_cast<node_actor>(self);
  for (auto& row : restored.sandboxes)
    Spawn(self, std::move(row), [handle, self] { Post(handle, [self] { self->state.host->Readopted(); }); });
  for (const auto& rec : restored.sessions) SpawnSessionActor(self, rec);
}

bool ClientDown(NodeSelf self, const caf::down_msg& dm);

// Supervision: a child that ended abnormally is restarted from its
// checkpoint, unless it failed too often (restart intensity): then it is
// left failed, and an actor still answers get and destroy (close) for it.
void OnDown(NodeSelf self, caf::down_msg& dm) {
  auto& st = self->state;
  if (ClientDown(self, dm)) return;
  bool normal = !dm.reason || dm.reason == caf::exit_reason::user_shutdown;
  std::string why = self->system().render(dm.reason);
  if (auto id = st.dir.DropSandboxActor(dm.source)) {
    if (normal) {
      st.supervisor->SandboxEnded(*id);
      st.dir.Unclaim(*id);  // quit without a destroy (a creation that failed)
      ReleaseSnapshot(self, *id);
      return;
    }
    if (auto row = st.supervisor->SandboxDied(*id, why)) Spawn(self, std::move(*row));
    return;
  }
  if (auto name = st.dir.DropSessionActor(dm.source)) {
    if (normal) {
      st.supervisor->SessionEnded(*name);
      return;
    }
    if (auto rec = st.supervisor->SessionDied(*name, why)) SpawnSessionActor(self, *rec);
  }
}

// A request for one sandbox goes to its actor, which answers the sender.
template <class Reply, class Request>
caf::result<Reply> ToSandbox(NodeSelf self, Request& req) {
  auto a = self->state.dir.FindSandbox(req.sandbox_id());
  if (!a) {
    if (const auto* why = self->state.dir.EndedWhy(req.sandbox_id()))
      return ErrorReply<Reply>(Status::NotFound("sandbox '" + req.sandbox_id() + "' not found: it ended (" + *why + ")"));
    return ErrorReply<Reply>(
        Status::NotFound("sandbox '" + req.sandbox_id() + "' not found on this node (dsecctl ls lists sandboxes)"));
  }
  return self->delegate(a, std::move(req));
}

// ---- SDK clients and what they own ------------------------------------------

// The owner's sandboxes learn it is connected again, or gone.
void TellOwned(NodeSelf self, const std::string& client, bool present) {
  auto& st = self->state;
  if (const auto* owned = st.dir.Owned(client))
    for (const auto& id : *owned)
      if (auto sb = st.dir.FindSandbox(id)) self->send(sb, owner_atom::value, present);
}

void OnHello(NodeSelf self, const v1::Hello& hello) {
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  const std::string& id = hello.client_id();
  bool ok = sender && !id.empty() && id.size() <= 64;
  for (char c : id) ok = ok && std::isalnum(static_cast<unsigned char>(c));
  if (!ok) return;  // nothing to answer a one-way message with; it owns nothing
  bool first = false;
  if (!self->state.dir.AddConnection(sender.address(), id, &first)) return;  // said hello before
  self->monitor(sender);
  if (first) TellOwned(self, id, true);
}

// True when `dm` was about an SDK client.
bool ClientDown(NodeSelf self, const caf::down_msg& dm) {
  bool last = false;
  auto client = self->state.dir.DropConnection(dm.source, WallClockMs(), &last);
  if (!client) return false;
  if (last) TellOwned(self, *client, false);
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
  if (!spec->carry().sandbox_id().empty() && (req.session().empty() || !local))
    return Status::InvalidArgument(what + ": spec.carry is set by a session's Grade only (Session.Grade)");
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
  if (spec->on_ttl() == v1::IDLE_ACTION_PAUSE && !driver.traits().pause)
    return Status::InvalidArgument(what + ": " + driver.name() +
                                   " sandboxes cannot be paused; their ttl's end destroys them (on_ttl destroy)");
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

// A one-shot run, by the host; its answer comes back on the node's thread.
caf::result<v1::RunReply> HandleRun(NodeSelf self, v1::RunRequest& req) {
  auto rp = self->make_response_promise<v1::RunReply>();
  auto started = std::chrono::steady_clock::now();
  v1::Kind kind = req.spec().kind() == v1::KIND_UNSPECIFIED ? v1::KIND_FNCALL : req.spec().kind();
  metrics::Histogram*& hist = self->state.run_seconds[kind];
  if (!hist) hist = &metrics::ExecSeconds().At(metrics::Labels({{"kind", KindName(kind)}}));
  self->state.host->Run(req, [rp, started, hist](v1::RunReply reply) mutable {
    if (reply.status().code() == v1::Status::OK)
      hist->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    rp.deliver(std::move(reply));
  });
  return rp;
}

// ---- the table's calls (wire/calls.hpp) -------------------------------------

caf::result<v1::RunReply> Handle(NodeSelf self, v1::RunRequest& req) { return HandleRun(self, req); }

caf::result<v1::SandboxReply> Handle(NodeSelf self, v1::CreateRequest& req) {
  auto& st = self->state;
  auto placing = std::chrono::steady_clock::now();
  if (Status r = ResolveSnapshot(self, req.mutable_spec()); !r.ok()) return ErrorReply<v1::SandboxReply>(r);
  auto d = st.host->Admit(req.spec());
  if (!d.ok()) return ErrorReply<v1::SandboxReply>(d.status());
  Status s;
  if (!req.id().empty()) {
    if (s = CheckSandboxId(req.id()); !s.ok()) {
      st.host->Rejected();
      return ErrorReply<v1::SandboxReply>(s);
    }
    // Taken: say so, with the sandbox as it is (a session re-creating
    // its sandbox after a restart learns it is already there).
    if (auto taken = st.dir.FindSandbox(req.id())) {
      auto rp = self->make_response_promise<v1::SandboxReply>();
      const std::string& id = req.id();
      self->request(taken, std::chrono::seconds(30), v1::GetSandboxRequest{})
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
  rec.set_accelerator((*d)->accelerator());
  rec.set_phase(v1::SANDBOX_PHASE_PENDING);
  rec.set_node_id(st.ctx->options.node_id);
  rec.set_created_ms(WallClockMs());
  if (s = SetLifetime(self, req, **d, &rec); !s.ok()) {
    st.host->Rejected();
    return ErrorReply<v1::SandboxReply>(s);
  }
  // Full: a controller places by slots too, but creates reach a node from
  // elsewhere as well (a fork's, a session's), and its view may be late.
  if (uint64_t slots = st.ctx->options.slots; slots && st.dir.sandboxes().size() >= slots) {
    st.host->Rejected();
    return ErrorReply<v1::SandboxReply>(Status::ResourceExhausted(
        "node " + st.ctx->options.node_id + " is full: it holds " + std::to_string(st.dir.sandboxes().size()) +
        " of its " + std::to_string(slots) + " sandboxes (dsecd --slots); destroy some first"));
  }
  st.dir.Reuse(rec.id());  // a new sandbox by that name
  // Placed: on this node, of this kind (a controller decides among nodes).
  metrics::PlacementSeconds().Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - placing).count());
  std::string id = rec.id();
  store::v1::SandboxRow row;
  *row.mutable_record() = std::move(rec);
  Spawn(self, std::move(row));
  NoteForController(&st.started_sandboxes, id);
  return self->delegate(st.dir.FindSandbox(id), std::move(req));
}

caf::result<v1::SessionReply> Handle(NodeSelf self, v1::OpenSessionRequest& req) {
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
  return self->delegate(SpawnSessionActor(self, rec), std::move(req));
}

// This node's sandboxes, a page at a time: the store's rows as a listing
// shows them (ShowEnd), read on a thread of its own.
caf::result<v1::ListSandboxesReply> Handle(NodeSelf self, v1::ListSandboxesRequest& req) {
  if (Status s = CheckListRequest(req); !s.ok()) return ErrorReply<v1::ListSandboxesReply>(s);
  auto rp = self->make_response_promise<v1::ListSandboxesReply>();
  auto handle = caf::actor_cast<node_actor>(self);
  auto& st = self->state;
  self->spawn<caf::detached>([handle, rp, store = st.ctx->store, gone = st.dir.gone_since(), req]() mutable {
    auto page = ListFromStore(store, req, [&gone](v1::SandboxRecord* r) { ShowEnd(r, gone); });
    Post(handle, [rp, page = std::move(page)]() mutable { rp.deliver(std::move(page)); });
  });
  return rp;
}

void Handle(NodeSelf self, v1::AnnotateBatch& batch) { AnnotateBatch(self, batch); }
void Handle(NodeSelf self, v1::Hello& hello) { OnHello(self, hello); }

// A call for a session that has no actor (closed, failed, never opened):
// answered from its record in the store, or with why it cannot be.
template <class Req>
calls::ReplyOf<Req> FromStore(NodeSelf, Req&, Result<v1::SessionRecord>& stored) {
  return ErrorReply<calls::ReplyOf<Req>>(stored.ok() ? NotOpen(*stored) : stored.status());
}
v1::StepsReply FromStore(NodeSelf self, v1::ListStepsRequest& req, Result<v1::SessionRecord>& stored) {
  if (!stored.ok()) return ErrorReply<v1::StepsReply>(stored.status());
  return ListStepsFromStore(*self->state.ctx, *stored, req.from(), req.limit());
}
// Closing a closed session is a no-op; getting one shows it.
v1::SessionReply SessionFromStore(Result<v1::SessionRecord>& stored) {
  v1::SessionReply r = ErrorReply<v1::SessionReply>(stored.status());
  if (stored.ok()) *r.mutable_session() = std::move(*stored);
  return r;
}
v1::SessionReply FromStore(NodeSelf, v1::CloseSessionRequest&, Result<v1::SessionRecord>& stored) {
  return SessionFromStore(stored);
}
v1::SessionReply FromStore(NodeSelf, v1::GetSessionRequest&, Result<v1::SessionRecord>& stored) {
  return SessionFromStore(stored);
}

// The rest, by route: to the sandbox's actor, to the session's, to the
// image worker. A call the table routes elsewhere needs a handler above.
template <class Req>
caf::result<calls::ReplyOf<Req>> Handle(NodeSelf self, Req& req) {
  using C = typename calls::CallOf<Req>::type;
  if constexpr (C::route == calls::Route::kSandbox) {
    return ToSandbox<typename C::Reply>(self, req);
  } else if constexpr (C::route == calls::Route::kSession) {
    Result<v1::SessionRecord> stored = Status::NotFound("");
    if (auto a = OpenSessionActor(self, C::Key(req), &stored)) return self->delegate(a, std::move(req));
    return FromStore(self, req, stored);
  } else if constexpr (C::route == calls::Route::kImages) {
    return self->delegate(self->state.images, std::move(req));
  } else if constexpr (C::route == calls::Route::kSnapshots) {
    return HandleSnapshots(self, req);
  } else {
    static_assert(sizeof(Req) == 0, "the node has no handler for this call (wire/calls.hpp)");
  }
}

node_actor::behavior_type NodeActor(NodeSelf self, std::shared_ptr<NodeContext> ctx) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  auto handle = caf::actor_cast<node_actor>(self);
  st.host = std::make_unique<NodeHost>(st.ctx, [handle](std::function<void()> fn) { Post(handle, std::move(fn)); });
  st.supervisor = std::make_unique<Supervisor>(st.ctx);
  self->set_down_handler([self](caf::down_msg& dm) { OnDown(self, dm); });
  // Children follow the node down on shutdown.
  self->set_exit_handler([self](caf::exit_msg& em) {
    for (auto& [id, a] : self->state.dir.sandboxes()) self->send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& [n, a] : self->state.dir.sessions()) self->send_exit(a, caf::exit_reason::user_shutdown);
    if (self->state.images) self->send_exit(self->state.images, caf::exit_reason::user_shutdown);
    self->quit(em.reason);
  });
  Restore(self);
  SweepSessions(self);
  st.images = SpawnImageWorker(self, st.ctx);
  // The table's calls (wire/calls.hpp), each to its Handle above.
  auto table = calls::Handlers(calls::All{}, [self](auto& req) { return Handle(self, req); });
  return calls::MakeBehavior<node_actor::behavior_type>(
      std::move(table),
      [self](admin_atom, const std::string& cmd, const std::vector<std::string>& args)
          -> caf::result<std::string> { return HandleAdmin(self, cmd, args); },
      [self](lost_atom, const std::string& id, const std::string& why) {
        if (auto sb = self->state.dir.FindSandbox(id)) self->send(sb, lost_atom::value, why);
      },
      [self](Continuation& c) { c.fn(); },
      [self](cluster_info_atom) { return ClusterInfo(self); },
      [self](cluster_load_atom) { return ClusterLoad(self); },
      [self](fetch_image_atom a, v1::ImageManifest& m, caf::actor& source) -> caf::result<v1::ImageReply> {
        return self->delegate(self->state.images, a, std::move(m), std::move(source));
      },
      [self](lazy_image_atom a, v1::ImageManifest& m, cluster::v1::ChunkMap& map) -> caf::result<v1::ImageReply> {
        return self->delegate(self->state.images, a, std::move(m), std::move(map));
      }
  );
}

}  // namespace

node_actor SpawnNode(caf::actor_system& sys, std::shared_ptr<NodeContext> ctx) {
  return sys.spawn(NodeActor, std::move(ctx));
}

}  // namespace dsec
