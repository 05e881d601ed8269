// BoxDriver: what the kinds whose sandboxes are machines of their own
// (containers, microVMs, VMs) do alike, beyond AgentDriver's exec and files:
//
// - the box table: sandbox id -> its box, under mu_ (a kind keeps its own
//   tables under the same lock);
// - workers that keep blocking work (a kind's *Now functions: a boot, a
//   kill, a libvirt call) off actor threads: Work, or Answer(done, now);
// - the idle scan: a thread that shows every box to ScanIdle once a period
//   (a container is frozen, a guest gives back its page cache);
// - leftovers: what the last run left on disk (a sandbox's dir, a machine)
//   by name, noted at start, each claimed exactly once by the Readopt or the
//   creation of the same name, or removed by the sweep after the restore
//   (SweepLeftovers), with a creation that claims one meanwhile waiting for
//   its removal;
// - sandbox networking as the node gives it (DriverEnv::network): the
//   checks of a spec's policy, and changing and reporting a sandbox's;
// - a log whose lines name the kind.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "drivers/agent/agent_driver.hpp"
#include "drivers/net/policy.hpp"
#include "runtime/worker_pool.hpp"

namespace dsec::net {
class NodeNetwork;
}

namespace dsec::drivers {

class BoxDriver : public AgentDriver {
 public:
  ~BoxDriver() override;
  // NodeNetwork::Replace and Report, for a sandbox with a link.
  void SetNetwork(const v1::SandboxRecord& sandbox, const v1::NetworkPolicy& next, StatusCallback done) override;
  Result<v1::NetworkReport> Network(const v1::SandboxRecord& sandbox) const override;

 protected:
  using LogFn = std::function<void(int level, const std::string& text)>;
  BoxDriver(const char* kind_name, LogFn log) : kind_name_(kind_name), log_(std::move(log)) {}

  // --- the box table ---
  std::shared_ptr<AgentBox> FindBox(const std::string& id) const final;
  template <class B>
  std::shared_ptr<B> FindAs(const std::string& id) const {
    return std::static_pointer_cast<B>(FindBox(id));
  }
  // Every box now (a copy: the caller works without the lock).
  template <class B>
  std::vector<std::shared_ptr<B>> BoxesAs() const {
    std::vector<std::shared_ptr<B>> out;
    std::lock_guard<std::mutex> lk(mu_);
    out.reserve(boxes_.size());
    for (const auto& [id, b] : boxes_) out.push_back(std::static_pointer_cast<B>(b));
    return out;
  }
  // Puts `box` under box->id (replacing one there); with `if_absent`, only
  // when no box has that id (false then).
  bool PutBox(std::shared_ptr<AgentBox> box, bool if_absent = false);
  // Takes the box of `id` out of the table (null when there is none).
  std::shared_ptr<AgentBox> TakeBox(const std::string& id);
  size_t BoxCount() const;

  // --- workers ---
  void StartWorkers(int threads) { workers_.Start(threads); }
  void Work(std::function<void()> job) { workers_.Post(std::move(job)); }
  // Runs `now` on a worker and gives what it returns to `done`.
  template <class Done, class Now>
  void Answer(Done done, Now now) {
    Work([done = std::move(done), now = std::move(now)]() mutable { done(now()); });
  }
  // What is queued still runs; then the workers are joined.
  void StopWorkers() { workers_.Stop(); }

  // --- the idle scan ---
  // From here until StopIdleScan, ScanIdle sees every box once a `period`,
  // on the scan's own thread (blocking work goes to Work).
  void StartIdleScan(std::chrono::milliseconds period);
  void StopIdleScan();
  virtual void ScanIdle(const std::shared_ptr<AgentBox>& /*box*/, int64_t /*now_ms*/) {}
  // After each period's boxes (the scan's thread).
  virtual void ScanDone(int64_t /*now_ms*/) {}

  // --- leftovers of the last run ---
  // Found at start, before this run made anything.
  void NoteLeftover(const std::string& name) {
    std::lock_guard<std::mutex> lk(mu_);
    leftovers_.insert(name);
  }
  // True once for a leftover (its caller owns it from then on, to keep or
  // to remove); false otherwise, after waiting for the sweep to finish
  // removing it if it is doing so right now.
  bool ClaimLeftover(const std::string& name);
  bool IsLeftover(const std::string& name) const {
    std::lock_guard<std::mutex> lk(mu_);
    return leftovers_.count(name) > 0;
  }
  // After the restore: each leftover nobody claimed is removed with
  // `remove`, one at a time, saying why (`why`) in the log; how many went.
  size_t SweepLeftovers(const std::function<Status(const std::string&)>& remove, const std::string& why);

  // --- the log ---
  // A line of the log; `level` 0 debug .. 3 error.
  void Log(int level, const std::string& text) const {
    if (log_) log_(level, text);
  }
  // A line about one box: "<kind> <id>: <text>".
  void Say(int level, const std::string& id, const std::string& text) const {
    Log(level, std::string(kind_name_) + " " + id + ": " + text);
  }
  // Cleanup nobody waits for: a failure is logged (the next start's sweep
  // tries again) and never hides the answer the caller gets.
  void Removed(const Status& s, const std::string& what) const {
    if (!s.ok()) Log(2, "removing " + what + ": " + s.message() + " (the next start sweeps it)");
  }
  const char* kind_name() const { return kind_name_; }

  // --- networking ---
  struct NetworkEnv {
    net::NodeNetwork* network = nullptr;  // null: `unavailable` says why
    std::string unavailable;
    bool open = false;  // mode open allowed (dsecd --network-open)
  };
  void UseNetwork(NetworkEnv env) { net_ = std::move(env); }
  net::NodeNetwork* network() const { return net_.network; }
  // A link for `p`: any mode but none, or exposed ports.
  static bool NeedsLink(const net::Policy& p) { return p.mode != v1::NETWORK_MODE_NONE || !p.expose.empty(); }
  // Whether this node gives `spec` its network (for CanHandle): its policy
  // parses; a link, when it needs one, can be made (`gap`: why this kind
  // cannot link here, "" when it can); mode open is allowed.
  Status CheckNetwork(const v1::SandboxSpec& spec, const std::string& gap = "") const;

  mutable std::mutex mu_;  // the box table and leftovers; a kind's own tables too

 private:
  void IdleScanLoop(std::chrono::milliseconds period);

  const char* kind_name_;
  LogFn log_;
  NetworkEnv net_;
  std::unordered_map<std::string, std::shared_ptr<AgentBox>> boxes_;
  std::set<std::string> leftovers_;
  std::set<std::string> removing_;      // leftovers the sweep is removing now
  std::condition_variable removed_cv_;  // one of removing_ is gone (under mu_)
  WorkerPool workers_;
  std::mutex scan_mu_;
  std::condition_variable scan_cv_;
  bool scan_stop_ = false;
  std::thread scanner_;
};

}  // namespace dsec::drivers
