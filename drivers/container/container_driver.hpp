// ContainerDriver: the dsecd side of the container kind. A container is an
// overlay (per-sandbox upper over the image's shared EROFS mount) with its
// own pid, mount, ipc, uts and net namespaces and cgroup, whose PID 1 is
// dsec-agent. The driver asks its spawner to create the init, talks to the
// agent over the unix socket in <data>/sandboxes/<id>/run/, and destroys a
// container by killing its cgroup. Containers outlive dsecd: after a restart
// Readopt reconnects to the agent from the record.
#pragma once

#include <condition_variable>
#include <deque>
#include <set>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "drivers/agent/agent_client.hpp"
#include "drivers/container/sandbox_disk.hpp"
#include "drivers/driver.hpp"
#include "drivers/fncall/cgroup_v1.hpp"
#include "drivers/images/mounts.hpp"
#include "drivers/spawner_link.hpp"

namespace dsec::drivers {

struct ContainerOptions {
  std::string data_dir;              // sandboxes/<id>/ and run/images/ live here
  std::string agent_path;            // dsec-agent; default next to this executable ($DSEC_AGENT)
  std::string spawner_path;          // default next to this executable ($DSEC_SPAWNER)
  std::string cgroup_parent = "dsec";  // groups: <controller>/<parent>/c/<sandbox id>
  size_t netns_pool = 16;            // net namespaces made ahead of need
  bool fresh_netns = false;          // a new net namespace per container, never a recycled one
  int agent_timeout_ms = 10'000;     // connect + first ping after create
  // A container with no exec, no file call and (almost) no CPU use for this
  // long is frozen (cgroup freezer) until the next call thaws it, which the
  // caller does not notice. 0: never.
  int64_t idle_freeze_ms = 300'000;
  // Per-sandbox disk limits: sandbox dirs live on a btrfs filesystem of
  // this size (sandbox_disk.hpp). Off, or unavailable on this host: no
  // disk limit is enforced (stats says why).
  bool disk_limits = true;
  uint64_t disk_size_bytes = 64ull << 30;
  // The image registry (the node's images table).
  std::function<Result<v1::ImageManifest>(const std::string& name)> find_image;
  std::function<void(int level, const std::string& text)> log;
};

class ContainerDriver : public Driver {
 public:
  static Result<std::unique_ptr<ContainerDriver>> Start(ContainerOptions options);
  ~ContainerDriver() override;

  v1::Kind kind() const override { return v1::KIND_CONTAINER; }
  const char* name() const override { return "container"; }
  Status Available() const override;
  Status CanHandle(const v1::SandboxSpec& spec) const override;
  Status CheckExecLimits(const v1::SandboxRecord& sandbox, const v1::Limits& asked) const override;
  void Create(const v1::SandboxRecord& sandbox, CreateCallback done) override;
  void Exec(const v1::SandboxRecord& sandbox, const std::string& run_id, const v1::ExecRequest& req,
            ExecCallback done) override;
  void ExecStreaming(const v1::SandboxRecord& sandbox, const std::string& run_id, const v1::ExecRequest& req,
                     OutputCallback on_output, ExecCallback done) override;
  Status Kill(const std::string& run_id, const std::string& reason) override;
  void ReadFile(const v1::SandboxRecord& sandbox, const v1::ReadFileRequest& req, FileCallback done) override;
  void WriteFile(const v1::SandboxRecord& sandbox, const v1::WriteFileRequest& req, FileCallback done) override;
  void ListFiles(const v1::SandboxRecord& sandbox, const v1::ListFilesRequest& req, FileCallback done) override;
  void Pause(const v1::SandboxRecord& sandbox, bool paused, StatusCallback done) override;
  void Destroy(const v1::SandboxRecord& sandbox, StatusCallback done) override;
  Status Readopt(const v1::SandboxRecord& sandbox) override;
  Result<uint64_t> DiskUsage(const v1::SandboxRecord& sandbox) const override;
  void Restored() override;
  std::string StatsJson() const override;

