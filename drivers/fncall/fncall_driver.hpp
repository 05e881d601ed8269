// FncallDriver: the dsecd side of the fncall kind. Starts dsec-spawner,
// speaks spawner.proto to it from one I/O thread, turns its Outcomes into
// ExecResults with verdicts, and restarts it (with an intensity limit) if it
// dies. A fncall "sandbox" has no resources of its own: every Exec is one
// fresh run.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "drivers/driver.hpp"
#include "drivers/spawner/spawner_link.hpp"
#include "dsec/status.hpp"

namespace dsec::spawner {
class Event;
}

namespace dsec::drivers {

struct FncallOptions {
  // The helper binary; default: dsec-spawner next to this executable (or $DSEC_SPAWNER).
  std::string spawner_path;
  uid_t uid = 65534;                   // sandbox user
  gid_t gid = 65534;
  size_t pool_size = 16;               // warm runners
  size_t max_runners = 1024;           // concurrent runs; more wait in the spawner's queue
  bool fresh_namespaces = false;       // new net+ipc namespaces per run instead of recycled ones
  std::string cgroup_parent = "dsec";  // <controller>/<parent>/sp<pid>/...
  uint64_t tmpfs_bytes = 1ull << 30;
  int start_timeout_ms = 30'000;       // wait for the spawner's hello
  // Spawner restarts allowed within restart_window_s before fncall is marked unavailable.
  int max_restarts = 5;
  int restart_window_s = 60;
  // Where the spawner's log lines go (level 0 debug .. 3 error). May be empty.
  std::function<void(int level, const std::string& text)> log;
};

class FncallDriver : public Driver {
 public:
  // Starts the spawner and waits for its hello. A host that cannot run fncall
  // sandboxes gives FailedPrecondition with the spawner's reason.
  static Result<std::unique_ptr<FncallDriver>> Start(FncallOptions options);
  ~FncallDriver() override;

  // Process isolation on the host's own files; nothing lives between calls.
  static const KindTraits& Traits();
  v1::Kind kind() const override { return v1::KIND_FNCALL; }
  const char* name() const override { return "fncall"; }
  const KindTraits& traits() const override { return Traits(); }
  Status Available() const override;
  Status CanHandle(const v1::SandboxSpec& spec) const override;
  void Create(const v1::SandboxRecord& sandbox, CreateCallback done) override;
  void Exec(const v1::SandboxRecord& sandbox, const std::string& run_id,
            const v1::ExecRequest& req, ExecCallback done) override;
  Status Kill(const std::string& run_id, const std::string& reason) override;
  void Destroy(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) override;
  void Readopt(const v1::SandboxRecord&, const std::string&, StatusCallback done) override { done(Available()); }
  std::string StatsJson() const override;

  // Sends Shutdown, waits for the spawner to clean up and exit, fails what is
  // still in flight. Idempotent; the destructor calls it.
  void Stop() override;
  pid_t spawner_pid() const { return link_ ? link_->pid() : -1; }


 private:
  explicit FncallDriver(FncallOptions options);
  void OnEvent(spawner::Event& ev);
  void OnGone(const std::string& why, bool stopping);

  struct InFlight {
    ExecCallback done;
    v1::Limits limits;
    std::string argv0;
    std::string run_id;
  };

  FncallOptions opts_;
  std::unique_ptr<SpawnerLink> link_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, InFlight> inflight_;      // by spawner run id
  std::unordered_map<std::string, uint64_t> by_run_id_;  // run id -> spawner run id
  uint64_t next_id_ = 1;
  std::string last_stats_json_ = "{}";
  std::atomic<uint64_t> runs_done_{0}, runs_failed_{0};
};

}  // namespace dsec::drivers
