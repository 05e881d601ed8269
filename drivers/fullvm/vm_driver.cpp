#include "drivers/fullvm/vm_driver.hpp"

#include <fcntl.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "drivers/fullvm/libvirt_util.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

using vmx::DomainRef;
using vmx::LastError;
using vmx::XmlEscape;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
// What QEMU itself takes beyond the guest's memory (TCG's translation
// cache is capped at 64 MiB).
constexpr uint64_t kQemuOverhead = 256 * kMiB;
// virtio-pmem maps the image in 2 MiB units: a file of another size is
// attached as a virtio-blk disk instead.
constexpr uint64_t kPmemAlign = 2 * kMiB;

}  // namespace

std::string VmDriver::DomainPrefix(const std::string& data_dir) {
  // FNV-1a of the data dir's absolute path: stable across restarts, and
  // different for each node (and each test daemon) on a host.
  uint32_t h = 2166136261u;
  for (unsigned char c : AbsolutePath(data_dir)) h = (h ^ c) * 16777619u;
  char tag[9];
  std::snprintf(tag, sizeof tag, "%08x", h);
  return std::string("dsec-") + tag + "-";
}

VmDriver::VmDriver(VmOptions options)
    : GuestDriver(options, "vm", "domains"), vopts_(std::move(options)), prefix_(DomainPrefix(vopts_.data_dir)) {}

Result<std::unique_ptr<VmDriver>> VmDriver::Start(VmOptions o) {
  virSetErrorFunc(nullptr, vmx::Quiet);
  std::unique_ptr<VmDriver> d(new VmDriver(std::move(o)));
  DSEC_RETURN_IF_ERROR(d->Init());
  d->connector_ = std::thread([p = d.get()] { p->ConnectLoop(); });
  d->Log(1, "vm: libvirt at " + d->vopts_.uri + ", accelerator " + d->accel() + ", domains named " + d->prefix_ +
                "<id>, guest in " + d->options().guest_dir);
  return d;
}

VmDriver::~VmDriver() {
  {
    std::lock_guard<std::mutex> lk(conn_mu_);
    stop_connecting_ = true;
  }
  conn_cv_.notify_all();
  if (connector_.joinable()) connector_.join();
  JoinWorkers();
  std::lock_guard<std::mutex> lk(conn_mu_);
  if (conn_) virConnectClose(conn_);
  conn_ = nullptr;
}

void VmDriver::ConnectLoop() {
  // Connects at start, and again whenever the connection died (libvirtd
  // restarted or was started late), so Available() tells the truth.
  std::unique_lock<std::mutex> lk(conn_mu_);
  while (!stop_connecting_) {
    lk.unlock();
    (void)Conn();  // a failure is kept for Available() to say; tried again in 5 s
    lk.lock();
    conn_cv_.wait_for(lk, std::chrono::seconds(5), [this] { return stop_connecting_; });
  }
}

Result<virConnectPtr> VmDriver::Conn() const {
  std::lock_guard<std::mutex> lk(conn_mu_);
  if (conn_ && virConnectIsAlive(conn_) == 1) return conn_;
  if (conn_) {
    virConnectClose(conn_);
    conn_ = nullptr;
  }
  conn_ = virConnectOpen(vopts_.uri.c_str());
  if (!conn_) {
    conn_error_ = LastError();
    return Status::FailedPrecondition("libvirtd does not answer at " + vopts_.uri + " (" + conn_error_ +
                                      "): start it (`virtlogd -d; libvirtd -d`, which scripts/dev does) or apt-get "
                                      "install libvirt-daemon-system");
  }
  if (!connected_once_) Log(1, "vm: connected to libvirtd at " + vopts_.uri);
  connected_once_ = true;
  conn_error_.clear();
  return conn_;
}

Status VmDriver::MachineAvailable() const {
  std::lock_guard<std::mutex> lk(conn_mu_);
  // Before the first attempt has ended a creation waits for it (Conn()).
  if (conn_error_.empty()) return Status::Ok();
  return Status::FailedPrecondition("not available on this host: libvirtd does not answer at " + vopts_.uri + " (" +
                                    conn_error_ +
                                    "): start it (`virtlogd -d; libvirtd -d`, which scripts/dev does) or apt-get "
                                    "install libvirt-daemon-system");
}

pid_t VmDriver::QemuPid(const std::string& name) const {
  auto text = ReadFileToString("/run/libvirt/qemu/" + name + ".pid");
  return text.ok() ? static_cast<pid_t>(std::atoi(text->c_str())) : 0;
}