  // Image mounts, for the registry's "in use" check.
  std::vector<std::string> ImageUsers(const std::string& digest) const;
  void Stop();

 private:
  explicit ContainerDriver(ContainerOptions options);
  struct Box;
  void Work(std::function<void()> job);  // on the worker thread
  void WorkerLoop();
  void OnEvent(spawner::Event& ev);
  Result<std::string> CreateNow(const v1::SandboxRecord& sb);
  Status DestroyNow(const std::string& id, const std::string& held_digest);
  std::shared_ptr<Box> Find(const std::string& id) const;
  // The box of a running container with a live agent, or Unavailable.
  Result<std::shared_ptr<Box>> Running(const std::string& id) const;
  void StartExec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                 OutputCallback on_output, ExecCallback done);
  Status ConnectAgent(Box& box) const;
  // A group for a new container at `rel`: a recycled one renamed to it, or
  // a new one. The limits it holds (a recycled group keeps the last ones).
  Result<fncall::GroupLimits> TakeGroup(const std::string& rel);
  // A dead container's group: emptied and kept, with the limits it holds,
  // for the next container (up to kMaxFreeGroups), or removed. `box` is the
  // container when known (its init is then killed through its pid namespace).
  // True when no process is left in it (or it is gone).
  bool ReleaseGroup(const std::string& rel, Box* box);
  // A new container's dir, <data>/sandboxes/<id> with upper, work and run
  // (run/agent: the agent binary's mount point): a kept one renamed to it,
  // or a new one.
  Status TakeDir(const std::string& id);
  // A stopped container's dir: emptied and kept for the next container (up
  // to kMaxFreeGroups; its upper dir is made anew, as the container could
  // change the old one's mode, owner or ACLs), or removed.
  // `stopped`: no process of the container is left (else its dir is only
  // removed: a process still writing there must not reach the next one).
  void ReleaseDir(const std::string& id, bool stopped);
  // Thaws a container the idle timer froze and marks it active.
  static Status Wake(Box& box);
  void IdleLoop();
  void Log(int level, const std::string& text) const;

  ContainerOptions opts_;
  fncall::CgroupMounts cgm_;
  std::unique_ptr<images::ImageMounts> mounts_;
  std::string skeleton_;  // <data>/run/skeleton: the bottom overlay layer
  std::unique_ptr<SandboxDisk> disk_;  // null: no disk limits (disk_status_ says why)
  Status disk_status_;
  // Removes a sandbox dir (a subvolume when there is a disk).
  Status RemoveSandboxDir(const std::string& name);
  std::unique_ptr<SpawnerLink> link_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Box>> boxes_;
  std::unordered_map<uint64_t, std::promise<Result<int>>> creating_;  // spawner request id -> init pid
  struct RunRef {
    std::string sandbox;
    uint64_t exec_id = 0;      // the agent's; 0 until it is known
    std::string kill_reason;   // set by Kill
  };
  std::unordered_map<std::string, RunRef> runs_;  // run id -> where it runs
  uint64_t next_id_ = 1;
  // Recycled cgroups, <parent>/c/<group_tag_>.<n>: this data dir's only
  // (other dsecds may share the parent).
  static constexpr size_t kMaxFreeGroups = 256;
  std::string group_tag_;
  struct FreeGroup {
    std::string rel;
    fncall::GroupLimits limits;
  };
  std::vector<FreeGroup> free_groups_;
  uint64_t next_free_ = 0;
  // Kept sandbox dirs, <data>/sandboxes/free.<n> (removed at start-up).
  std::vector<std::string> free_dirs_;
  uint64_t next_free_dir_ = 0;

  std::mutex work_mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;  // IdleLoop's (never woken by Work)
  std::deque<std::function<void()>> work_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::thread idle_thread_;
  std::atomic<uint64_t> created_{0}, destroyed_{0}, paused_{0}, idle_freezes_{0};
};

// Where a sandbox's files live: <data>/sandboxes/<id>.
std::string SandboxDir(const std::string& data_dir, const std::string& id);

}  // namespace dsec::drivers
