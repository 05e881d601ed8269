#include "actors/node/supervisor.hpp"

#include <algorithm>
#include <type_traits>

#include "state/table.hpp"

namespace dsec {

namespace {

// What differs between the two kinds of child: its table's row, and the
// record in it.
template <class Row>
struct Child;

template <>
struct Child<store::v1::SandboxRow> {
  static constexpr state::Table kTable = state::Table::kSandboxes;
  static constexpr const char* kWhat = "sandbox";
  static v1::SandboxRecord* Rec(store::v1::SandboxRow* row) { return row->mutable_record(); }
  static void Fail(v1::SandboxRecord* r, const std::string& error) {
    r->set_phase(v1::SANDBOX_PHASE_FAILED);
    r->set_error(error);
  }
  static std::string Restarted(const v1::SandboxRecord&) { return "restarted from its checkpoint"; }
};

template <>
struct Child<v1::SessionRecord> {
  static constexpr state::Table kTable = state::Table::kSessions;
  static constexpr const char* kWhat = "session";
  static v1::SessionRecord* Rec(v1::SessionRecord* row) { return row; }
  static void Fail(v1::SessionRecord* r, const std::string& error) {
    r->set_phase(v1::SESSION_PHASE_FAILED);
    r->set_error(error);
  }
  static std::string Restarted(const v1::SessionRecord& r) {
    return "restarted from its log (" + std::to_string(r.step_count()) + " steps)";
  }
};

}  // namespace

Supervisor::Supervisor(std::shared_ptr<NodeContext> ctx)
    : ctx_(std::move(ctx)),
      intensity_(ctx_->options.max_restarts, std::chrono::seconds(ctx_->options.restart_window_s)) {}

template <class Row>
std::optional<Row> Supervisor::Died(const std::string& tag, const std::string& key, const std::string& why) {
  using C = Child<Row>;
  constexpr bool kSession = std::is_same<Row, v1::SessionRecord>::value;
  auto& ctx = *ctx_;
  auto row = state::TypedTable<Row>(ctx.store, C::kTable).Get(key);
  if (!row.ok()) {
    if (kSession)
      ctx.log->warn("session {} died ({}) before it was durable; dropped", key, why);
    else
      ctx.log->error("sandbox {} died ({}) and has no checkpoint: {}", key, why, row.status().message());
    return std::nullopt;
  }
  auto* rec = C::Rec(&*row);
  std::string child = tag + key;
  if (!intensity_.Allow(child)) {
    ++gave_up_;
    rec->set_restarts(std::max(rec->restarts(), counts_[child]));
    C::Fail(rec, std::string(kSession ? "its actor " : "") + "crashed " +
                       std::to_string(ctx.options.max_restarts + 1) + " times within " +
                       std::to_string(ctx.options.restart_window_s) + " s; last: " + why);
    state::WriteBatch b;
    state::TypedTable<Row>(ctx.store, C::kTable).Put(&b, key, *row);
    ctx.committer->Submit(std::move(b), [log = ctx.log, key](const Status& w) {
      if (!w.ok()) log->warn("{} {}: writing it failed: {}", C::kWhat, key, w.message());
    });
    ctx.log->error("{} {}: {}; left failed", C::kWhat, key, rec->error());
    return std::move(*row);  // its actor still answers get and destroy (close)
  }
  ++restarts_;
  // Counted here and in the checkpoint: a crash before that write is done
  // still counts from here.
  uint32_t& count = counts_[child];
  count = std::max(count, rec->restarts()) + 1;
  rec->set_restarts(count);
  state::WriteBatch b;
  state::TypedTable<Row>(ctx.store, C::kTable).Put(&b, key, *row);
  ctx.committer->Submit(std::move(b), [log = ctx.log, key](const Status& w) {
    if (!w.ok()) log->warn("{} {}: writing its restart count: {}", C::kWhat, key, w.message());
  });
  ctx.log->warn("{} {} crashed ({}); {} (restart {} in the window)", C::kWhat, key, why, C::Restarted(*rec),
                intensity_.Recent(child));
  return std::move(*row);
}

std::optional<store::v1::SandboxRow> Supervisor::SandboxDied(const std::string& id, const std::string& why) {
  return Died<store::v1::SandboxRow>("sb/", id, why);
}

std::optional<v1::SessionRecord> Supervisor::SessionDied(const std::string& name, const std::string& why) {
  return Died<v1::SessionRecord>("se/", name, why);
}

void Supervisor::SandboxEnded(const std::string& id) {
  intensity_.Forget("sb/" + id);
  counts_.erase("sb/" + id);
}

void Supervisor::SessionEnded(const std::string& name) {
  intensity_.Forget("se/" + name);
  counts_.erase("se/" + name);
}

}  // namespace dsec
