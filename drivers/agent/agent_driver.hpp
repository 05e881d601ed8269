// What every kind whose sandboxes are served by dsec-agent shares
// (containers, microVMs and VMs): exec with its defaults, the
// table of runs in flight and their kills, streamed output, files, the
// per-exec limit check, and the verdicts (drivers/verdict.hpp). A kind
// derives from AgentDriver, starts and stops its boxes, connects each box's
// agent (ConnectAgent, to wherever the kind's socket is) and says which box
// serves a sandbox (Running, Find).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "drivers/agent/agent_client.hpp"
#include "drivers/driver.hpp"

namespace dsec::drivers {

// One sandbox served by an agent: what the shared code needs of it. A
// kind's own box derives from it.
struct AgentBox {
  virtual ~AgentBox() = default;
  // Memory-limit kills in the box so far (0: the kind cannot tell); read
  // before and after an exec to tell an OOM kill from another SIGKILL.
  virtual uint64_t OomKills() const { return 0; }
  // The agent's own word that an exec was OOM-killed is taken (a VM: the
  // guest's cgroup counts, and the guest is the agent's anyway). Otherwise
  // only OomKills counts: a container's processes could fake it.
  virtual bool TrustsAgentOom() const { return false; }

  std::string id;
  v1::Limits limits;  // sandbox-wide, fixed at creation
  std::unique_ptr<AgentClient> agent;
  // Execs in flight and the last activity (a kind that puts idle boxes to
  // sleep reads them), under idle_mu.
  std::mutex idle_mu;
  int active = 0;
  int64_t last_active_ms = 0;
};

class AgentDriver : public Driver {
 public:
  // What a kind whose sandboxes are agent-served machines offers
  // (containers, VMs): state, files, pause, streaming, re-adoption, a
  // loopback of its own, at `isolation`.
  static KindTraits StatefulTraits(v1::Isolation isolation) {
    KindTraits t;
    t.isolation = isolation;
    t.stateful = true;
    t.files = true;
    t.pause = true;
    t.streaming = true;
    t.readoptable = true;
    t.own_loopback = true;
    return t;
  }
  void Exec(const v1::SandboxRecord& sandbox, const std::string& run_id, const v1::ExecRequest& req,
            ExecCallback done) override;
  void ExecStreaming(const v1::SandboxRecord& sandbox, const std::string& run_id, const v1::ExecRequest& req,
                     OutputCallback on_output, ExecCallback done) override;
  Status Kill(const std::string& run_id, const std::string& reason) override;
  // Memory, pids, CPU and disk are the whole sandbox's, set at creation: an
  // exec asking for other values is refused, naming the limit.
  Status CheckExecLimits(const v1::SandboxRecord& sandbox, const v1::Limits& asked) const override;
  void ReadFile(const v1::SandboxRecord& sandbox, const v1::ReadFileRequest& req, FileCallback done) override;
  void WriteFile(const v1::SandboxRecord& sandbox, const v1::WriteFileRequest& req, FileCallback done) override;
  void ListFiles(const v1::SandboxRecord& sandbox, const v1::ListFilesRequest& req, FileCallback done) override;
  void PathOp(const v1::SandboxRecord& sandbox, const v1::PathOpRequest& req, FileCallback done) override;
  void Process(const v1::SandboxRecord& sandbox, const v1::ProcessRequest& req, ProcessCallback done) override;
  std::function<void()> Watch(const v1::SandboxRecord& sandbox, const v1::WatchRequest& req, OutputCallback on_events,
                              StatusCallback done) override;
  // The system's, as its agent reads /proc: right for a VM guest (a kind
  // whose agent shares the host's /proc, a container, says its own).
  void Usage(const v1::SandboxRecord& sandbox, UsageCallback done) override;

 protected:
  // The box of a running sandbox with a connected agent, ready for a call
  // (a kind wakes a box it put to sleep); Unavailable naming it otherwise.
  virtual Result<std::shared_ptr<AgentBox>> RunningBox(const std::string& id) const = 0;
  // The box of `id` in whatever state, or null.
  virtual std::shared_ptr<AgentBox> FindBox(const std::string& id) const = 0;

  // Connects `box` to the agent listening at `socket` and waits up to
  // `timeout_ms` for its first answer. `log` gets the connection's warnings.
  // `vm_channel`: the socket is QEMU's end of a virtio-serial port, synced
  // first (AgentClient::ConnectChannel).
  Status ConnectAgent(AgentBox& box, const std::string& socket, int timeout_ms,
                      std::function<void(const std::string&)> log, bool vm_channel = false) const;
  size_t RunsInFlight() const;

 private:
  void StartExec(const v1::SandboxRecord& sandbox, const std::string& run_id, const v1::ExecRequest& req,
                 OutputCallback on_output, ExecCallback done);

  struct RunRef {
    std::string sandbox;
    uint64_t exec_id = 0;     // the agent's; 0 until it is known
    std::string kill_reason;  // set by Kill
  };
  mutable std::mutex runs_mu_;
  std::unordered_map<std::string, RunRef> runs_;  // run id -> where it runs
};

}  // namespace dsec::drivers
