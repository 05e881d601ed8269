// Restartable sessions (docs/cluster.md): the controller keeps a durable
// copy of their logs; when a session's node goes down it opens the session
// on another node and re-runs the logged steps there, stopping before a
// step marked not replayable.
#include <spdlog/logger.h>

#include <set>

#include "actors/controller/forward.hpp"
#include "actors/node/session.hpp"
#include "dsec/status_proto.hpp"
#include "state/group_commit.hpp"
#include "state/table.hpp"

namespace dsec::controller_detail {

void ForgetRestartable(Self self, const std::string& name, state::WriteBatch* b) {
  auto& st = self->state;
  b->Delete(state::Table::kPlacements, RestartableKey(name));
  b->DeletePrefix(state::Table::kSteps, state::StepPrefix(name));
  auto it = st.restartable.find(name);
  if (it == st.restartable.end()) return;
  std::set<std::string> held = std::move(it->second.left);
  if (auto on = st.session_node.find(name); on != st.session_node.end()) held.insert(on->second);
  for (const auto& node : held) {
    auto n = st.nodes.find(node);
    if (n == st.nodes.end() || n->second.up()) continue;
    st.closed_away[node].insert(name);
    b->Put(state::Table::kPlacements, ClosedAwayKey(node, name), "");
  }
  st.restartable.erase(it);
}

// Why node `id` cannot answer for `what` now.

Result<v1::StepRecord> CopiedStep(Self self, const std::string& name, uint64_t index) {
  return state::TypedTable<v1::StepRecord>(self->state.ctx->store, state::Table::kSteps)
      .Get(state::StepKey(name, index));
}

void EndRestart(Self self, const std::string& name, const std::string& failed) {
  auto it = self->state.restartable.find(name);
  if (it == self->state.restartable.end()) return;
  auto& r = it->second;
  std::string on = r.restarting_on;
  r.restarting_on.clear();
  if (!failed.empty()) {
    r.failed = failed;
    self->state.ctx->log->error("session {}: {}", name, failed);
    return;
  }
  r.moves++;
  self->state.ctx->log->info("session {} goes on on node {}: its {} logged step(s) re-ran there", name, on, r.logged);
}

// Re-runs step `i` and the ones after it of session `name` on `node`.
void Replay(Self self, const std::string& name, const std::string& node, const std::string& from, uint64_t i) {
  auto it = self->state.restartable.find(name);
  if (it == self->state.restartable.end()) return;
  auto& r = it->second;
  if (i >= r.logged) return EndRestart(self, name, "");
  auto step = CopiedStep(self, name, i);
  if (!step.ok()) return EndRestart(self, name, "cannot read step " + std::to_string(i) + " of its log's copy: " +
                                                    step.status().message());
  if (step->not_replayable()) {
    v1::CloseSessionRequest close;
    close.set_name(name);
    close.set_reason("its restart stopped before step " + std::to_string(i) + ", which is not replayable");
    Forward<v1::SessionReply>(self, node, "session " + name, close, kCallTimeout, [](v1::SessionReply) {});
    return EndRestart(self, name,
                      "cannot go on: its node " + from + " went down and step " + std::to_string(i) +
                          " is marked not replayable (it has effects outside the sandbox), so it was not re-run on "
                          "another node; its log up to there is kept (dsec-replay, Steps()); open a new session");
  }
  auto next = [self, name, node, from, i](v1::StepReply rep) {
    if (rep.status().code() != v1::Status::OK)
      return EndRestart(self, name,
                        "re-running step " + std::to_string(i) + " on node " + node + " failed: " + rep.status().message());
    Replay(self, name, node, from, i + 1);
  };
  if (step->sandbox() == kGradeRole) {
    // A grade is graded again there (its copy here stays what the trainer got).
    v1::GradeRequest grade;
    grade.set_session(name);
    grade.set_index(i);
    Forward<v1::StepReply>(self, node, "session " + name, std::move(grade), std::chrono::hours(1) + kCallTimeout,
                           std::move(next));
    return;
  }
  v1::StepRequest again;
  again.set_session(name);
  again.set_index(i);
  *again.mutable_exec() = step->request();
  again.set_sandbox(step->sandbox());
  *again.mutable_meta() = step->meta();
  auto timeout = ExecTimeout(again.exec());
  Forward<v1::StepReply>(self, node, "session " + name, std::move(again), timeout, std::move(next));
}

// Session `name` was on node `from`, which went down: open it on another
// node and re-run its log there.
void Restart(Self self, const std::string& name, const std::string& from) {
  auto& st = self->state;
  auto& r = st.restartable[name];
  if (!r.failed.empty() || !r.restarting_on.empty()) return;
  r.left.insert(from);
  auto target = Place(self, r.open.spec());
  if (!target.ok())
    return EndRestart(self, name, "its node " + from + " went down and no other node can take it: " +
                                      target.status().message());
  r.restarting_on = *target;
  st.ctx->log->warn("session {} was on node {}, which went down: opening it on node {} and re-running its {} step(s)",
                    name, from, *target, r.logged);
  std::string node = *target;
  EnsureSessionImages(self, node, r.open, [self, name, node, from](Status ready) {
    if (!ready.ok()) return EndRestart(self, name, ready.message());
    auto it = self->state.restartable.find(name);
    if (it == self->state.restartable.end()) return;
  Forward<v1::SessionReply>(self, node, "session " + name, it->second.open, kCallTimeout,
                            [self, name, node, from](v1::SessionReply rep) {
                              auto& st = self->state;
                              if (rep.status().code() != v1::Status::OK)
                                return EndRestart(self, name, "opening it again on node " + node + " failed: " +
                                                                  rep.status().message());
                              state::WriteBatch b;
                              st.session_node[name] = node;
                              PutPlacement(&b, SessionKey(name), node);
                              for (const auto& sb : rep.session().sandboxes()) {
                                if (sb.id().empty()) continue;
                                st.sandbox_node[sb.id()] = node;
                                PutPlacement(&b, SandboxKey(sb.id()), node);
                              }
                              Persist(self, std::move(b));
                              Replay(self, name, node, from, 0);
                            });
  });
}

namespace {

// A call that logs step `index` of restartable session `name` (a step or a
// grade): answered from the log's copy when it is there (a fast-forward;
// `differs` says why the copy does not answer this call), else run on its
// node and copied here (durably) before the trainer hears of it.
template <class Req>
caf::result<v1::StepReply> LoggedCall(Self self, Restartable& r, const std::string& name, uint64_t index, Req& req,
                                      std::chrono::milliseconds timeout,
                                      std::function<std::string(const v1::StepRecord&)> differs) {
  if (!r.failed.empty())
    return ErrorReply<v1::StepReply>(Status::FailedPrecondition("session " + name + " " + r.failed));
  if (!r.restarting_on.empty())
    return ErrorReply<v1::StepReply>(
        Status::Unavailable("session " + name + " is being restarted on node " + r.restarting_on +
                            " (its node went down); send the step again in a moment"));
  if (index < r.logged) {
    auto step = CopiedStep(self, name, index);
    if (!step.ok()) return ErrorReply<v1::StepReply>(step.status());
    if (std::string why = differs(*step); !why.empty())
      return ErrorReply<v1::StepReply>(Status::FailedPrecondition(
          "session " + name + " step " + std::to_string(index) + " is logged " + why));
    v1::StepReply reply;
    *reply.mutable_step() = std::move(*step);
    reply.set_fast_forwarded(true);
    return reply;
  }
  auto it = self->state.session_node.find(name);
  if (it == self->state.session_node.end())
    return ErrorReply<v1::StepReply>(Status::NotFound("no session '" + name + "' in this cluster"));
  auto rp = self->make_response_promise<v1::StepReply>();
  Forward<v1::StepReply>(
      self, it->second, "session " + name, std::move(req), timeout, [self, rp, name](v1::StepReply rep) mutable {
        auto re = self->state.restartable.find(name);
        if (rep.status().code() != v1::Status::OK || rep.fast_forwarded() || re == self->state.restartable.end() ||
            rep.step().index() < re->second.logged) {
          rp.deliver(std::move(rep));  // (deliver returns the promise: no `return rp.deliver`)
          return;
        }
        state::WriteBatch b;
        state::TypedTable<v1::StepRecord>(self->state.ctx->store, state::Table::kSteps)
            .Put(&b, state::StepKey(name, rep.step().index()), rep.step());
        re->second.logged = rep.step().index() + 1;
        auto handle = caf::actor_cast<controller_actor>(self);
        auto out = std::make_shared<v1::StepReply>(std::move(rep));
        self->state.ctx->committer->Submit(std::move(b), [handle, rp, out](const Status& w) mutable {
          Post(handle, [rp, out, w]() mutable {
            if (!w.ok())
              rp.deliver(ErrorReply<v1::StepReply>(
                  w.Annotate("the step ran but the controller could not keep its copy of the log")));
            else
              rp.deliver(std::move(*out));
          });
        });
      });
  return rp;
}

}  // namespace

caf::result<v1::StepReply> RestartableStep(Self self, Restartable& r, v1::StepRequest& req) {
  std::string role = req.sandbox().empty() ? "agent" : req.sandbox();
  std::vector<std::string> argv(req.exec().argv().begin(), req.exec().argv().end());
  auto timeout = ExecTimeout(req.exec());
  std::string name = req.session();
  return LoggedCall(self, r, name, req.index(), req, timeout, [argv, role](const v1::StepRecord& step) {
    const auto& a = step.request().argv();
    bool same = a.size() == static_cast<int>(argv.size()) && std::equal(a.begin(), a.end(), argv.begin()) &&
                step.sandbox() == role;
    return same ? std::string() : std::string("with another request; a replay must send the same steps");
  });
}

// A grade: logged like a step (role "grade"), re-run as a grade when the
// session moves.
caf::result<v1::StepReply> RestartableGrade(Self self, Restartable& r, v1::GradeRequest& req) {
  std::string name = req.session();
  return LoggedCall(self, r, name, req.index(), req, std::chrono::hours(1) + kCallTimeout,
                    [](const v1::StepRecord& step) {
                      return step.sandbox() == kGradeRole ? std::string()
                                                          : std::string("as a step, not a grade: grade at the log's end");
                    });
}

}  // namespace dsec::controller_detail