std::string VmDriver::DomainXml(const Launch& l, bool pmem, uint64_t pmem_size) const {
  const Box& box = *l.box;
  const bool kvm = accel() == "kvm";
  const uint64_t mem_kib = box.guest_memory / 1024;
  const std::string dir = XmlEscape(box.dir);
  std::string cmdline = l.cmdline + (pmem ? " dsec.root=/dev/pmem0 dsec.dax=1" : " dsec.root=/dev/vda");
  uint32_t millis = l.spec->limits().cpu_millis() ? l.spec->limits().cpu_millis() : box.vcpus * 1000;
  std::string x;
  x += "<domain type='" + std::string(kvm ? "kvm" : "qemu") +
       "' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\n";
  x += "  <name>" + XmlEscape(DomainName(box.mid)) + "</name>\n";
  x += "  <metadata><dsec:sandbox xmlns:dsec='https://dsec.dev/xmlns/sandbox/1' machine='" + XmlEscape(box.mid) +
       "' dir='" + dir + "'/></metadata>\n";
  x += "  <memory unit='KiB'>" + std::to_string(mem_kib) + "</memory>\n";
  if (pmem) {
    // The image is device memory: room for it above the guest's RAM.
    x += "  <maxMemory slots='1' unit='KiB'>" + std::to_string(mem_kib + pmem_size / 1024 + 1024 * 1024) +
         "</maxMemory>\n";
  }
  x += "  <vcpu>" + std::to_string(box.vcpus) + "</vcpu>\n";
  x += std::string("  <cpu mode='") + (kvm ? "host-passthrough" : "maximum") + "'>";
  if (pmem) {
    x += "<numa><cell id='0' cpus='0-" + std::to_string(box.vcpus - 1) + "' memory='" + std::to_string(mem_kib) +
         "' unit='KiB'/></numa>";
  }
  x += "</cpu>\n";
  x += "  <os>\n    <type arch='x86_64' machine='q35'>hvm</type>\n";
  x += "    <kernel>" + XmlEscape(l.guest->kernel) + "</kernel>\n";
  x += "    <initrd>" + XmlEscape(l.guest->initrd) + "</initrd>\n";
  x += "    <cmdline>" + XmlEscape(cmdline) + "</cmdline>\n  </os>\n";
  x += "  <features><acpi/>";
  if (!kvm) x += "<tcg><tb-cache unit='MiB'>64</tb-cache></tcg>";
  x += "</features>\n";
  x += "  <clock offset='utc'/>\n";
  // Any end of the guest ends its QEMU (the watcher then tells the node).
  x += "  <on_poweroff>destroy</on_poweroff><on_reboot>destroy</on_reboot><on_crash>destroy</on_crash>\n";
  x += "  <cputune><global_period>100000</global_period><global_quota>" + std::to_string(millis * 100ull) +
       "</global_quota></cputune>\n";
  x += "  <devices>\n";
  x += "    <controller type='usb' model='none'/>\n";
  // The console goes through virtlogd, which caps the file (2 MiB, rotated):
  // a guest flooding it costs the host nothing more.
  x += "    <serial type='pty'><log file='" + dir + "/console' append='off'/><target port='0'/></serial>\n";
  x += "    <channel type='unix'><source mode='bind' path='" + dir +
       "/a'/><target type='virtio' name='dsec.agent'/></channel>\n";
  // Memory the guest frees goes back to the host.
  x += "    <memballoon model='virtio' freePageReporting='on'/>\n";
  if (!l.tap.empty())  // its NIC on the tap NodeNetwork made (libvirt opens it, unmanaged)
    x += "    <interface type='ethernet'><mac address='" + l.mac + "'/><target dev='" + l.tap +
         "' managed='no'/><model type='virtio'/></interface>\n";
  if (!pmem) {
    x += "    <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='threads'/><source file='" +
         XmlEscape(box.image_file) + "'/><target dev='vda' bus='virtio'/><readonly/></disk>\n";
  }
  x += "  </devices>\n";
  if (pmem) {
    // libvirt's own virtio-pmem element maps the file shared and writable;
    // the image is every sandbox's, so it goes to QEMU read-only here.
    x += "  <qemu:commandline>\n";
    x += "    <qemu:arg value='-object'/>\n";
    x += "    <qemu:arg value='memory-backend-file,id=dsecimg,share=on,readonly=on,mem-path=" +
         XmlEscape(box.image_file) + ",size=" + std::to_string(pmem_size) + "'/>\n";
    x += "    <qemu:arg value='-device'/>\n";
    x += "    <qemu:arg value='virtio-pmem-pci,memdev=dsecimg,id=dsecpmem,bus=pcie.0,addr=0x10'/>\n";
    x += "  </qemu:commandline>\n";
  }
  x += "</domain>\n";
  return x;
}

