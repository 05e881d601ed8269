// ContainerDriver: the dsecd side of the container kind. A container is an
// overlay (per-sandbox upper over the image's shared EROFS mount) with its
// own pid, mount, ipc, uts and net namespaces and cgroup, whose PID 1 is
// dsec-agent. The driver asks its spawner to create the init, talks to the
// agent over the unix socket in <data>/sandboxes/<id>/run/, and destroys a
// container by killing its cgroup. Containers outlive dsecd: after a restart
// Readopt reconnects to the agent from the record.
#pragma once

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "drivers/agent/box_driver.hpp"
#include "drivers/container/container_state.pb.h"
#include "drivers/container/sandbox_disk.hpp"
#include "drivers/cgroup/groups.hpp"
#include "drivers/guard/carry.hpp"
#include "drivers/guard/task_paths.hpp"
#include "drivers/images/image_source.hpp"
#include "drivers/images/mounts.hpp"
#include "drivers/spawner/spawner_link.hpp"

namespace dsec::guard {
class ReadWatch;
}
namespace dsec::net {
class NodeNetwork;
}

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
  const images::ImageSource* images = nullptr;  // DriverEnv::images
  // Sandbox networking (DriverEnv::network, network_unavailable, network_open).
  net::NodeNetwork* network = nullptr;
  std::string network_unavailable;
  bool network_open = false;
  // Writes refused by a read-only mount (a protected path) are counted and
  // flagged (the spawner's --no-write-watch when off).
  bool watch_writes = true;
  std::function<void(int level, const std::string& text)> log;
};

class ContainerDriver : public BoxDriver {
 public:
  static Result<std::unique_ptr<ContainerDriver>> Start(ContainerOptions options);
  ~ContainerDriver() override;

  // Namespaces, cgroup and an image of its own; lives between calls and
  // outlives dsecd.
  static const KindTraits& Traits();
  v1::Kind kind() const override { return v1::KIND_CONTAINER; }
  const char* name() const override { return "container"; }
  const KindTraits& traits() const override { return Traits(); }
  Status Available() const override;
  Status CanHandle(const v1::SandboxSpec& spec) const override;
  void Create(const v1::SandboxRecord& sandbox, CreateCallback done) override;
  void Pause(const v1::SandboxRecord& sandbox, bool paused, StatusCallback done) override;
  void PauseMemory(const v1::SandboxRecord& sandbox, StatusCallback done) override;
  void Snapshot(const v1::SandboxRecord& sandbox, const std::string& dest, uint64_t max_bytes,
                SnapshotCallback done) override;
  void Destroy(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) override;
  void Readopt(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) override;
  Result<uint64_t> DiskUsage(const v1::SandboxRecord& sandbox) const override;
  // Its cgroup's: CPU time, memory charged (less the cache), its limits.
  void Usage(const v1::SandboxRecord& sandbox, UsageCallback done) override;
  // Its overlay upper dir against the image (and its mask layer).
  Result<guard::UpperDiff> Changes(const v1::SandboxRecord& sandbox) const override;
  std::map<std::string, uint64_t> DeniedCalls(const v1::SandboxRecord& sandbox) const override;
  std::map<std::string, uint64_t> WatchedReads(const v1::SandboxRecord& sandbox) const override;
  std::map<std::string, uint64_t> RefusedWrites(const v1::SandboxRecord& sandbox) const override;
  // A Flush round trip to the spawner (its listener read, its counts sent).
  void SyncCounts(const v1::SandboxRecord& sandbox) const override;
  static constexpr size_t kMaxChanges = 100000;
  void Restored() override;
  std::string StatsJson() const override;
  std::string DescribeState(const std::string& driver_state) const override;

  // Image mounts, for the registry's "in use" check.
  std::vector<std::string> ImageUsers(const std::string& digest) const;
  // A sandbox's driver state (ContainerState; a JSON object from older dsecs).
  static Result<container::ContainerState> ParseState(const std::string& raw);
  // Stops the worker and the spawner; containers keep running.
  void Stop() override;

