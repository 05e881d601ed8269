#include "drivers/vm/guest_driver.hpp"
#include "drivers/images/mounts.hpp"

#include "drivers/net/node_network.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "drivers/vm/vm_state.pb.h"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"
#include "runtime/proto_json.hpp"

namespace dsec::drivers {

namespace {


constexpr uint64_t kMiB = 1ull << 20;
// A worker waits out a boot (QEMU does the work): up to this many boots at
// once, the others queue.
constexpr int kWorkers = 8;
// Guest memory beyond the sandbox's limit: the guest kernel, its page
// cache and the agent live outside the sandbox's cgroup in the guest.
constexpr uint64_t kGuestHeadroom = 192 * kMiB;

// Whether DAMON could find idle memory here: it needs a kdamond of its own
// (writing to one that runs would take it from whoever started it).
std::string DamonState() {
  const std::string root = "/sys/kernel/mm/damon/admin/kdamonds";
  auto n = ReadFileToString(root + "/nr_kdamonds");
  if (!n.ok()) return "unavailable: the kernel has no DAMON sysfs interface";
  int count = std::atoi(n->c_str());
  for (int i = 0; i < count; ++i) {
    auto state = ReadFileToString(root + "/" + std::to_string(i) + "/state");
    if (state.ok() && state->rfind("off", 0) == 0)
      return "available (kdamond " + std::to_string(i) + " is free) but not used: the balloon does the reclaim";
  }
  return "unavailable: every kdamond (" + std::to_string(count) +
         ") is in use by someone else; idle memory is reclaimed through the balloon";
}

}  // namespace

const KindTraits& GuestDriver::GuestTraits() {
  static const KindTraits t = [] {
    KindTraits k = StatefulTraits(v1::ISOLATION_KERNEL);
    k.network = true;  // a tap per guest and the node's rules (drivers/net/), where the node has them
    k.guard = true;    // the guest's init masks and binds the paths, its agent reads the changes (guest_guard.cpp)
    return k;
  }();
  return t;
}

GuestDriver::GuestDriver(GuestDriverOptions options, const char* kind_name, const char* vms_dir)
    : BoxDriver(kind_name, options.log), opts_(std::move(options)), vms_(AbsolutePath(opts_.data_dir) + "/" + vms_dir) {
  // Absolute: libvirtd and a daemonized QEMU do not share our working dir.
  if (opts_.agent_path.empty()) opts_.agent_path = SiblingExecutable("DSEC_AGENT", "dsec-agent");
  if (opts_.guest_dir.empty()) opts_.guest_dir = opts_.data_dir + "/guest";
  opts_.guest_dir = AbsolutePath(opts_.guest_dir);
  UseNetwork({opts_.network, opts_.network_unavailable, opts_.network_open});
}

Status GuestDriver::Init() {
  auto accel = vm::ChooseAccelerator(opts_.accel, &accel_why_);
  if (!accel.ok()) return accel.status();
  accel_ = *accel;
  DSEC_RETURN_IF_ERROR(MakeDirs(vms_, 0700));
  tsc_khz_ = vm::HostTscKhz();
  damon_ = DamonState();
  // What the last run left: each VM dir is claimed by the Readopt or the
  // creation of its machine, or removed by the sweep after the restore.
  for (const auto& name : ListSubdirs(vms_)) NoteLeftover(name);
  StartWorkers(kWorkers);
  // The idle scan: idle guests' memory given back, and the pools of
  // snapshots removed since dropped.
  if (opts_.reclaim_idle_ms > 0 || opts_.pool_size > 0) StartIdleScan(std::chrono::seconds(1));
  // The images whose paths a guard walks are mounted here for the walk.
  guard_mounts_ = std::make_unique<images::ImageMounts>(opts_.data_dir + "/run/guard-images");
  guard_mounts_->Adopt();
  guard_mounts_->DropUnused();
  watcher_ = std::make_unique<vm::VmWatcher>([this](const std::string& id, const std::string& what) { OnEnded(id, what); });
  return Status::Ok();
}

GuestDriver::~GuestDriver() { JoinWorkers(); }

void GuestDriver::JoinWorkers() {
  StopIdleScan();
  Stop();
  StopWorkers();
}

void GuestDriver::ScanIdle(const std::shared_ptr<AgentBox>& agent_box, int64_t now) {
  auto box = std::static_pointer_cast<Box>(agent_box);
  {
    std::lock_guard<std::mutex> lk(box->idle_mu);
    if (opts_.reclaim_idle_ms <= 0 || box->paused || box->active > 0 || now - box->last_active_ms < opts_.reclaim_idle_ms ||
        box->reclaimed_ms >= box->last_active_ms)
      return;
    box->reclaimed_ms = now;
  }
  Work([this, box] { Reclaim(box); });
}

void GuestDriver::Reclaim(const std::shared_ptr<Box>& box) {
  if (!box->agent || !box->agent->connected()) return;
  // The guest's own agent binary (init copies it to /run/dsec/agent): no
  // program of the image is needed. Not an exec of the sandbox's: it leaves
  // last_active_ms alone.
  agent::Exec req;
  req.add_argv("/run/dsec/agent");
  req.add_argv("--reclaim");
  req.add_env("PATH=/usr/bin:/bin");
  req.mutable_limits()->set_timeout_ms(30'000);
  req.set_privileged(true);  // drop_caches needs CAP_SYS_ADMIN, which a guarded guest's execs lose
  auto r = box->agent->ExecSync(req, std::chrono::milliseconds(35'000));
  if (!r.ok() || !r->exited() || r->exit_code() != 0) {
    Log(1, std::string(kind_name()) + " " + box->id + ": idle reclaim failed: " +
               (r.ok() ? "exit " + std::to_string(r->exit_code()) + ": " + r->stderr() : r.status().message()));
    return;
  }
  long kib = 0;
  std::sscanf(r->stdout().c_str(), "freed %ld KiB", &kib);
  ++reclaims_;
  if (kib > 0) reclaimed_kib_ += static_cast<uint64_t>(kib);
  Log(0, std::string(kind_name()) + " " + box->id + ": idle: the guest freed " + std::to_string(kib) + " KiB");
}

void GuestDriver::Stop() {
  // VMs outlive dsecd: nothing is reported about them from here on. The
  // workers stay until the destructor, so calls still made answer. Pooled
  // guests belong to no sandbox: they go.
  DrainPools();
  std::unique_ptr<vm::VmWatcher> w;
  {
    std::lock_guard<std::mutex> lk(watcher_mu_);
    w = std::move(watcher_);
  }
}

void GuestDriver::WorkOn(const std::string& id, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    busy_.insert(id);
  }
  Work([this, id, job = std::move(job)] {
    job();
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_.erase(id);
    }
    busy_cv_.notify_all();
  });
}

std::string GuestDriver::VmDir(const std::string& id) const { return vms_ + "/" + id; }

Status GuestDriver::Available() const {
  struct stat st;
  std::string kernel = opts_.guest_dir + "/vmlinux";
  if (::stat(kernel.c_str(), &st) < 0 || ::stat((opts_.guest_dir + "/base.cpio").c_str(), &st) < 0)
    return Status::FailedPrecondition("not available on this host: the VM guest is not prepared in " +
                                      opts_.guest_dir + ": run `" + vm::PrepareCommand(opts_.guest_dir) + "`");
  return MachineAvailable();
}

Status GuestDriver::GuestSize(const v1::SandboxSpec& spec, uint64_t* memory, uint32_t* vcpus) const {
  const v1::Limits& lim = spec.limits();
  *memory = lim.memory_bytes() ? lim.memory_bytes() : opts_.default_memory;
  if (*memory > opts_.max_memory)
    return Status::InvalidArgument("limits.memory_bytes " + std::to_string(*memory) +
                                   " is above this node's VM maximum of " + std::to_string(opts_.max_memory) +
                                   " (--vm-max-memory)");
  *vcpus = lim.cpu_millis() ? (lim.cpu_millis() + 999) / 1000 : 1;
  if (*vcpus > opts_.max_vcpus)
    return Status::InvalidArgument("limits.cpu_millis " + std::to_string(lim.cpu_millis()) + " asks for " +
                                   std::to_string(*vcpus) + " vCPUs, above this node's VM maximum of " +
                                   std::to_string(opts_.max_vcpus) + " (--vm-max-vcpus)");
  return Status::Ok();
}

Status GuestDriver::CanHandle(const v1::SandboxSpec& spec) const {
  DSEC_RETURN_IF_ERROR(Available());
  uint64_t mem;
  uint32_t vcpus;
  DSEC_RETURN_IF_ERROR(GuestSize(spec, &mem, &vcpus));
  auto image = opts_.images->Get(spec.image());
  if (!image.ok()) return image.status();
  return CheckNetwork(spec, NetworkGap());
}

Result<vm::Guest> GuestDriver::EnsureGuest() {
  std::lock_guard<std::mutex> lk(guest_mu_);
  struct stat st;
  int64_t mtime = ::stat((opts_.guest_dir + "/base.cpio").c_str(), &st) == 0
                      ? st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec
                      : 0;
  if (guest_ && mtime == guest_mtime_) return *guest_;
  auto g = vm::LoadGuest(opts_.guest_dir, SiblingExecutable("DSEC_GUEST_INIT", "dsec-guest-init"), opts_.agent_path,
                         vms_ + "/initrd");
  if (!g.ok()) return g.status();
  guest_ = *g;
  guest_mtime_ = mtime;
  Log(1, std::string(kind_name()) + ": guest kernel " + g->kernel_version + " from " + opts_.guest_dir);
  return *g;
}

Result<std::shared_ptr<AgentBox>> GuestDriver::RunningBox(const std::string& id) const {
  auto box = Find(id);
  if (!box || !box->agent || !box->agent->connected())
    return Status::Unavailable(std::string(kind_name()) + " " + id +
                               " is not running on this node (its agent is not connected)");
  {
    std::lock_guard<std::mutex> lk(box->idle_mu);
    box->last_active_ms = SteadyClockMs();
  }
  return std::shared_ptr<AgentBox>(box);
}

void GuestDriver::Create(const v1::SandboxRecord& sb, CreateCallback done) {
  WorkOn(sb.id(), [this, sb, done = std::move(done)] { done(CreateNow(sb)); });
}

Result<std::string> GuestDriver::CreateNow(const v1::SandboxRecord& sb) {
  const std::string& id = sb.id();
  const std::string kind = kind_name();
  auto image = opts_.images->Get(sb.spec().image());
  if (!image.ok()) return image.status();
  uint64_t memory;
  uint32_t vcpus;
  DSEC_RETURN_IF_ERROR(GuestSize(sb.spec(), &memory, &vcpus));
  DSEC_RETURN_IF_ERROR(MachineAvailable());
  if (ClaimLeftover(id)) {
    // A creation of this id that a crash cut short (a session creates its
    // sandboxes under ids it chose first): removed before anew.
    Log(1, kind + " " + id + ": left over from a creation cut short by a restart; removed before creating it again");
    DSEC_RETURN_IF_ERROR(DestroyNow(id, id, 0));
  }
  auto policy = net::ParsePolicy(sb.spec().network());
  if (!policy.ok()) return policy.status();
  // A guest with a network boots with its NIC: never one from the pool.
  // One from a snapshot comes from that snapshot's pool (restored and
  // waiting; its identity given here), unless the snapshot is a fork's
  // own (used for its forks at once, then gone: a pool would only compete
  // with them).
  bool networked = NeedsLink(*policy);
  const std::string& snap = sb.spec().snapshot();
  bool poolable = opts_.pool_size > 0 && !networked && snap.rfind("fork-", 0) != 0;
  std::string key = poolable ? PoolKey(sb.spec()) : "";
  std::shared_ptr<Box> box = key.empty() ? nullptr : TakeFromPool(key);
  if (box && !snap.empty()) {
    box->id = id;
    if (Status s = Reidentify(*box, /*fresh=*/true); !s.ok()) {
      Log(2, kind + " " + id + ": a pooled guest of snapshot " + snap + " could not take its identity (" +
                 s.message() + "); restoring one instead");
      if (box->agent) box->agent->Close();
      RemoveOrSay(*box, "a pooled guest that could not take its identity");
      box = nullptr;
    }
  }
  if (box) {
    ++pool_hits_;
    Log(0, kind + " " + id + ": a ready guest from the pool (" + box->mid + ")");
  } else {
    auto booted = Boot(id, sb.spec());
    if (!booted.ok()) return booted.status().Annotate("sandbox " + id);
    box = *booted;
  }
  box->id = id;
  box->limits = sb.spec().limits();
  box->last_active_ms = SteadyClockMs();
  PutBox(box);
  Watch(*box);
  ++created_;
  if (!key.empty()) Work([this, key, spec = sb.spec()] { Refill(key, spec); });
  dsec::vm::VmState state;
  state.set_digest(box->digest);
  state.set_image_file(box->image_file);
  state.set_cgroup(box->cgroup_rel);
  state.set_pid(box->pid);
  state.set_dir(box->dir);
  state.set_accelerator(accel_);
  state.set_guest_memory_bytes(box->guest_memory);
  state.set_vcpus(box->vcpus);
  if (networked) {
    state.set_network(true);
    state.set_net_slot(box->net_slot);
  }
  return state.SerializeAsString();
}

Result<std::shared_ptr<GuestDriver::Box>> GuestDriver::Boot(const std::string& mid, const v1::SandboxSpec& spec,
                                                            bool pooled) {
  const std::string kind = kind_name();
  auto image = opts_.images->Get(spec.image());
  if (!image.ok()) return image.status();
  uint64_t memory;
  uint32_t vcpus;
  DSEC_RETURN_IF_ERROR(GuestSize(spec, &memory, &vcpus));
  auto guest = EnsureGuest();
  if (!guest.ok()) return guest.status();
  auto box = std::make_shared<Box>();
  box->id = mid;
  box->mid = mid;
  box->dir = VmDir(mid);
  box->digest = image->digest();
  auto file = opts_.images->Open(*image);
  if (!file.ok()) return file.status();
  box->image_file = *file;
  box->limits = spec.limits();
  box->vcpus = vcpus;
  box->guest_memory = (memory + kGuestHeadroom + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
  {
    std::lock_guard<std::mutex> lk(mu_);
    claimed_.insert(mid);
  }
  auto undo = [&](const Status& why) -> Result<std::shared_ptr<Box>> {
    Log(2, kind + " " + mid + ": boot failed: " + why.message());
    if (Status left = DestroyNow("", mid, box->pid); !left.ok())
      Log(3, kind + " " + mid + ": removing what the failed boot left: " + left.message() + " (the next start sweeps it)");
    return why;
  };
  if (::mkdir(box->dir.c_str(), 0700) < 0) return undo(Status::FromErrno(errno, "mkdir " + box->dir));

  // Its NIC: a tap with the sandbox's rules, made before QEMU opens it.
  Launch launch{box.get(), &*guest, "", &spec, "", "", "", false};
  auto policy = net::ParsePolicy(spec.network());
  if (!policy.ok()) return undo(policy.status());
  if (!spec.snapshot().empty())
    if (Status s = PrepareRestore(spec, box.get(), &launch); !s.ok()) return undo(s);
  net::SandboxNet link;
  if (NeedsLink(*policy)) {
    if (!network()) return undo(Status::FailedPrecondition(kind + " networking is unavailable on this node"));
    auto reserved = network()->Reserve(mid);
    if (!reserved.ok()) return undo(reserved.status());
    link = *reserved;
    box->net_slot = link.slot;
    box->networked = true;
    if (Status s = network()->AttachTap(mid, *policy); !s.ok()) return undo(s);
    launch.tap = link.ifname;
    char mac[18];
    std::snprintf(mac, sizeof mac, "52:54:00:%02x:%02x:%02x", (link.slot >> 16) & 0xff, (link.slot >> 8) & 0xff,
                  link.slot & 0xff);
    launch.mac = mac;
  }
  const v1::Limits& lim = spec.limits();
  // swiotlb=noforce: no 64 MiB bounce buffer. The kernel makes one when
  // memory reaches above 4 GiB, as a vm guest's pmem region does; virtio
  // devices here DMA anywhere, so it would only hold 64 MiB of host memory.
  std::string cmdline = "console=ttyS0 quiet panic=-1 reboot=t swiotlb=noforce";
  if (tsc_khz_) cmdline += " tsc_early_khz=" + std::to_string(tsc_khz_) + " tsc=reliable";
  cmdline += " dsec.host=" + mid.substr(0, 63);
  cmdline += " dsec.mem=" + std::to_string(memory);
  cmdline += " dsec.pids=" + (lim.pids() ? std::to_string(lim.pids()) : std::string("max"));
  cmdline += " dsec.rw=" + std::to_string(lim.disk_bytes() ? lim.disk_bytes() : memory);
  if (!launch.tap.empty()) cmdline += " dsec.net=" + net::Ipv4Text(link.addr) + "/30," + net::Ipv4Text(link.gateway);
  image->set_file(box->image_file);
  auto guarded = GuardCmdline(spec, *image);
  if (!guarded.ok()) return undo(guarded.status());
  launch.cmdline = cmdline + *guarded;
  auto t0 = std::chrono::steady_clock::now();
  if (Status s = LaunchMachine(launch); !s.ok()) return undo(s);
  if (!launch.restore.empty())
    if (Status s = IncomingMachine(*box, launch.restore); !s.ok()) return undo(s.Annotate("restore"));
  auto t_started = std::chrono::steady_clock::now();
  // Until the agent answers: a guest that stopped (its /init failed and
  // powered off, or its kernel panicked) fails the boot at once, with its
  // console.
  Status connected;
  auto boot_deadline = t_started + std::chrono::milliseconds(opts_.boot_timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(boot_deadline - std::chrono::steady_clock::now());
    int attempt = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 3000));
    connected = ConnectAgent(*box, box->dir + "/a", attempt,
                             [this, kind, mid](const std::string& t) { Log(2, kind + " " + mid + ": " + t); },
                             /*vm_channel=*/true);
    if (connected.ok()) break;
    // Gone, or a run state that is not running; a VMM that is slow to
    // answer (a loaded host) is waited for until the deadline.
    RunState state = MachineState(*box);
    bool stopped = state == RunState::kGone || state == RunState::kStopped || state == RunState::kPaused;
    if (stopped || std::chrono::steady_clock::now() >= boot_deadline) {
      std::string console = ConsoleTail(*box, 2000);
      if (state == RunState::kGone) connected = Status::Unavailable("its QEMU exited during boot");
      else if (stopped) connected = Status::Unavailable("the guest stopped during boot");
      Status why = connected.Annotate(kind + " boot (" + accel_ + ")");
      if (!console.empty()) why = Status(why.code(), why.message() + "; the guest's console ends: " + console);
      return undo(why);
    }
  }
  // A pooled guest takes its identity when it is handed out.
  if (!launch.restore.empty() && !pooled)
    if (Status s = Reidentify(*box, /*fresh=*/true); !s.ok()) return undo(s);
  auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  Log(0, kind + " " + mid + (launch.restore.empty() ? "" : " (from snapshot " + spec.snapshot() + ")") + ": launched in " + std::to_string(ms(t_started - t0)) + " ms, agent answered after " +
             std::to_string(ms(std::chrono::steady_clock::now() - t_started)) + " ms (" + accel_ + ")");
  return box;
}

void GuestDriver::RemoveOrSay(const Box& box, const char* what) {
  if (Status s = DestroyNow("", box.mid, box.pid); !s.ok())
    Log(3, std::string(kind_name()) + " " + box.mid + ": removing " + what + ": " + s.message() +
               " (the next start sweeps it)");
}

Status GuestDriver::DestroyNow(const std::string& id, const std::string& mid, pid_t pid) {
  DSEC_RETURN_IF_ERROR(StopMachine(mid, pid));
  // Its tap, rules and slot (none for a guest without a network).
  if (network()) DSEC_RETURN_IF_ERROR(network()->Release(mid).Annotate(std::string(kind_name()) + " " + mid));
  if (Status s = RemoveTree(VmDir(mid)); !s.ok()) return s.Annotate(std::string(kind_name()) + " " + mid);
  if (!id.empty()) TakeBox(id);
  std::lock_guard<std::mutex> lk(mu_);
  claimed_.erase(mid);
  return Status::Ok();
}

void GuestDriver::Destroy(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) {
  auto box = Find(sb.id());
  pid_t pid = box ? box->pid : 0;
  std::string mid = box ? box->mid : sb.id();
  dsec::vm::VmState state;
  if (!box && state.ParseFromString(driver_state)) {
    pid = state.pid();
    if (!state.dir().empty()) mid = state.dir().substr(state.dir().rfind('/') + 1);
  }
  {
    std::lock_guard<std::mutex> lk(watcher_mu_);
    if (watcher_) watcher_->Unwatch(sb.id());
  }
  Work([this, id = sb.id(), mid, box, pid, done = std::move(done)] {
    // A creation of this id still running finishes first (its VM is then
    // the one destroyed, not left behind without a record).
    {
      std::unique_lock<std::mutex> lk(mu_);
      busy_cv_.wait(lk, [&] { return !busy_.count(id); });
    }
    {
      std::lock_guard<std::mutex> lk(watcher_mu_);
      if (watcher_) watcher_->Unwatch(id);
    }
    auto now = Find(id);
    if (now && now->agent) now->agent->Close();
    pid_t p = now ? now->pid : pid;
    if (box && box->agent) box->agent->Close();
    Status s = DestroyNow(id, now ? now->mid : mid, p);
    if (s.ok()) ++destroyed_;
    done(s);
  });
}

std::string GuestDriver::DescribeState(const std::string& driver_state) const {
  dsec::vm::VmState state;
  return state.ParseFromString(driver_state) ? DumpJson(ProtoJson(state)) : std::string();
}

void GuestDriver::Readopt(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) {
  WorkOn(sb.id(), [this, sb, driver_state, done = std::move(done)] {
    Status s = ReadoptNow(sb, driver_state);
    if (s.ok()) ++readopted_;
    done(s);
  });
}

Status GuestDriver::ReadoptNow(const v1::SandboxRecord& sb, const std::string& driver_state) {
  const std::string kind = kind_name();
  dsec::vm::VmState state;
  if (!state.ParseFromString(driver_state) || state.dir().empty())
    return Status::FailedPrecondition(kind + " " + sb.id() + ": its driver state is not a VmState");
  auto box = std::make_shared<Box>();
  box->id = sb.id();
  box->dir = state.dir();
  box->mid = state.dir().substr(state.dir().rfind('/') + 1);
  box->cgroup_rel = state.cgroup();
  box->digest = state.digest();
  box->image_file = state.image_file();
  box->pid = state.pid();
  box->guest_memory = state.guest_memory_bytes();
  box->vcpus = state.vcpus();
  box->networked = state.network();
  box->net_slot = state.net_slot();
  box->limits = sb.spec().limits();
  {
    std::lock_guard<std::mutex> lk(mu_);
    claimed_.insert(box->mid);
  }
  (void)ClaimLeftover(box->mid);  // its dir is its own from here, kept or removed
  auto fail = [&](const Status& why) {
    if (Status left = DestroyNow(sb.id(), box->mid, box->pid); !left.ok())
      Log(3, kind + " " + sb.id() + ": removing what is left of it: " + left.message());
    return why;
  };
  if (box->mid.empty() || AbsolutePath(box->dir) != VmDir(box->mid)) return fail(Status::FailedPrecondition(kind + " " + sb.id() + ": its dir moved"));
  if (Status s = ReadoptSaved(box, sb); s.code() != Status::Code::kNotFound) return s.ok() ? s : fail(s);
  if (Status s = MachineStillThere(*box); !s.ok()) return fail(s.Annotate(kind + " " + sb.id()));
  if (box->networked) {
    // Its tap outlived dsecd with it; its rules are put back.
    auto policy = net::ParsePolicy(sb.spec().network());
    Status s = !policy.ok()   ? policy.status()
               : !network() ? Status::FailedPrecondition("its network: this node has none now")
                            : network()->Readopt(box->mid, network()->ForSlot(box->net_slot), *policy);
    if (!s.ok()) return fail(s.Annotate(kind + " " + sb.id()));
  }
  // A paused guest cannot answer: resumed for the handshake, paused again.
  bool paused = sb.phase() == v1::SANDBOX_PHASE_PAUSED;
  (void)PauseMachine(*box, false);  // a machine that will not run fails the handshake below, saying so
  Status connected = ConnectAgent(*box, box->dir + "/a", 30'000,
                                  [this, kind, id = sb.id()](const std::string& t) { Log(2, kind + " " + id + ": " + t); },
                                  /*vm_channel=*/true);
  if (connected.ok() && paused) {
    Status s = Status::Unavailable("not tried");
    for (int i = 0; i < 3 && !s.ok(); ++i) s = PauseMachine(*box, true);
    if (!s.ok())  // the VM is fine, only not paused: kept for a destroy to remove
      return s.Annotate(kind + " " + sb.id() + ": re-adopted but could not be paused again");
  }
  if (!connected.ok()) return fail(connected.Annotate(kind + " " + sb.id() + ": re-adopt"));
  box->paused = paused;
  box->last_active_ms = SteadyClockMs();
  PutBox(box);
  Watch(*box);
  return Status::Ok();
}

void GuestDriver::Watch(const Box& box) {
  std::lock_guard<std::mutex> lk(watcher_mu_);
  if (!watcher_) return;
  if (Status s = watcher_->Watch(box.id, box.pid, EventSocket(box)); !s.ok())
    Log(2, std::string(kind_name()) + " " + box.id + ": not watched (its end will be noticed at its next call): " +
               s.message());
}

void GuestDriver::OnEnded(const std::string& id, const std::string& what) {
  Work([this, id, what] {
    auto box = Find(id);
    if (!box) return;  // destroyed meanwhile
    std::string why;
    std::string console = ConsoleTail(*box, 4000);
    size_t panic = console.find("Kernel panic");
    if (what == "guest-panic" || panic != std::string::npos) {
      std::string line = panic == std::string::npos ? "" : console.substr(panic, console.find('\n', panic) - panic);
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      why = "its guest kernel panicked" + (line.empty() ? "" : ": " + line);
    } else if (what == "exited") {
      why = "its QEMU (pid " + std::to_string(box->pid) + ") exited by itself (killed?)";
    } else if (what == "guest-shutdown") {
      why = "its guest powered off";
    } else {
      why = "its guest stopped (" + what + ")";
    }
    Log(2, std::string(kind_name()) + " " + id + ": " + why);
    ++lost_;
    if (box->agent) box->agent->Close();
    if (opts_.lost) opts_.lost(id, "lost: " + why);
  });
}

void GuestDriver::Restored() {
  Work([this] { RestoredNow(); });
}

void GuestDriver::RestoredNow() {
  // Dirs no record claimed (a creation a crash cut short, a sandbox whose
  // record is gone, a pooled guest of the last run), and machines of this
  // node's that no box or boot of this run holds: stopped and removed. Only
  // this data dir's VMs are judged.
  std::vector<std::string> strays;
  for (const auto& name : StrayMachines()) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!claimed_.count(name) && !busy_.count(name)) strays.push_back(name);
  }
  for (const auto& name : strays) NoteLeftover(name);
  swept_ += SweepLeftovers([this](const std::string& name) { return DestroyNow("", name, 0); },
                           "no record names it; stopping it");
}

std::string GuestDriver::StatsJson() const {
  size_t watched = 0;
  {
    std::lock_guard<std::mutex> lk(watcher_mu_);
    if (watcher_) watched = watcher_->size();
  }
  size_t n = BoxCount(), ready = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [key, pool] : pools_) ready += pool.ready.size();
  }
  nlohmann::json j = {{"vms", n},
                      {"created", created_.load()},
                      {"destroyed", destroyed_.load()},
                      {"readopted", readopted_.load()},
                      {"swept", swept_.load()},
                      {"lost", lost_.load()},
                      {"reclaims", reclaims_.load()},
                      {"damon", damon_},
                      {"reclaimed_kib", reclaimed_kib_.load()},
                      {"pool_size", opts_.pool_size},
                      {"pool_ready", ready},
                      {"pool_hits", pool_hits_.load()},
                      {"pool_boots", pool_boots_.load()},
                      {"watched", watched},
                      {"accelerator", accel_},
                      {"accelerator_why", accel_why_},
                      {"guest_dir", opts_.guest_dir},
                      {"runs_in_flight", RunsInFlight()}};
  AddStats(j);
  return j.dump();
}

}  // namespace dsec::drivers
