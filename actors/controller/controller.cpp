// The controller (docs/cluster.md): the node registry, placement, and the
// directory of which node holds which sandbox and session. It answers the
// SDK entry for the whole cluster: a create or open is placed on a node and
// forwarded there, and the reply names the node's SDK address, where the
// SDK then sends that sandbox's (session's) calls itself. A call naming a
// sandbox or session that reaches the controller anyway (an attach, dsecctl)
// is forwarded to its node, or answered "lost" with the node's name. This
// file: the table's calls; its other parts are nodes.cpp (joins,
// heartbeats), forward.cpp (to the node that holds it, placement),
// restart.cpp (restartable sessions) and admin.cpp (the console).
#include <spdlog/logger.h>

#include <optional>

#include "actors/controller/forward.hpp"
#include "actors/node/image_worker.hpp"
#include "actors/node/session.hpp"
#include "actors/sandbox_list.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/files.hpp"
#include "state/group_commit.hpp"
#include "state/table.hpp"

namespace dsec {

using namespace controller_detail;  // NOLINT: this file is its other half

namespace {

// A node's snapshots: in role all, the node's own; in a cluster, every
// node that is up is asked (a snapshot lives on one): lists are merged, and
// a name is answered by the node that has it.
v1::SnapshotsReply Merged(std::vector<v1::SnapshotsReply> replies) {
  v1::SnapshotsReply out;
  for (auto& r : replies) {
    if (r.status().code() != v1::Status::OK && out.status().code() == v1::Status::OK) *out.mutable_status() = r.status();
    for (auto& s : *r.mutable_snapshots()) *out.add_snapshots() = std::move(s);
  }
  return out;
}
v1::SnapshotReply Merged(std::vector<v1::SnapshotReply> replies) {
  v1::SnapshotReply miss =
      ErrorReply<v1::SnapshotReply>(Status::NotFound("no node that is up has that snapshot (dsecctl snapshot ls)"));
  for (auto& r : replies) {
    if (r.status().code() == v1::Status::OK || r.status().code() != v1::Status::NOT_FOUND) return std::move(r);
    miss = std::move(r);
  }
  return miss;
}

// Asks every node that is up; `then` gets the merged answer.
template <class Reply, class Req>
void AskSnapshotNodes(Self self, const Req& req, std::function<void(Self, Reply&)> then) {
  std::vector<std::string> up;
  for (const auto& [id, n] : self->state.nodes)
    if (n.up()) up.push_back(id);
  if (up.empty()) {
    Reply r = Merged(std::vector<Reply>{});
    then(self, r);
    return;
  }
  struct Gather {
    std::vector<Reply> replies;
    size_t waiting = 0;
  };
  auto g = std::make_shared<Gather>();
  g->waiting = up.size();
  for (const auto& node : up)
    Forward<Reply>(self, node, "the snapshots of node " + node, req, kCallTimeout, [self, g, then](Reply r) {
      g->replies.push_back(std::move(r));
      if (--g->waiting) return;
      Reply merged = Merged(std::move(g->replies));
      then(self, merged);
    });
}

template <class Reply, class Req>
caf::result<Reply> ToSnapshotNodes(Self self, Req& req) {
  if (auto local = InProcess(self); local && self->state.nodes.size() == 1) return self->delegate(local, std::move(req));
  auto rp = self->make_response_promise<Reply>();
  AskSnapshotNodes<Reply>(self, req, [rp](Self, Reply& r) mutable { rp.deliver(std::move(r)); });
  return rp;
}

// Where a create's answer is recorded: the placement of a sandbox made.
void Placed(Self self, const std::string& node, const std::string& id, v1::SandboxReply* r) {
  auto& st = self->state;
  state::WriteBatch b;
  if (r->status().code() == v1::Status::OK) {
    PutPlacement(&b, SandboxKey(id), node);
    Decorate(self, node, r);
  } else if (r->status().code() != v1::Status::ALREADY_EXISTS) {
    if (auto it = st.sandbox_node.find(id); it != st.sandbox_node.end() && it->second == node) st.sandbox_node.erase(it);
  }
  Persist(self, std::move(b));
}

// A sandbox from a snapshot goes to the node that has the snapshot.
caf::result<v1::SandboxReply> CreateFromSnapshot(Self self, v1::CreateRequest& req) {
  auto& st = self->state;
  if (auto local = InProcess(self); local && st.nodes.size() == 1) return self->delegate(local, std::move(req));
  if (req.id().empty()) req.set_id("sb-" + RandomHex(12));
  if (!ValidId(req.id()))
    return ErrorReply<v1::SandboxReply>(
        Status::InvalidArgument("sandbox id '" + req.id().substr(0, 64) + "' is not [a-z0-9-], 1 to 64 bytes"));
  auto rp = self->make_response_promise<v1::SandboxReply>();
  v1::GetSnapshotRequest get;
  get.set_name(req.spec().snapshot());
  auto shared_req = std::make_shared<v1::CreateRequest>(std::move(req));
  AskSnapshotNodes<v1::SnapshotReply>(self, get, [rp, shared_req](Self self, v1::SnapshotReply& found) mutable {
    if (found.status().code() != v1::Status::OK) {
      rp.deliver(ErrorReply<v1::SandboxReply>(FromProto(found.status())));
      return;
    }
    std::string n = found.snapshot().node(), id = shared_req->id();
    self->state.sandbox_node[id] = n;
    Forward<v1::SandboxReply>(self, n, "sandbox " + id, std::move(*shared_req), kCallTimeout,
                              [self, rp, n, id](v1::SandboxReply r) mutable {
                                Placed(self, n, id, &r);
                                rp.deliver(std::move(r));
                              });
  });
  return rp;
}

caf::result<v1::SandboxReply> Create(Self self, v1::CreateRequest& req) {
  if (!req.spec().snapshot().empty()) return CreateFromSnapshot(self, req);
  auto& st = self->state;
  if (!st.in_process.empty()) {  // role all: the node's own id checks and errors
    auto node = Place(self, req.spec());
    if (!node.ok()) return ErrorReply<v1::SandboxReply>(node.status());
    if (auto local = InProcess(self, *node)) return self->delegate(local, std::move(req));
  }
  if (req.id().empty()) req.set_id("sb-" + RandomHex(12));
  const std::string id = req.id();
  if (auto it = st.sandbox_node.find(id); it != st.sandbox_node.end())
    return ToSandboxNode<v1::SandboxReply>(self, id, req);  // its node says it is taken
  if (!ValidId(id))
    return ErrorReply<v1::SandboxReply>(
        Status::InvalidArgument("sandbox id '" + id.substr(0, 64) + "' is not [a-z0-9-], 1 to 64 bytes"));
  auto node = Place(self, req.spec());
  if (!node.ok()) return ErrorReply<v1::SandboxReply>(node.status());
  st.sandbox_node[id] = *node;
  auto rp = self->make_response_promise<v1::SandboxReply>();
  std::string n = *node;
  auto spec = req.spec();
  auto shared_req = std::make_shared<v1::CreateRequest>(std::move(req));
  EnsureImage(self, n, spec, [self, rp, n, id, shared_req](Status ready) mutable {
    if (!ready.ok()) {
      auto& st = self->state;
      if (auto it = st.sandbox_node.find(id); it != st.sandbox_node.end() && it->second == n) st.sandbox_node.erase(it);
      rp.deliver(ErrorReply<v1::SandboxReply>(ready));
      return;
    }
  Forward<v1::SandboxReply>(self, n, "sandbox " + id, std::move(*shared_req), kCallTimeout,
                            [self, rp, n, id](v1::SandboxReply r) mutable {
                              Placed(self, n, id, &r);
                              rp.deliver(std::move(r));
                            });
  });
  return rp;
}

caf::result<v1::SessionReply> OpenSession(Self self, v1::OpenSessionRequest& req) {
  auto& st = self->state;
  const std::string name = req.name();
  if (st.session_node.count(name)) return ToSessionNode<v1::SessionReply>(self, name, req);
  if (Status ok = CheckSessionName(name); !ok.ok()) return ErrorReply<v1::SessionReply>(ok);
  // A fork of a session goes where that session is: its log is copied
  // there, and its agent starts from a snapshot there.
  Result<std::string> node = Status::NotFound("");
  if (auto src = st.session_node.find(req.fork_of().session()); req.has_fork_of() && src != st.session_node.end())
    node = src->second;
  else
    node = Place(self, req.spec());
  if (!node.ok()) return ErrorReply<v1::SessionReply>(node.status());
  // A restartable one is opened as in a cluster: its steps come here.
  if (auto local = InProcess(self, *node); local && !req.restartable()) return self->delegate(local, std::move(req));
  st.session_node[name] = *node;
  auto rp = self->make_response_promise<v1::SessionReply>();
  std::string n = *node;
  std::optional<v1::OpenSessionRequest> restartable;
  if (req.restartable()) restartable = req;
  auto spec = req.spec();
  auto shared_req = std::make_shared<v1::OpenSessionRequest>(std::move(req));
  EnsureSessionImages(self, n, *shared_req, [self, rp, n, name, restartable, shared_req](Status ready) mutable {
    if (!ready.ok()) {
      auto& st = self->state;
      if (auto it = st.session_node.find(name); it != st.session_node.end() && it->second == n) st.session_node.erase(it);
      rp.deliver(ErrorReply<v1::SessionReply>(ready));
      return;
    }
  Forward<v1::SessionReply>(self, n, "session " + name, std::move(*shared_req), kCallTimeout,
                            [self, rp, n, name, restartable](v1::SessionReply r) mutable {
                              auto& st = self->state;
                              state::WriteBatch b;
                              if (r.status().code() == v1::Status::OK && restartable &&
                                  r.session().step_count() > 0 && !st.restartable.count(name)) {
                                // It was open already, not restartable (the
                                // directory had not heard of it): its log
                                // has no copy here to go on from.
                                ToProto(Status::FailedPrecondition(
                                            "session " + name + " is already open and was not opened restartable (" +
                                            std::to_string(r.session().step_count()) +
                                            " steps logged without a copy here); a session is made restartable "
                                            "when it is first opened: use a new name"),
                                        r.mutable_status());
                              }
                              if (r.status().code() == v1::Status::OK) {
                                if (restartable) {
                                  st.restartable[name].open = *restartable;
                                  b.Put(state::Table::kPlacements, RestartableKey(name),
                                        restartable->SerializeAsString());
                                }
                                PutPlacement(&b, SessionKey(name), n);
                                for (const auto& sb : r.session().sandboxes()) {
                                  if (sb.id().empty()) continue;
                                  st.sandbox_node[sb.id()] = n;
                                  PutPlacement(&b, SandboxKey(sb.id()), n);
                                }
                                Decorate(self, n, &r);
                              } else if (auto it = st.session_node.find(name);
                                         it != st.session_node.end() && it->second == n) {
                                st.session_node.erase(it);
                              }
                              Persist(self, std::move(b));
                              rp.deliver(std::move(r));
                            });
  });
  return rp;
}

// ---- the table's calls (wire/calls.hpp) -------------------------------------

// How long a call forwarded to a node may take: a run's own limit and a
// margin, or kCallTimeout.
template <class Req>
std::chrono::milliseconds Timeout(const Req&) { return kCallTimeout; }
std::chrono::milliseconds Timeout(const v1::ExecRequest& req) { return ExecTimeout(req); }

caf::result<v1::RunReply> Handle(Self self, v1::RunRequest& req) {
  auto node = Place(self, req.spec());
  if (!node.ok()) return ErrorReply<v1::RunReply>(node.status());
  if (auto local = InProcess(self, *node)) return self->delegate(local, std::move(req));
  auto rp = self->make_response_promise<v1::RunReply>();
  auto timeout = ExecTimeout(req.exec());
  Forward<v1::RunReply>(self, *node, "a run", std::move(req), timeout,
                        [rp](v1::RunReply r) mutable { rp.deliver(std::move(r)); });
  return rp;
}

caf::result<v1::SandboxReply> Handle(Self self, v1::CreateRequest& req) { return Create(self, req); }
caf::result<v1::SessionReply> Handle(Self self, v1::OpenSessionRequest& req) { return OpenSession(self, req); }

caf::result<v1::StepReply> Handle(Self self, v1::StepRequest& req) {
  auto re = self->state.restartable.find(req.session());
  if (re != self->state.restartable.end()) return RestartableStep(self, re->second, req);
  auto timeout = ExecTimeout(req.exec());
  return ToSessionNode<v1::StepReply>(self, req.session(), req, timeout);
}

// A grade runs up to its spec's timeout (at most an hour) on the node.
caf::result<v1::StepReply> Handle(Self self, v1::GradeRequest& req) {
  auto re = self->state.restartable.find(req.session());
  if (re != self->state.restartable.end()) return RestartableGrade(self, re->second, req);
  return ToSessionNode<v1::StepReply>(self, req.session(), req, std::chrono::hours(1) + kCallTimeout);
}

caf::result<v1::SessionReply> Handle(Self self, v1::CloseSessionRequest& req) {
  auto re = self->state.restartable.find(req.name());
  if (re == self->state.restartable.end()) return ToSessionNode<v1::SessionReply>(self, req.name(), req);
  // A restartable session: closed on its node, and its copy here goes
  // (a session that could not go on is closed here even if its node
  // no longer has it).
  auto it = self->state.session_node.find(req.name());
  std::string name = req.name();
  auto forget = [self, name] {
    state::WriteBatch b;
    ForgetRestartable(self, name, &b);
    Persist(self, std::move(b));
  };
  // One that could not go on is closed here at once: its trainer does
  // not wait on a node (maybe just back, busy re-adopting) for a copy
  // that has nothing left to do; that copy is closed after the answer.
  bool failed = !re->second.failed.empty();
  if (failed || it == self->state.session_node.end()) {
    forget();
    if (it != self->state.session_node.end())
      Forward<v1::SessionReply>(self, it->second, "session " + name, std::move(req), kCallTimeout,
                                [](v1::SessionReply) {});
    return ErrorReply<v1::SessionReply>(Status::Ok());
  }
  // (The promise takes the request's answer over: made only here, where
  // it is the answer; a value returned after it would be dropped.)
  auto rp = self->make_response_promise<v1::SessionReply>();
  std::string node = it->second;
  Forward<v1::SessionReply>(self, node, "session " + name, std::move(req), kCallTimeout,
                            [self, rp, node, forget](v1::SessionReply r) mutable {
                              if (r.status().code() == v1::Status::OK) forget();
                              Decorate(self, node, &r);
                              rp.deliver(std::move(r));
                            });
  return rp;
}

void Handle(Self self, v1::AnnotateBatch& batch) {
  // The SDK sends a session's annotations to its node; any that come
  // here are forwarded one by one and answered the same way.
  if (auto local = InProcess(self)) {
    self->delegate(local, std::move(batch));
    return;
  }
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (!sender) return;
  for (auto& call : *batch.mutable_calls()) {
    uint64_t id = call.call_id();
    auto answer = [self, sender, id](v1::StepReply r) {
      v1::AnnotateResults out;
      auto* one = out.add_results();
      one->set_call_id(id);
      *one->mutable_reply() = std::move(r);
      caf::anon_send(sender, std::move(out));
    };
    auto it = self->state.session_node.find(call.request().session());
    if (it == self->state.session_node.end()) {
      answer(ErrorReply<v1::StepReply>(
          Status::NotFound("no session '" + call.request().session() + "' in this cluster")));
      continue;
    }
    Forward<v1::StepReply>(self, it->second, "session " + call.request().session(),
                           std::move(*call.mutable_request()), kCallTimeout, answer);
  }
}

// Owners are tracked by the nodes their sandboxes are on; in role all the
// trainer's connection is to this controller, so its Hello goes on.
void Handle(Self self, v1::Hello& hello) {
  if (auto local = InProcess(self)) self->delegate(local, hello);
}

caf::result<v1::StepsReply> Handle(Self self, v1::ListStepsRequest& req) {
  auto re = self->state.restartable.find(req.session());
  if (re == self->state.restartable.end()) return ToSessionNode<v1::StepsReply>(self, req.session(), req);
  // A restarted session's node holds the re-run; the log is the copy.
  auto it = self->state.session_node.find(req.session());
  if (it == self->state.session_node.end())
    return ErrorReply<v1::StepsReply>(Status::NotFound("no session '" + req.session() + "' in this cluster"));
  auto rp = self->make_response_promise<v1::StepsReply>();
  std::string name = req.session();
  Forward<v1::StepsReply>(self, it->second, "session " + name, std::move(req), kCallTimeout,
                          [self, rp, name](v1::StepsReply r) mutable {
                            for (auto& step : *r.mutable_steps())
                              if (auto copy = CopiedStep(self, name, step.index()); copy.ok())
                                step = std::move(*copy);
                            rp.deliver(std::move(r));
                          });
  return rp;
}

// Images: this controller's registry; nodes fetch from it (EnsureImage).
caf::result<v1::ImageReply> Handle(Self self, v1::RegisterImageRequest& req) {
  if (!self->state.images) return NoRegistry<v1::ImageReply>(self, req);
  auto rp = self->make_response_promise<v1::ImageReply>();
  self->request(self->state.images, caf::infinite, std::move(req))
      .then([self, rp](v1::ImageReply& r) mutable {
        if (r.status().code() == v1::Status::OK) self->state.image_by_name[r.image().name()] = r.image();
        rp.deliver(std::move(r));
      });
  return rp;
}

caf::result<v1::ImageReply> Handle(Self self, v1::RemoveImageRequest& req) {
  if (!self->state.images) return NoRegistry<v1::ImageReply>(self, req);
  auto rp = self->make_response_promise<v1::ImageReply>();
  std::string name = req.name();
  self->request(self->state.images, caf::infinite, std::move(req))
      .then([self, rp, name](v1::ImageReply& r) mutable {
        if (r.status().code() == v1::Status::OK) self->state.image_by_name.erase(name);
        rp.deliver(std::move(r));
      });
  return rp;
}

// Every node's sandboxes: the same page asked of each node that is up,
// merged (a node that is down is not asked: its sandboxes come back with it).
caf::result<v1::ListSandboxesReply> Handle(Self self, v1::ListSandboxesRequest& req) {
  if (Status s = CheckListRequest(req); !s.ok()) return ErrorReply<v1::ListSandboxesReply>(s);
  if (auto local = InProcess(self); local && self->state.nodes.size() == 1) return self->delegate(local, std::move(req));
  std::vector<std::string> up;
  for (const auto& [id, n] : self->state.nodes)
    if (n.up() && (req.node().empty() || req.node() == id)) up.push_back(id);
  if (up.empty() && !req.node().empty() && !self->state.nodes.count(req.node()))
    return ErrorReply<v1::ListSandboxesReply>(
        Status::NotFound("no node '" + req.node() + "' in this cluster (dsecctl nodes lists them)"));
  if (up.empty()) return v1::ListSandboxesReply();
  struct Gather {
    caf::typed_response_promise<v1::ListSandboxesReply> rp;
    v1::ListSandboxesRequest req;
    std::vector<v1::ListSandboxesReply> pages;
    size_t waiting = 0;
  };
  auto g = std::make_shared<Gather>();
  g->rp = self->make_response_promise<v1::ListSandboxesReply>();
  g->req = req;
  g->waiting = up.size();
  for (const auto& node : up) {
    Forward<v1::ListSandboxesReply>(self, node, "a list of node " + node + "'s sandboxes", req, kCallTimeout,
                                    [self, g, node](v1::ListSandboxesReply page) {
                                      if (auto* a = SdkAddress(self, node))
                                        for (auto& r : *page.mutable_sandboxes()) r.set_node_address(*a);
                                      g->pages.push_back(std::move(page));
                                      if (--g->waiting == 0) g->rp.deliver(MergeListPages(g->req, std::move(g->pages)));
                                    });
  }
  return g->rp;
}

// The image list, with what each node's chunk cache holds of each image
// (its heartbeats' image_cached).
caf::result<v1::ImagesReply> Handle(Self self, v1::ListImagesRequest& req) {
  if (!self->state.images) return NoRegistry<v1::ImagesReply>(self, req);
  auto rp = self->make_response_promise<v1::ImagesReply>();
  self->request(self->state.images, caf::infinite, std::move(req))
      .then(
          [self, rp](v1::ImagesReply& r) mutable -> void {
            for (auto& m : *r.mutable_images())
              for (const auto& [id, n] : self->state.nodes) {
                auto held = n.rec.load().image_cached().find(m.digest());
                if (held != n.rec.load().image_cached().end()) (*m.mutable_cached_on())[id] = held->second;
              }
            rp.deliver(std::move(r));
          },
          [rp](caf::error& e) mutable -> void { rp.deliver(std::move(e)); });
  return rp;
}

// The rest, by route: to the node that holds the sandbox or the session;
// images to this controller's registry (or, in role all, the node's).
template <class Req>
caf::result<calls::ReplyOf<Req>> Handle(Self self, Req& req) {
  using C = typename calls::CallOf<Req>::type;
  using Reply = typename C::Reply;
  if constexpr (C::route == calls::Route::kSandbox) {
    return ToSandboxNode<Reply>(self, C::Key(req), req, Timeout(req));
  } else if constexpr (C::route == calls::Route::kSession) {
    return ToSessionNode<Reply>(self, C::Key(req), req, Timeout(req));
  } else if constexpr (C::route == calls::Route::kImages) {
    if (!self->state.images) return NoRegistry<Reply>(self, req);
    return self->delegate(self->state.images, std::move(req));
  } else if constexpr (C::route == calls::Route::kSnapshots) {
    return ToSnapshotNodes<Reply>(self, req);
  } else {
    static_assert(sizeof(Req) == 0, "the controller has no handler for this call (wire/calls.hpp)");
  }
}

// Empty when the current message comes from a node that is up (its actor
// system is one of theirs); else why not, logged.
std::string FromNode(Self self) {
  const auto& sender = self->current_sender();
  if (sender)
    for (const auto& [id, n] : self->state.nodes)
      if (n.up() && !n.in_process && n.entry.node() == sender->node()) return {};
  std::string who = sender ? caf::to_string(sender->node()) : std::string("an anonymous sender");
  self->state.ctx->log->warn("image service: refused a chunk request from {}, which is not a node that is up", who);
  return "the sender (" + who + ") is not a node that is up";
}

controller_actor::behavior_type ControllerActor(Self self, std::shared_ptr<ControllerContext> ctx) {
  self->state.ctx = std::move(ctx);
  Load(self);
  if (self->state.ctx->image_ctx) {
    self->state.images = SpawnImageWorker(self, self->state.ctx->image_ctx);
    self->link_to(self->state.images);
    Status loaded = state::TypedTable<v1::ImageManifest>(self->state.ctx->store, state::Table::kImages)
                        .Scan("", [&](const std::string& name, v1::ImageManifest&& m) {
                          self->state.image_by_name[name] = std::move(m);
                          return true;
                        });
    if (!loaded.ok())
      self->state.ctx->log->error("controller: its images (placement does not know them until re-registered): {}",
                                  loaded.message());
  }
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.node_of.find(dm.source);
    if (it == st.node_of.end()) return;
    auto n = st.nodes.find(it->second);
    if (n != st.nodes.end()) MarkDown(self, n->second, "connection lost (" + caf::to_string(dm.reason) + ")");
  });
  self->send(self, Continuation{[self] { Tick(self); }});
  // The table's calls (wire/calls.hpp), each to its Handle above.
  auto table = calls::Handlers(calls::All{}, [self](auto& req) { return Handle(self, req); });
  return calls::MakeBehavior<controller_actor::behavior_type>(
      std::move(table),
      [self](admin_atom, const std::string& cmd, const std::vector<std::string>& args) -> caf::result<std::string> {
        return Admin(self, cmd, args);
      },
      [](Continuation& c) { c.fn(); },
      [self](join_atom, cluster::v1::NodeJoin& j, caf::actor& entry) { return Join(self, j, std::move(entry)); },
      [self](beat_atom, const std::string& id, cluster::v1::NodeLoad& load) { Beat(self, id, load); },
      [self](chunks_atom a, std::vector<std::string>& digests) -> caf::result<std::vector<std::string>> {
        if (!self->state.images)
          return caf::make_error(caf::sec::invalid_argument, "this controller has no image registry");
        if (auto who = FromNode(self); !who.empty())
          return caf::make_error(caf::sec::invalid_argument, "chunks are served to this cluster's nodes only; " + who);
        return self->delegate(self->state.images, a, std::move(digests));
      },
      [self](prefetch_atom a, cluster::v1::ChunkMap& map) {
        if (self->state.images && FromNode(self).empty()) self->send(self->state.images, a, std::move(map));
      });
}

}  // namespace

controller_actor SpawnController(caf::actor_system& sys, std::shared_ptr<ControllerContext> ctx) {
  return sys.spawn(ControllerActor, std::move(ctx));
}

}  // namespace dsec
