// GuestDriver: what the VM kinds (microvm: QEMU driven directly; vm: a
// libvirt domain) share once a machine runs. Each sandbox is a guest
// booting the node's guest kernel (guest.hpp) with the image's EROFS file
// attached read-only and overlaid inside the guest with a tmpfs layer; its
// agent (dsec-agent, the guest's PID 1) answers on a virtio-serial port
// served as a unix socket at <data>/<vms>/<id>/a (<vms>: the kind's own
// dir, so that each kind's sweep judges only its own VMs), with the same protocol and
// client code as a container's. Guests outlive dsecd: Readopt reconnects
// to their sockets, and the start sweep stops what no record names.
//
// This class holds the sandbox lifecycle (sizing, the boot wait with its
// deadline and console, re-adoption, the watcher, the pool, the idle
// reclaim, the sweep; the box table, workers, idle scan and leftovers are
// BoxDriver's, shared with containers); a kind supplies the machine:
// how to launch, stop, pause and inspect one (the pure virtuals below).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "drivers/images/image_source.hpp"
#include "drivers/agent/box_driver.hpp"
#include "drivers/vm/guest.hpp"
#include "drivers/vm/watcher.hpp"

namespace dsec::images {
class ImageMounts;
}

namespace dsec::drivers {

struct GuestDriverOptions {
  std::string data_dir;                    // VMs live in <data>/<vms>/<id>
  std::string agent_path;                  // default next to this executable ($DSEC_AGENT)
  std::string guest_dir;                   // default <data>/guest
  std::string cgroup_parent = "dsec";      // microvm: groups <controller>/<parent>/vm/<id>
  std::string accel = "auto";              // auto, kvm or tcg
  uint64_t default_memory = 512ull << 20;  // spec.limits.memory_bytes = 0
  uint64_t max_memory = 16ull << 30;       // per VM
  uint32_t max_vcpus = 8;                  // per VM
  int boot_timeout_ms = 90'000;            // launch to the agent's first answer
  // Booted guests kept ready per image and size (the first creation of a
  // size boots cold and starts the refill); 0: every creation boots.
  int pool_size = 0;
  // A guest idle this long (no exec, no file call) has its clean caches
  // dropped and free memory compacted (dsec-agent --reclaim), so that its
  // balloon's free-page reporting returns them to the host; once per idle
  // spell. 0: never.
  int reclaim_idle_ms = 30'000;
  const images::ImageSource* images = nullptr;  // DriverEnv::images
  // Sandbox networking (DriverEnv's): a tap per networked guest.
  net::NodeNetwork* network = nullptr;
  std::string network_unavailable;
  bool network_open = false;
  std::function<void(int level, const std::string& text)> log;
  // A VM ended by itself (QEMU exited, the guest powered off or its kernel
  // panicked): why, for the sandbox's record; the node fails the sandbox and
  // destroys what is left. From a driver thread.
  std::function<void(const std::string& id, const std::string& why)> lost;
};

class GuestDriver : public BoxDriver {
 public:
  ~GuestDriver() override;

  // Traits shared by both VM kinds (kernel isolation).
  static const KindTraits& GuestTraits();
  Status Available() const override;
  Status CanHandle(const v1::SandboxSpec& spec) const override;
  void Create(const v1::SandboxRecord& sandbox, CreateCallback done) override;
  void Pause(const v1::SandboxRecord& sandbox, bool paused, StatusCallback done) override;
  void PauseMemory(const v1::SandboxRecord& sandbox, StatusCallback done) override;
  void Destroy(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) override;
  void Readopt(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) override;
  void Restored() override;
  std::string StatsJson() const override;
  std::string DescribeState(const std::string& driver_state) const override;
  std::string accelerator() const override { return accel_; }
  void Stop() override;

  // The guest memory and vCPUs a spec gets (limits within the maxima), or
  // InvalidArgument naming the limit and the maximum.
  Status GuestSize(const v1::SandboxSpec& spec, uint64_t* memory, uint32_t* vcpus) const;
  // What the guest changed of its image, read by its agent from its
  // overlay's upper layer (guest_guard.cpp).
  Result<guard::UpperDiff> Changes(const v1::SandboxRecord& sandbox) const override;
  void Snapshot(const v1::SandboxRecord& sandbox, const std::string& dest, uint64_t max_bytes,
                SnapshotCallback done) override;
  static constexpr uint32_t kMaxChanges = 100000;

