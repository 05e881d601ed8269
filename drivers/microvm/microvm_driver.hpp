// MicrovmDriver: the microvm kind. Each sandbox is a QEMU `-M microvm`
// guest (virtio-mmio devices only, no firmware, no NIC) booting the node's
// guest kernel with the image's EROFS file as a read-only virtio-blk disk;
// what both VM kinds share (boot wait, agent, re-adoption, sweep) is
// GuestDriver's (drivers/vm/guest_driver.hpp). QEMU runs detached in its own
// cgroup (the spec's memory and CPU limits, plus QEMU's own overhead), so
// guests outlive dsecd. Control goes through QMP (pause, resume, console).
// Guest RAM is a memfd (microvm_memory.cpp): snapshots copy it, and guests
// made from a snapshot map its RAM copy-on-write.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "drivers/cgroup/groups.hpp"
#include "drivers/vm/guest_driver.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

struct MicrovmOptions : GuestDriverOptions {
  std::string qemu = "qemu-system-x86_64";  // a path, or a name looked up in PATH
};

class MicrovmDriver : public GuestDriver {
 public:
  // FailedPrecondition when QEMU or cgroups are missing. A guest not yet
  // prepared is not a reason: Available() says so until it is.
  static Result<std::unique_ptr<MicrovmDriver>> Start(MicrovmOptions options);
  ~MicrovmDriver() override;

  static const KindTraits& Traits();
  v1::Kind kind() const override { return v1::KIND_MICROVM; }
  const char* name() const override { return "microvm"; }
  const KindTraits& traits() const override { return Traits(); }
  // The name of the memfd guest RAM lives in (as /proc/PID/maps shows it).
  static constexpr const char* kRamName = "dsec-ram";

 private:
  explicit MicrovmDriver(MicrovmOptions options);
  Status MachineAvailable() const override { return Status::Ok(); }
  Status LaunchMachine(const Launch& launch) override;
  RunState MachineState(const Box& box) const override;
  Status PauseMachine(const Box& box, bool paused) override;
  Status StopMachine(const std::string& id, pid_t pid) override;
  Status MachineStillThere(const Box& box) const override;
  std::string ConsoleTail(const Box& box, size_t max_bytes) const override;
  std::string EventSocket(const Box& box) const override { return box.dir + "/e"; }
  void AddStats(nlohmann::json& stats) const override;
  Status SaveMachine(const Box& box, const std::string& dest, uint64_t max_bytes, bool stay_stopped,
                     uint64_t* bytes) override;
  Status IncomingMachine(const Box& box, const std::string& dir) override;
  std::string MachineFingerprint() const override;
  // The sealed memfd holding snapshot `dir`'s RAM, shared by every guest
  // made from it that this dsecd started (made on first use).
  Result<std::shared_ptr<UniqueFd>> BaseRam(const std::string& dir, uint64_t size);
  // Copies the data extents of `src` into `dst` at the same offsets: 0, or
  // -1 with errno. Async-signal-safe.
  static int CopyData(int src, int dst, uint64_t size);
  std::string CgroupRel(const std::string& id) const;

  std::string qemu_option_;  // as given
  std::string qemu_;         // resolved path
  std::string cgroup_parent_;
  std::unique_ptr<cgroup::Groups> groups_;
  std::mutex base_mu_;
  std::map<std::string, std::weak_ptr<UniqueFd>> bases_;  // by snapshot dir
};

}  // namespace dsec::drivers
