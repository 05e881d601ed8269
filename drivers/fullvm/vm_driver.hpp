// VmDriver: the vm kind. Each sandbox is a libvirt domain (qemu:///system
// by default): a q35 machine with ACPI, booting the node's guest kernel
// directly, the image's EROFS file attached read-only as virtio-pmem and
// mounted with DAX (so every guest maps the one host page cache of the
// image) or, for an image file not padded to 2 MiB, as a virtio-blk disk.
// What both VM kinds share (boot wait, agent, re-adoption, sweep) is
// GuestDriver's (drivers/vm/guest_driver.hpp).
//
// Domains are transient and named dsec-<tag>-<id>, <tag> a hash of the data
// dir, so the sweep after a restart finds this node's and no one else's.
// They outlive dsecd (libvirtd owns them). libvirt is called on the
// driver's workers and its own connection thread, never on actor threads.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "drivers/vm/guest_driver.hpp"

typedef struct _virConnect* virConnectPtr;
typedef struct _virDomain* virDomainPtr;

namespace dsec::drivers {

struct VmOptions : GuestDriverOptions {
  std::string uri = "qemu:///system";  // libvirtd's
  // How the image is attached: "pmem" (virtio-pmem + DAX where the image
  // file allows it, else virtio-blk) or "blk" (always virtio-blk).
  std::string image_device = "pmem";
};

class VmDriver : public GuestDriver {
 public:
  // Does not wait for libvirtd: it is connected to in the background (its
  // first connection can take tens of seconds), and Available() says why
  // not while it cannot be reached.
  static Result<std::unique_ptr<VmDriver>> Start(VmOptions options);
  ~VmDriver() override;

  static const KindTraits& Traits() {
    static const KindTraits t = [] {
      KindTraits k = StatefulTraits(v1::ISOLATION_HARDWARE);
      k.network = true;  // a tap per guest, where dsecd shares libvirtd's network namespace (NetworkGap)
      k.guard = true;    // as the microvm's: the guest's init and agent (vm/guest_guard.cpp)
      k.pause_memory = true;  // libvirt's save and restore of the domain (vm_snapshot.cpp)
      k.snapshot = true;      // libvirt's external memory snapshot, the domain running on
      k.fork = true;          // restores of it as new domains (vm_snapshot.cpp)
      return k;
    }();
    return t;
  }
  v1::Kind kind() const override { return v1::KIND_VM; }
  const char* name() const override { return "vm"; }
  const KindTraits& traits() const override { return Traits(); }

  // The domain name of sandbox `id` on the node whose data dir is
  // `data_dir` (tests and leak_check find domains by it).
  static std::string DomainPrefix(const std::string& data_dir);

 private:
  explicit VmDriver(VmOptions options);
  Status MachineAvailable() const override;
  Status LaunchMachine(const Launch& launch) override;
  RunState MachineState(const Box& box) const override;
  Status PauseMachine(const Box& box, bool paused) override;
  Status StopMachine(const std::string& id, pid_t pid) override;
  Status MachineStillThere(const Box& box) const override;
  std::string NetworkGap() const override;
  std::string ConsoleTail(const Box& box, size_t max_bytes) const override;
  std::string EventSocket(const Box&) const override { return ""; }
  std::vector<std::string> StrayMachines() const override;
  void AddStats(nlohmann::json& stats) const override;
  // vm_snapshot.cpp. A pause with memory (stay_stopped): libvirt saves the
  // domain, which ends. A snapshot: libvirt's external memory snapshot (the
  // domain paused meanwhile, then running on), a file in the same format.
  Status SaveMachine(const Box& box, const std::string& dest, uint64_t max_bytes, bool stay_stopped,
                     uint64_t* bytes) override;
  Status IncomingMachine(const Box&, const std::string&) override { return Status::Ok(); }  // LaunchMachine restored it
  std::string MachineFingerprint() const override { return "vm-1 libvirt"; }
  pid_t CurrentPid(const Box& box) const override { return QemuPid(DomainName(box.mid)); }

  std::string DomainName(const std::string& id) const { return prefix_ + id; }
  // What the command line of the domain's QEMU holds (libvirt passes it
  // the domain's name, and its sockets as fds).
  std::string Marker(const std::string& id) const { return "guest=" + DomainName(id) + ","; }
  // The live connection, reconnecting when it died (libvirtd restarted);
  // FailedPrecondition naming the fix when libvirtd does not answer.
  Result<virConnectPtr> Conn() const;
  // QEMU's pid as libvirt recorded it for domain `name`; 0 when unknown.
  pid_t QemuPid(const std::string& name) const;
  void ConnectLoop();
  std::string DomainXml(const Launch& l, bool pmem, uint64_t pmem_size) const;
  // Starts the domain saved in <dir>/state as box's: its own saved domain
  // (a resume), or another's (a snapshot's): then as a new domain, its name,
  // UUID and dir replaced in the saved XML, streamed to libvirt through a
  // FIFO (libvirt refuses another UUID for a saved domain, and two domains
  // cannot share one).
  Result<virDomainPtr> RestoreDomain(virConnectPtr conn, const Box& box, const std::string& dir);

  VmOptions vopts_;
  std::string prefix_;  // dsec-<tag>-

  mutable std::mutex conn_mu_;
  mutable virConnectPtr conn_ = nullptr;
  mutable std::string conn_error_;  // why the last connection failed
  mutable bool connected_once_ = false;
  bool stop_connecting_ = false;
  std::condition_variable conn_cv_;
  std::thread connector_;
};

}  // namespace dsec::drivers