 protected:
  struct Box : AgentBox {
    bool TrustsAgentOom() const override { return true; }
    pid_t pid = 0;  // QEMU's
    // The machine's name: its dir's, its group's, its domain's. The sandbox
    // id for a guest booted for it; p-<random> for one from the pool.
    std::string mid;
    std::string dir, cgroup_rel, digest, image_file;
    uint64_t guest_memory = 0;  // what the guest kernel gets
    uint32_t vcpus = 1;
    bool paused = false;
    int64_t reclaimed_ms = 0;  // the last reclaim's start (under idle_mu)
    bool networked = false;    // a tap in net_slot (NodeNetwork), released with it
    uint32_t net_slot = 0;
    std::shared_ptr<void> hold;  // what the kind keeps for it while it runs (a snapshot's shared RAM)
    // Paused with memory: its state in <dir>/saved, no VMM (guest_snapshot.cpp).
    bool saved = false;
  };
  // What a launch is given: the box (id, dir, image, size filled in), the
  // guest, the kernel command line both kinds share (the kind adds its
  // image device's), and the sandbox's spec.
  struct Launch {
    Box* box;
    const vm::Guest* guest;
    std::string cmdline;
    const v1::SandboxSpec* spec;
    // The guest's NIC when it has a network: the tap QEMU opens, its MAC.
    std::string tap, mac;
    // A snapshot's dir to restore instead of booting ("" boots); `shared`:
    // its memory mapped copy-on-write with the other guests made from it
    // (else the guest gets a copy of its own).
    std::string restore;
    bool shared = false;
  };
  // Why this kind cannot give its guests a link on this node ("" when it
  // can): the vm kind's QEMU is libvirtd's child, in libvirtd's namespace.
  virtual std::string NetworkGap() const { return ""; }
  // A machine's state, as the boot wait and re-adoption judge it.
  enum class RunState { kRunning, kStarting, kPaused, kStopped, kGone, kUnknown };

  // `vms_dir`: the kind's dir in the data dir (one VM dir per sandbox).
  GuestDriver(GuestDriverOptions options, const char* kind_name, const char* vms_dir);
  // Chooses the accelerator, makes the kind's VM dir and starts the workers and
  // the watcher; a kind calls it from its Start.
  Status Init();

  // --- what a kind supplies (called on worker threads) ---
  // Why this kind cannot run machines here, or Ok (its VMM is there).
  virtual Status MachineAvailable() const = 0;
  // Starts the machine and sets box->pid (QEMU's, which outlives dsecd) and
  // box->cgroup_rel. Does not wait for the guest.
  virtual Status LaunchMachine(const Launch& launch) = 0;
  virtual RunState MachineState(const Box& box) const = 0;
  virtual Status PauseMachine(const Box& box, bool paused) = 0;
  // Stops machine `id` (a Box's mid; its QEMU `pid`, 0: unknown) and frees
  // what the kind made for it outside its dir. Ok when nothing of it is left.
  virtual Status StopMachine(const std::string& id, pid_t pid) = 0;
  // Ok when the machine recorded for `box` is still the one running (its
  // recorded QEMU, found where the kind puts it).
  virtual Status MachineStillThere(const Box& box) const = 0;
  // The last bytes of the guest's console; "" when there is none to read.
  virtual std::string ConsoleTail(const Box& box, size_t max_bytes) const = 0;
  // The QMP socket the watcher reads events from; "" for none (it then
  // watches QEMU's pid alone).
  virtual std::string EventSocket(const Box& box) const = 0;
  // Machines of this node's no dir names (the sweep after restore stops
  // them): their names (mids). Default none.
  virtual std::vector<std::string> StrayMachines() const { return {}; }
  // The kind's own figures for StatsJson.
  virtual void AddStats(nlohmann::json& /*stats*/) const {}
  // Snapshots (guest_snapshot.cpp; Unimplemented for a kind without):
  // writes the machine's memory and device state into `dest` (at most
  // `max_bytes`, 0: no bound; *bytes what was written), the guest standing
  // meanwhile and running after as before (`stay_stopped`: left stopped
  // once saved; it runs again if the save failed).
  virtual Status SaveMachine(const Box& box, const std::string& dest, uint64_t max_bytes, bool stay_stopped,
                             uint64_t* bytes);
  // For a machine launched with Launch::restore: loads its device state from
  // `dir` and starts it.
  virtual Status IncomingMachine(const Box& box, const std::string& dir);
  // What a saved state needs to load again (the VMM, its version, the
  // accelerator); a snapshot taken under another is refused.
  virtual std::string MachineFingerprint() const { return ""; }
  // The pid of the VMM running machine `box` now (a resume starts a new
  // one: the recorded pid may be old); 0 when none is known.
  virtual pid_t CurrentPid(const Box& box) const;

  std::string VmDir(const std::string& id) const;
  const GuestDriverOptions& options() const { return opts_; }
  const std::string& accel() const { return accel_; }
  uint64_t tsc_khz() const { return tsc_khz_; }
  // Joins the workers (what is queued still runs). A kind's destructor
  // calls it first: jobs call the kind's virtuals.
  void JoinWorkers();