 private:
  explicit ContainerDriver(ContainerOptions options);
  struct Box;
  void OnEvent(spawner::Event& ev);
  Result<std::string> CreateNow(const v1::SandboxRecord& sb);
  // A task guard's mounts (spec.task, drivers/guard): the hidden paths'
  // mask layer in <base>/mask ("" without one) and the protected paths to
  // mount read-only, found in the image mounted at `image_root`.
  struct Guarded {
    std::string mask;
    std::vector<std::string> read_only;  // absolute in the container
    size_t hidden = 0;
  };
  Result<Guarded> GuardMounts(const std::string& id, const std::string& base, const std::string& image_root,
                              const v1::TaskGuard& task) const;
  // guard::FindTaskPaths under `root` of the image mounted at `image_root`,
  // walked once per image, root and globs (kept for the next creation).
  Result<guard::TaskPaths> TaskPathsOf(const std::string& image_root, const std::string& root,
                                       const std::vector<guard::PathGlob>& globs) const;
  static constexpr size_t kMaxTaskPaths = 256;
  mutable std::mutex paths_mu_;
  mutable std::unordered_map<std::string, guard::TaskPaths> task_paths_;
  // A grade sandbox's layers above its image (spec.carry): the agent
  // sandbox's changes in <base>/changes and the grader image's files in
  // <base>/grader, as a lowerdir prefix ("<base>/grader:<base>/changes:").
  Result<std::string> CarryLayers(const std::string& id, const std::string& base, const std::string& image_root,
                                  const std::string& digest, const v1::CarriedChanges& carry);
  Status ReadoptNow(const v1::SandboxRecord& sb, const std::string& driver_state);
  // Runs `copy` while `box` is frozen (container_snapshot.cpp); `what` ends
  // "while ..." in errors.
  Result<guard::CarryStats> CopyFrozen(const std::shared_ptr<Box>& box, const std::string& what,
                                       const std::function<Result<guard::CarryStats>()>& copy);
  // The layers of spec.snapshot (spec.layers, set by the node) as the
  // overlay's lowerdir takes them ("dir:dir:"), on the image of `digest`;
  // "" without a snapshot.
  Result<std::string> SnapshotLayers(const v1::SandboxSpec& spec, const std::string& digest) const;
  // Its image's watched files (ImageManifest.watched), marked in the read
  // watch once its init has made its mounts. Logged, never fatal.
  void WatchReads(const Box& box, const v1::ImageManifest& image) const;
  // Asks the spawner to take back the seccomp listener the container's
  // agent keeps (after a dsecd or spawner restart).
  void AdoptListener(const Box& box) const;
  void RestoredNow();
  // At start, before any container of this run: the last run's kept dirs
  // and groups, and its sandbox dirs as leftovers (BoxDriver's: each is
  // claimed by its Readopt, or by a creation of the same id, or removed by
  // RestoredNow, exactly once).
  void SweepLastRun();
  Status DestroyNow(const std::string& id, const std::string& held_digest);
  std::shared_ptr<Box> Find(const std::string& id) const;
  // AgentDriver's: a running container's box with a live agent, thawed if
  // the idle timer froze it, or Unavailable.
  Result<std::shared_ptr<AgentBox>> RunningBox(const std::string& id) const override;
  // Connects the box's agent (its socket in the sandbox's run dir).
  Status ConnectAgent(Box& box) const;
  // A group for a new container at `rel`: a recycled one renamed to it, or
  // a new one. The limits it holds (a recycled group keeps the last ones).
  Result<cgroup::GroupLimits> TakeGroup(const std::string& rel);
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
  // The idle scan's (BoxDriver): freezes a container idle past
  // idle_freeze_ms and drops its page cache.
  void ScanIdle(const std::shared_ptr<AgentBox>& box, int64_t now_ms) override;

  ContainerOptions opts_;
  std::unique_ptr<cgroup::Groups> groups_;  // v1 or v2, whichever the host mounts
  std::unique_ptr<images::ImageMounts> mounts_;
  std::string skeleton_;  // <data>/run/skeleton: the bottom overlay layer
  std::unique_ptr<SandboxDisk> disk_;  // null: no disk limits (disk_status_ says why)
  Status disk_status_;
  // Removes a sandbox dir (a subvolume when there is a disk).
  Status RemoveSandboxDir(const std::string& name);
  std::unique_ptr<SpawnerLink> link_;
  std::unique_ptr<guard::ReadWatch> reads_;  // null: no fanotify here (logged at start)

  // Under mu_ (BoxDriver's):
  std::unordered_map<uint64_t, std::promise<Result<int>>> creating_;  // spawner request id -> init pid
  mutable std::unordered_map<uint64_t, std::promise<void>> flushing_;  // SyncCounts' Flush id -> its answer
  mutable uint64_t next_flush_ = 1;
  uint64_t next_id_ = 1;
  // Recycled cgroups, <parent>/c/<group_tag_>.<n>: this data dir's only
  // (other dsecds may share the parent).
  static constexpr size_t kMaxFreeGroups = 256;
  std::string group_tag_;
  struct FreeGroup {
    std::string rel;
    cgroup::GroupLimits limits;
  };
  std::vector<FreeGroup> free_groups_;
  uint64_t next_free_ = 0;
  // Kept sandbox dirs, <data>/sandboxes/free.<n> (removed at start-up).
  std::vector<std::string> free_dirs_;
  uint64_t next_free_dir_ = 0;

  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> created_{0}, destroyed_{0}, paused_{0}, idle_freezes_{0}, idle_reclaims_{0};
};

// Where a sandbox's files live: <data>/sandboxes/<id>.
std::string SandboxDir(const std::string& data_dir, const std::string& id);

}  // namespace dsec::drivers