Status VmDriver::LaunchMachine(const Launch& l) {
  Box& box = *l.box;
  auto conn = Conn();
  if (!conn.ok()) return conn.status();
  struct stat st;
  if (::stat(box.image_file.c_str(), &st) < 0) return Status::FromErrno(errno, "image file " + box.image_file);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  // A comma would end QEMU's option value (the pmem path is passed raw).
  bool pmem = vopts_.image_device == "pmem" && size > 0 && size % kPmemAlign == 0 &&
              box.image_file.find(',') == std::string::npos;
  if (!pmem && vopts_.image_device == "pmem")
    Log(1, "vm " + box.id + ": image file " + box.image_file + " is not a multiple of 2 MiB (built before dsec padded "
           "images; rebuild it to share its page cache): attached as a virtio-blk disk");
  virDomainPtr dom = nullptr;
  if (!l.restore.empty()) {
    auto restored = RestoreDomain(*conn, box, l.restore);  // vm_snapshot.cpp
    if (!restored.ok()) return restored.status();
    dom = *restored;
  } else {
    std::string xml = DomainXml(l, pmem, size);
    if (Status s = WriteFileAtomic(box.dir + "/domain.xml", xml, 0600); !s.ok())  // for whoever debugs it
      Log(1, "vm " + box.id + ": " + s.message() + " (the domain starts without its copy there)");
    dom = virDomainCreateXML(*conn, xml.c_str(), VIR_DOMAIN_NONE);
  }
  if (!dom) return Status::Internal("libvirt could not start domain " + DomainName(box.mid) + ": " + LastError());
  DomainRef ref{dom};
  // QEMU's memory limit (its cgroup's), set once it runs: a <memtune> in
  // the XML would also make libvirt raise QEMU's RLIMIT_MEMLOCK to it, which
  // a host without CAP_SYS_RESOURCE refuses.
  virTypedParameter limit{};
  std::snprintf(limit.field, sizeof limit.field, "%s", VIR_DOMAIN_MEMORY_HARD_LIMIT);
  limit.type = VIR_TYPED_PARAM_ULLONG;
  limit.value.ul = (box.guest_memory + kQemuOverhead) / 1024;
  if (virDomainSetMemoryParameters(dom, &limit, 1, VIR_DOMAIN_AFFECT_LIVE) < 0)
    return Status::Internal("domain " + DomainName(box.mid) + ": cannot limit its memory: " + LastError());
  box.pid = QemuPid(DomainName(box.mid));
  if (box.pid <= 0 || !vm::ProcessHas(box.pid, Marker(box.mid)))
    return Status::Internal("domain " + DomainName(box.mid) + " started but its QEMU's pid is not in /run/libvirt/qemu/");
  box.cgroup_rel = "";  // libvirt's (machine/...), removed by libvirt with the domain
  return Status::Ok();
}

GuestDriver::RunState VmDriver::MachineState(const Box& box) const {
  if (!vm::ProcessHas(box.pid, Marker(box.mid))) return RunState::kGone;
  auto conn = Conn();
  if (!conn.ok()) return RunState::kUnknown;
  DomainRef dom{virDomainLookupByName(*conn, DomainName(box.mid).c_str())};
  if (!dom.d) return RunState::kGone;
  int state = 0, reason = 0;
  if (virDomainGetState(dom.d, &state, &reason, 0) < 0) return RunState::kUnknown;
  switch (state) {
    case VIR_DOMAIN_RUNNING: return RunState::kRunning;
    case VIR_DOMAIN_PAUSED:
      return reason == VIR_DOMAIN_PAUSED_STARTING_UP ? RunState::kStarting : RunState::kPaused;
    case VIR_DOMAIN_SHUTOFF:
    case VIR_DOMAIN_SHUTDOWN:
    case VIR_DOMAIN_CRASHED:
    case VIR_DOMAIN_PMSUSPENDED: return RunState::kStopped;
    default: return RunState::kUnknown;
  }
}

Status VmDriver::PauseMachine(const Box& box, bool paused) {
  auto conn = Conn();
  if (!conn.ok()) return conn.status();
  DomainRef dom{virDomainLookupByName(*conn, DomainName(box.mid).c_str())};
  if (!dom.d) return Status::Unavailable("its domain " + DomainName(box.mid) + " is gone");
  int state = 0, reason = 0;
  if (virDomainGetState(dom.d, &state, &reason, 0) == 0 && (state == VIR_DOMAIN_PAUSED) == paused)
    return Status::Ok();
  int rc = paused ? virDomainSuspend(dom.d) : virDomainResume(dom.d);
  if (rc < 0) return Status::Internal(std::string(paused ? "suspend" : "resume") + " domain " + DomainName(box.mid) + ": " + LastError());
  return Status::Ok();
}

