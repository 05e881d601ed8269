// The sandboxes a session owns: created under ids chosen (and written)
// first, found again after a crash, destroyed with the session.
#include "actors/node/session_internal.hpp"

#include "dsec/status_proto.hpp"
#include "state/table.hpp"

namespace dsec::session_detail {

// Creates the sandbox of role `i` under its chosen id, or finds it already
// there (an earlier attempt got that far). `done` gets Ok once it runs.
void EnsureSandbox(Self self, int i, int attempt, std::function<void(const Status&)> done) {
  auto& st = self->state;
  const auto& sb = st.rec.sandboxes(i);
  v1::CreateRequest req;
  *req.mutable_spec() = sb.spec();
  req.set_id(sb.id());
  req.set_session(st.rec.name());  // it ends with the session: no ttl, idle timeout or owner of its own
  std::string what = "session " + st.rec.name() + ": sandbox " + sb.id() + " (" + sb.role() + ")";
  self->request(st.node, kNodeMargin, std::move(req))
      .then(
          [self, i, attempt, done, what](v1::SandboxReply& r) {
            Status s = FromProto(r.status());
            if (s.ok()) return done(Status::Ok());
            auto phase = r.sandbox().phase();
            if (s.code() == Status::Code::kAlreadyExists) {
              if (phase == v1::SANDBOX_PHASE_RUNNING || phase == v1::SANDBOX_PHASE_PAUSED) return done(Status::Ok());
              if ((phase == v1::SANDBOX_PHASE_PENDING || phase == v1::SANDBOX_PHASE_STARTING) && attempt < 600) {
                // Still being created by an earlier attempt: look again soon.
                self->delayed_send(
                    caf::actor_cast<session_actor>(self), std::chrono::milliseconds(100),
                    Continuation{[self, i, attempt, done] { EnsureSandbox(self, i, attempt + 1, done); }});
                return;
              }
              return done(Status::Unavailable(what + " is " + PhaseName(phase) +
                                              (r.sandbox().error().empty() ? "" : ": " + r.sandbox().error())));
            }
            done(s.Annotate(what));
          },
          [done, what](caf::error& e) { done(Status::Unavailable(what + ": " + caf::to_string(e))); });
}

// Destroys every sandbox the session owns (best effort: a sandbox already
// gone is fine); `done` runs once all have answered.
void DestroySandboxes(Self self, std::function<void()> done) {
  auto& st = self->state;
  std::vector<std::string> ids;
  for (const auto& sb : st.rec.sandboxes())
    if (!sb.id().empty()) ids.push_back(sb.id());
  // A grade begun and not ended: its sandbox too (session_grade.cpp).
  if (st.rec.grading()) ids.push_back(GradeSandboxId(st.rec, st.rec.grading() - 1));
  if (ids.empty()) return done();
  auto left = std::make_shared<size_t>(ids.size());
  for (const auto& id : ids) {
    v1::DestroyRequest req;
    req.set_sandbox_id(id);
    auto one = [self, left, done, id](const Status& s) {
      if (!s.ok() && s.code() != Status::Code::kNotFound)
        self->state.ctx->log->warn("session {}: destroying sandbox {}: {}", self->state.rec.name(), id, s.message());
      if (--*left == 0) done();
    };
    self->request(st.node, kNodeMargin, std::move(req))
        .then([one](v1::SandboxReply& r) { one(FromProto(r.status())); },
              [one](caf::error& e) { one(Status::Unavailable(caf::to_string(e))); });
  }
}

// Creates the sandboxes not created yet, then marks the session ready
// (durably). On failure nothing is left: what it created goes, and so does
// the record (no step can have run), so the trainer may simply retry the open.
void CreateSandboxes(Self self, std::function<void(const Status&)> done) {
  auto& st = self->state;
  auto left = std::make_shared<int>(0);
  auto first_error = std::make_shared<Status>(Status::Ok());
  for (const auto& sb : st.rec.sandboxes())
    if (!sb.id().empty()) ++*left;
  // Nothing of a failed open stays: its sandboxes, then its record.
  auto abandon = [self, done](const Status& why) {
    self->state.ctx->log->warn("{}", why.message());
    DestroySandboxes(self, [self, why, done] {
      auto& st = self->state;
      st.rec.set_phase(v1::SESSION_PHASE_FAILED);
      st.rec.set_error(why.message());
      state::WriteBatch b;
      b.Delete(state::Table::kSessions, st.rec.name());
      Persist(self, std::move(b), [why, done](const Status&) { done(why); });
    });
  };
  auto all_done = [self, first_error, done, abandon]() {
    auto& st = self->state;
    if (!first_error->ok()) return abandon(*first_error);
    st.rec.set_ready(true);
    PersistRecord(self, [self, done, abandon](const Status& w) {
      if (!w.ok()) return abandon(w.Annotate("session " + self->state.rec.name() + ": open"));
      done(Status::Ok());
    });
  };
  if (*left == 0) return all_done();
  for (int i = 0; i < st.rec.sandboxes_size(); ++i) {
    if (st.rec.sandboxes(i).id().empty()) continue;
    EnsureSandbox(self, i, 0, [left, first_error, all_done](const Status& s) {
      if (!s.ok() && first_error->ok()) *first_error = s;
      if (--*left == 0) all_done();
    });
  }
}

}  // namespace dsec::session_detail
