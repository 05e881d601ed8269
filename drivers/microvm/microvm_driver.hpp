// MicrovmDriver: the microvm kind. Each sandbox is a QEMU `-M microvm`
// guest (virtio-mmio devices only, no firmware, no NIC) booting the node's
// guest kernel (drivers/vm/guest.hpp) with the image's EROFS file as a
// read-only virtio-blk disk, overlaid inside the guest with a tmpfs layer.
// Its agent (dsec-agent, the guest's PID 1) answers on a virtio-serial port
// that QEMU serves as a unix socket; the same protocol and client code as a
// container's. QEMU runs detached in its own cgroup (the spec's memory and
// CPU limits, plus QEMU's own overhead), so guests outlive dsecd; Readopt
// reconnects to their sockets, and the start sweep kills what no record
// names. Control goes through QMP (pause, resume, quit).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "drivers/agent/agent_driver.hpp"
#include "drivers/cgroup/groups.hpp"
#include "drivers/vm/guest.hpp"
#include "drivers/vm/watcher.hpp"

namespace dsec::drivers {

struct MicrovmOptions {
  std::string data_dir;                      // VMs live in <data>/vms/<id>
  std::string agent_path;                    // default next to this executable ($DSEC_AGENT)
  std::string qemu = "qemu-system-x86_64";   // a path, or a name looked up in PATH
  std::string guest_dir;                     // default <data>/guest
  std::string cgroup_parent = "dsec";        // groups: <controller>/<parent>/vm/<id>
  std::string accel = "auto";                // auto, kvm or tcg
  uint64_t default_memory = 512ull << 20;    // spec.limits.memory_bytes = 0
  uint64_t max_memory = 16ull << 30;         // per VM
  uint32_t max_vcpus = 8;                    // per VM
  int boot_timeout_ms = 90'000;              // QEMU start to the agent's first answer
  std::function<Result<v1::ImageManifest>(const std::string& name)> find_image;
  std::function<void(int level, const std::string& text)> log;
  // A VM ended by itself (QEMU exited, the guest powered off or its kernel
  // panicked): why, for the sandbox's record; the node fails the sandbox and
  // destroys what is left. From a driver thread.
  std::function<void(const std::string& id, const std::string& why)> lost;
};

class MicrovmDriver : public AgentDriver {
 public:
  // FailedPrecondition when QEMU or cgroups are missing. A guest not yet
  // prepared is not a reason: Available() says so until it is.
  static Result<std::unique_ptr<MicrovmDriver>> Start(MicrovmOptions options);
  ~MicrovmDriver() override;

  static const KindTraits& Traits();
  v1::Kind kind() const override { return v1::KIND_MICROVM; }
  const char* name() const override { return "microvm"; }
  const KindTraits& traits() const override { return Traits(); }
  Status Available() const override;
  Status CanHandle(const v1::SandboxSpec& spec) const override;
  void Create(const v1::SandboxRecord& sandbox, CreateCallback done) override;
  void Pause(const v1::SandboxRecord& sandbox, bool paused, StatusCallback done) override;
  void Destroy(const v1::SandboxRecord& sandbox, StatusCallback done) override;
  void Readopt(const v1::SandboxRecord& sandbox, StatusCallback done) override;
  void Restored() override;
  std::string StatsJson() const override;
  std::string accelerator() const override { return accel_; }
  void Stop() override;

  // The guest memory and vCPUs a spec gets (limits within the maxima), or
  // InvalidArgument naming the limit and the maximum.
  Status GuestSize(const v1::SandboxSpec& spec, uint64_t* memory, uint32_t* vcpus) const;

 private:
  explicit MicrovmDriver(MicrovmOptions options);
  struct Box;
  void Work(std::function<void()> job);
  // Work on sandbox `id` (a creation or re-adoption): the id is busy_ until
  // `job` has returned, so the sweep leaves it and a destroy waits.
  void WorkOn(const std::string& id, std::function<void()> job);
  void WorkerLoop();
  Result<std::string> CreateNow(const v1::SandboxRecord& sb);
  Status ReadoptNow(const v1::SandboxRecord& sb);
  // Stops the VM in `dir` (QEMU `pid`, 0: look it up) and removes its
  // cgroup and dir. Ok when nothing of it is left.
  Status DestroyNow(const std::string& id, pid_t pid);
  void RestoredNow();
  // The watcher saw VM `id` end (`what`: "exited" or QMP's shutdown reason).
  void OnEnded(const std::string& id, const std::string& what);
  void Watch(const Box& box);
  Result<vm::Guest> EnsureGuest();
  std::shared_ptr<Box> Find(const std::string& id) const;
  Result<std::shared_ptr<AgentBox>> RunningBox(const std::string& id) const override;
  std::shared_ptr<AgentBox> FindBox(const std::string& id) const override;
  std::string VmDir(const std::string& id) const;
  std::string CgroupRel(const std::string& id) const;
  // The last lines QEMU's console holds (the guest kernel's and /init's
  // words), for an error message; "" when QEMU does not answer.
  std::string ConsoleTail(const std::string& dir, size_t max_bytes = 2000) const;
  void Log(int level, const std::string& text) const;

  MicrovmOptions opts_;
  std::string qemu_;  // resolved path
  std::string accel_, accel_why_;
  uint64_t tsc_khz_ = 0;
  std::unique_ptr<cgroup::Groups> groups_;
  mutable std::mutex watcher_mu_;  // watcher_ goes at Stop
  std::unique_ptr<vm::VmWatcher> watcher_;

  std::mutex guest_mu_;
  std::optional<vm::Guest> guest_;
  int64_t guest_mtime_ = 0;  // base.cpio's, when guest_ was made

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Box>> boxes_;
  std::set<std::string> busy_;  // ids being created or readopted: never swept
  std::condition_variable busy_cv_;  // one left busy_ (under mu_)

  std::mutex work_mu_;
  std::condition_variable work_cv_;
  std::deque<std::function<void()>> work_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> created_{0}, destroyed_{0}, readopted_{0}, swept_{0}, lost_{0};
};

}  // namespace dsec::drivers