Status VmDriver::StopMachine(const std::string& id, pid_t pid) {
  const std::string name = DomainName(id);
  const std::string marker = Marker(id);
  if (pid <= 0) pid = QemuPid(name);
  auto conn = Conn();
  if (conn.ok()) {
    DomainRef dom{virDomainLookupByName(*conn, name.c_str())};
    if (dom.d) {
      if (virDomainIsActive(dom.d) == 1 && virDomainDestroy(dom.d) < 0 && virDomainIsActive(dom.d) == 1)
        return Status::Internal("vm " + id + ": libvirt could not destroy domain " + name + ": " + LastError());
      // Transient domains are dsec's; a persistent one (defined by hand) is
      // undefined too, and if that fails it stays defined, stopped: harmless.
      if (virDomainIsPersistent(dom.d) == 1) (void)virDomainUndefine(dom.d);
    }
  }
  // Its QEMU, when libvirt did not answer or let it be: the recorded pid, if
  // it still names the domain (never a process found by that alone).
  if (pid > 0 && vm::ProcessHas(pid, marker) && !vm::KillAndWait(pid, 5000) && vm::ProcessHas(pid, marker))
    return Status::Internal("vm " + id + ": its QEMU (pid " + std::to_string(pid) + ") did not exit after SIGKILL");
  if (!conn.ok() && pid <= 0 && !vm::ProcessesWith(marker).empty())
    return conn.status().Annotate("vm " + id + ": its domain " + name + " may still run");
  return Status::Ok();
}

Status VmDriver::MachineStillThere(const Box& box) const {
  auto conn = Conn();
  if (!conn.ok()) return conn.status();
  const std::string name = DomainName(box.mid);
  DomainRef dom{virDomainLookupByName(*conn, name.c_str())};
  if (!dom.d || virDomainIsActive(dom.d) != 1) return Status::Unavailable("its domain " + name + " is gone");
  pid_t now = QemuPid(name);
  if (now != box.pid || !vm::ProcessHas(box.pid, Marker(box.mid)))
    return Status::Unavailable("its domain " + name + " runs another QEMU (pid " + std::to_string(now) +
                               ", recorded " + std::to_string(box.pid) + ")");
  return Status::Ok();
}

std::string VmDriver::ConsoleTail(const Box& box, size_t max_bytes) const {
  std::string path = box.dir + "/console";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return "";
  off_t end = ::lseek(fd.get(), 0, SEEK_END);
  if (end <= 0) return "";
  off_t from = end > static_cast<off_t>(max_bytes) ? end - static_cast<off_t>(max_bytes) : 0;
  std::string s(static_cast<size_t>(end - from), '\0');
  ssize_t n = ::pread(fd.get(), s.data(), s.size(), from);
  s.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return s;
}

std::vector<std::string> VmDriver::StrayMachines() const {
  std::vector<std::string> ids;
  auto conn = Conn();
  if (!conn.ok()) {
    Log(2, "vm: cannot look for domains no record names: " + conn.status().message());
    return ids;
  }
  virDomainPtr* doms = nullptr;
  int n = virConnectListAllDomains(*conn, &doms, 0);
  for (int i = 0; i < n; ++i) {
    const char* name = virDomainGetName(doms[i]);
    if (name && std::string(name).rfind(prefix_, 0) == 0) ids.push_back(std::string(name).substr(prefix_.size()));
    virDomainFree(doms[i]);
  }
  free(doms);
  return ids;
}

void VmDriver::AddStats(nlohmann::json& stats) const {
  stats["uri"] = vopts_.uri;
  stats["domain_prefix"] = prefix_;
  std::lock_guard<std::mutex> lk(conn_mu_);
  stats["libvirt"] = conn_ ? "connected" : conn_error_.empty() ? "connecting" : conn_error_;
}

// libvirtd starts the guest's QEMU, which opens the tap by name in
// libvirtd's network namespace: that must be dsecd's. libvirtd is whoever
// answers on the local socket of qemu:///system (its peer credentials: a
// pid file names the host's libvirtd even when dsecd talks to another one,
// in a mount namespace of its own). Unknown (no local socket answers: a
// remote URI, or libvirtd down) is taken for the same (the creation then
// says what failed).
std::string VmDriver::NetworkGap() const {
  pid_t pid = 0;
  for (const char* path : {"/run/libvirt/libvirt-sock", "/run/libvirt/virtqemud-sock"}) {
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    ucred cred{};
    socklen_t len = sizeof cred;
    if (s && ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockopt(s.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
      pid = cred.pid;
      break;
    }
  }
  if (pid <= 0) return "";
  struct stat ours{}, theirs{};
  if (::stat("/proc/self/ns/net", &ours) != 0 || ::stat(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), &theirs) != 0)
    return "";
  if (ours.st_ino == theirs.st_ino && ours.st_dev == theirs.st_dev) return "";
  return "libvirtd (pid " + std::to_string(pid) +
         ") runs in another network namespace than dsecd, so a vm's QEMU cannot open its tap; run dsecd in "
         "libvirtd's namespace (the host's)";
}

}  // namespace dsec::drivers