 private:
  void WorkOn(const std::string& id, std::function<void()> job);
  Result<std::string> CreateNow(const v1::SandboxRecord& sb);
  // Boots machine `mid` for `spec` and connects to its agent; on failure
  // nothing of it is left.
  // `pooled`: a guest for the pool; one restored from a snapshot takes its
  // identity when it is handed out, not here.
  Result<std::shared_ptr<Box>> Boot(const std::string& mid, const v1::SandboxSpec& spec, bool pooled = false);
  // The pool a spec's guests come from: its image, size and limits ("" when
  // the spec does not resolve).
  std::string PoolKey(const v1::SandboxSpec& spec) const;
  // A ready guest of pool `key`, or null.
  std::shared_ptr<Box> TakeFromPool(const std::string& key);
  // Boots guests for pool `key` until it holds pool_size (one at a time).
  void Refill(const std::string& key, const v1::SandboxSpec& spec);
  // Removes the pools of snapshots that were removed (the idle scan's, and
  // before a take).
  void DropStalePools();
  // Stops every pooled guest (dsecd stops; a guest in no record would be
  // swept at the next start anyway).
  void DrainPools();
  Status ReadoptNow(const v1::SandboxRecord& sb, const std::string& driver_state);
  // DestroyNow of a guest no sandbox holds (`what` it is), its failure logged.
  void RemoveOrSay(const Box& box, const char* what);
  // StopMachine, then the VM's dir and, for sandbox `id` ("" for a pooled
  // guest), its box. Ok when nothing of it is left.
  Status DestroyNow(const std::string& id, const std::string& mid, pid_t pid);
  void RestoredNow();
  void OnEnded(const std::string& id, const std::string& what);
  // The idle scan's (BoxDriver), every second: a guest idle past
  // reclaim_idle_ms, not reclaimed since its last activity, gets Reclaim on
  // a worker.
  void ScanIdle(const std::shared_ptr<AgentBox>& box, int64_t now_ms) override;
  void ScanDone(int64_t) override { DropStalePools(); }
  void Reclaim(const std::shared_ptr<Box>& box);
  // guest_snapshot.cpp: a restore's size and checks from the snapshot's
  // meta.json (into box and launch), and a restored guest's new identity.
  Status PrepareRestore(const v1::SandboxSpec& spec, Box* box, Launch* launch) const;
  // `fresh`: a new guest (hostname, machine-id, seed, time); else a resumed
  // one (seed and time).
  Status Reidentify(const Box& box, bool fresh);
  Status WriteMeta(const Box& box, const std::string& dir, const std::string& task) const;
  Status PauseMemoryNow(Box& box);
  Status ResumeSaved(Box& box, const v1::SandboxSpec& spec);
  // ReadoptNow's part for a guest whose state is saved: Ok with it kept
  // paused, or resumed when its record says it runs (a crash between the
  // save and the record); NotFound when nothing is saved.
  Status ReadoptSaved(const std::shared_ptr<Box>& box, const v1::SandboxRecord& sb);
  void Watch(const Box& box);
  Result<vm::Guest> EnsureGuest();
  // A guarded spec's kernel command line part (" dsec.guard=1 dsec.hide=...
  // dsec.ro=..."; "" unguarded), its paths found in `image` (guest_guard.cpp).
  Result<std::string> GuardCmdline(const v1::SandboxSpec& spec, const v1::ImageManifest& image);
  std::unique_ptr<images::ImageMounts> guard_mounts_;  // the images' walks (<data>/run/guard-images)
  std::mutex guard_mu_;
  std::unordered_map<std::string, std::string> guard_cmdlines_;  // digest + task -> GuardCmdline
  std::shared_ptr<Box> Find(const std::string& id) const { return FindAs<Box>(id); }
  Result<std::shared_ptr<AgentBox>> RunningBox(const std::string& id) const override;

  GuestDriverOptions opts_;
  std::string vms_;  // <data>/<vms_dir>
  std::string accel_, accel_why_;
  std::string damon_;  // whether DAMON could be used here, and why not
  uint64_t tsc_khz_ = 0;
  mutable std::mutex watcher_mu_;  // watcher_ goes at Stop
  std::unique_ptr<vm::VmWatcher> watcher_;

  std::mutex guest_mu_;
  std::optional<vm::Guest> guest_;
  int64_t guest_mtime_ = 0;  // base.cpio's, when guest_ was made

  // Under mu_ (BoxDriver's):
  std::set<std::string> busy_;       // ids being created or readopted: never swept
  std::condition_variable busy_cv_;  // one left busy_ (under mu_)
  std::set<std::string> claimed_;    // mids of every machine we run or boot: never swept
  struct Pool {
    std::deque<std::shared_ptr<Box>> ready;
    int booting = 0;
    int64_t used_ms = 0;  // its last take or creation (the least used goes first)
  };
  std::map<std::string, Pool> pools_;  // by PoolKey (under mu_)
  bool pools_closed_ = false;          // Stop: no more refills (under mu_)

  std::atomic<uint64_t> reclaims_{0}, reclaimed_kib_{0};
  std::atomic<uint64_t> created_{0}, destroyed_{0}, readopted_{0}, swept_{0}, lost_{0}, pool_hits_{0}, pool_boots_{0};
};

}  // namespace dsec::drivers
