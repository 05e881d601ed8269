#include "drivers/microvm/microvm_driver.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

namespace {

constexpr uint64_t kMiB = 1ull << 20;
// What QEMU itself takes beyond the guest's memory (TCG's translation
// cache is capped at 64 MiB by tb-size).
constexpr uint64_t kQemuOverhead = 256 * kMiB;

}  // namespace

const KindTraits& MicrovmDriver::Traits() {
  static const KindTraits t = [] {
    KindTraits k = GuestTraits();
    k.snapshot = true;  // memory and device state (microvm_memory.cpp)
    k.fork = true;
    k.pause_memory = true;  // its memory to disk, its QEMU ended (guest_snapshot.cpp)
    return k;
  }();
  return t;
}

MicrovmDriver::MicrovmDriver(MicrovmOptions options)
    : GuestDriver(options, "microvm", "vms"), qemu_option_(options.qemu), cgroup_parent_(options.cgroup_parent) {}

Result<std::unique_ptr<MicrovmDriver>> MicrovmDriver::Start(MicrovmOptions o) {
  std::unique_ptr<MicrovmDriver> d(new MicrovmDriver(std::move(o)));
  d->qemu_ = vm::FindInPath(d->qemu_option_);
  if (d->qemu_.empty())
    return Status::FailedPrecondition("QEMU (" + d->qemu_option_ +
                                      ") is not installed: apt-get install qemu-system-x86, or give --microvm-qemu PATH");
  auto groups = cgroup::Groups::Discover();
  if (!groups.ok()) return groups.status().Annotate("microvm: QEMU runs in a cgroup of its own");
  d->groups_ = std::move(*groups);
  DSEC_RETURN_IF_ERROR(d->Init());
  d->Log(1, "microvm: QEMU " + d->qemu_ + ", accelerator " + d->accel() + ", guest in " + d->options().guest_dir);
  return d;
}

MicrovmDriver::~MicrovmDriver() {
  JoinWorkers();
  // With no VM left, their parent groups go too (rmdir: kept while not empty).
  if (groups_) {
    groups_->RemoveDirs(cgroup_parent_ + "/vm");
    groups_->RemoveDirs(cgroup_parent_);
  }
}

std::string MicrovmDriver::CgroupRel(const std::string& id) const { return cgroup_parent_ + "/vm/" + id; }

Status MicrovmDriver::LaunchMachine(const Launch& l) {
  Box& box = *l.box;
  box.cgroup_rel = CgroupRel(box.mid);
  // QEMU's group: the guest's memory and QEMU's own, the vCPUs' CPU time.
  DSEC_RETURN_IF_ERROR(groups_->Make(box.cgroup_rel));
  cgroup::GroupLimits have = cgroup::GroupLimits::Fresh(), want;
  want.memory = static_cast<int64_t>(box.guest_memory + kQemuOverhead);
  want.pids = -1;
  uint32_t millis = l.spec->limits().cpu_millis() ? l.spec->limits().cpu_millis() : box.vcpus * 1000;
  want.cpu_quota = static_cast<int64_t>(millis) * 100;
  DSEC_RETURN_IF_ERROR(groups_->ApplyLimits(box.cgroup_rel, want, &have));

  // Guest RAM (microvm_memory.cpp): a memfd QEMU finds as fd 3. Booted or
  // resumed: its own, shared; made from a snapshot: the snapshot's sealed
  // one, private (copy-on-write).
  UniqueFd ram, fill;
  struct stat ram_file {};
  // A saved state without a `ram` file carries the RAM in its stream.
  const bool in_stream = !l.restore.empty() && ::stat((l.restore + "/ram").c_str(), &ram_file) != 0;
  const bool private_ram = !l.restore.empty() && (l.shared || in_stream);
  if (!l.restore.empty() && l.shared && !in_stream) {
    auto base = BaseRam(l.restore, box.guest_memory);
    if (!base.ok()) return base.status().Annotate("the snapshot's memory");
    box.hold = *base;
    ram.Reset(::fcntl((*base)->get(), F_DUPFD_CLOEXEC, 3));
  } else {
    ram.Reset(::memfd_create(kRamName, MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (ram && ::ftruncate(ram.get(), static_cast<off_t>(box.guest_memory)) < 0) ram.Reset();
    if (!l.restore.empty() && !in_stream) {
      fill.Reset(::open((l.restore + "/ram").c_str(), O_RDONLY | O_CLOEXEC));
      if (!fill) return Status::FromErrno(errno, "open " + l.restore + "/ram");
    }
  }
  if (!ram) return Status::FromErrno(errno, "guest memory (memfd)");
  const bool kvm = accel() == "kvm";
  const std::string mem_mib = std::to_string(box.guest_memory / kMiB);
  std::vector<std::string> args = {
      qemu_, "-name", "dsec-" + box.mid,
      "-M", "microvm,acpi=on,rtc=on,memory-backend=ram",
      "-object", "memory-backend-file,id=ram,size=" + mem_mib + "M,mem-path=/proc/self/fd/3,share=" +
                     (private_ram ? "off" : "on"),
      "-accel", kvm ? "kvm" : "tcg,tb-size=64",
      "-cpu", kvm ? "host" : "max",
      "-m", mem_mib, "-smp", std::to_string(box.vcpus),
      "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-no-shutdown",
      "-kernel", l.guest->kernel, "-initrd", l.guest->initrd, "-append", l.cmdline + " dsec.root=/dev/vda",
      "-chardev", "ringbuf,id=con,size=65536", "-serial", "chardev:con",
      "-drive", "id=img,file=" + box.image_file + ",format=raw,if=none,readonly=on,cache=none,aio=threads",
      "-device", "virtio-blk-device,drive=img",
      // Memory the guest frees goes back to the host.
      "-device", "virtio-balloon-device,free-page-reporting=on",
      "-device", "virtio-serial-device",
      "-chardev", "socket,id=agent,path=" + box.dir + "/a,server=on,wait=off",
      "-device", "virtserialport,chardev=agent,name=dsec.agent",
      "-qmp", "unix:" + box.dir + "/q,server=on,wait=off",
      "-qmp", "unix:" + box.dir + "/e,server=on,wait=off",  // the watcher's (events)
      "-pidfile", box.dir + "/pid", "-daemonize"};
  if (!l.tap.empty()) {
    // Its NIC on the tap NodeNetwork made (QEMU opens it by name).
    for (std::string a : {std::string("-netdev"), "tap,id=net0,ifname=" + l.tap + ",script=no,downscript=no,vhost=off",
                          std::string("-device"), "virtio-net-device,netdev=net0,mac=" + l.mac})
      args.push_back(std::move(a));
  }
  if (!l.restore.empty()) {
    args.push_back("-incoming");  // IncomingMachine loads the state
    args.push_back("defer");
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string log_path = box.dir + "/qemu.log";
  auto procs = groups_->ProcsPaths(box.cgroup_rel);
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!log) return Status::FromErrno(errno, "open " + log_path);
  pid_t launcher = ::fork();
  if (launcher < 0) return Status::FromErrno(errno, "fork for QEMU");
  if (launcher == 0) {
    // Async-signal-safe from here: join the group, leave our session, exec.
    for (const auto& p : procs) {
      int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::write(fd, "0", 1) != 1) ::_exit(120);
      ::close(fd);
    }
    ::setsid();
    // A resumed guest's memory, read in here: charged to its group.
    if (fill && CopyData(fill.get(), ram.get(), box.guest_memory) != 0) ::_exit(121);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ::dup2(devnull, 0);
    ::dup2(log.get(), 1);
    ::dup2(log.get(), 2);
    if (ram.get() == 3) ::fcntl(3, F_SETFD, 0);
    else if (::dup2(ram.get(), 3) != 3) ::_exit(122);
    ::syscall(SYS_close_range, 4u, ~0u, 0u);  // QEMU outlives us: nothing of dsecd's goes with it (but its RAM)
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int wst = 0;
  while (::waitpid(launcher, &wst, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
    auto log_text = ReadFileToString(log_path);
    std::string out = log_text.ok() ? *log_text : "";
    if (out.size() > 1500) out = out.substr(out.size() - 1500);
    int code = WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
    std::string why = code == 120   ? "could not join its cgroup"
                      : code == 121 ? "could not read its memory from " + l.restore + "/ram"
                      : code == 122 ? "could not hand QEMU its memory"
                                    : "QEMU failed to start (exit status " +
                                std::to_string(WIFEXITED(wst) ? WEXITSTATUS(wst) : -1) + ")";
    return Status::Internal(why + (out.empty() ? "" : ": " + out));
  }
  auto pid_text = ReadFileToString(box.dir + "/pid");
  box.pid = pid_text.ok() ? static_cast<pid_t>(std::atoi(pid_text->c_str())) : 0;
  if (box.pid <= 0) return Status::Internal("QEMU started but wrote no pid file");
  return Status::Ok();
}

GuestDriver::RunState MicrovmDriver::MachineState(const Box& box) const {
  if (!vm::ProcessHas(box.pid, box.dir + "/")) return RunState::kGone;
  auto status = vm::QmpExecute(box.dir + "/q", "query-status", "", 2000);
  if (!status.ok()) return RunState::kUnknown;  // slow to answer: a loaded host
  auto j = nlohmann::json::parse(*status, nullptr, false);
  std::string s = j.is_object() ? j.value("status", "") : "";
  if (s == "running") return RunState::kRunning;
  if (s == "prelaunch" || s == "inmigrate") return RunState::kStarting;
  if (s == "paused") return RunState::kPaused;
  return RunState::kStopped;  // shutdown, guest-panicked, internal-error, ...
}

Status MicrovmDriver::PauseMachine(const Box& box, bool paused) {
  auto r = vm::QmpExecute(box.dir + "/q", paused ? "stop" : "cont", "", 5000);
  return r.ok() ? Status::Ok() : r.status();
}

std::string MicrovmDriver::ConsoleTail(const Box& box, size_t max_bytes) const {
  auto r = vm::QmpExecute(box.dir + "/q", "ringbuf-read", R"({"device":"con","size":65536,"format":"utf8"})", 2000);
  if (!r.ok()) return "";
  auto j = nlohmann::json::parse(*r, nullptr, false);
  if (!j.is_string()) return "";
  std::string s = j.get<std::string>();
  if (s.size() > max_bytes) s = s.substr(s.size() - max_bytes);
  return s;
}

Status MicrovmDriver::StopMachine(const std::string& id, pid_t pid) {
  // `id`: the machine's name (its dir's, its group's).
  std::string marker = VmDir(id) + "/";
  // Its processes: what is in its group (QEMU joined it before it ran), and
  // its recorded QEMU if that pid still names the VM's dir. Never a process
  // found by its command line alone: anyone can name a path.
  std::string rel = CgroupRel(id);
  std::vector<pid_t> pids = groups_->Exists(rel) ? groups_->Pids(rel) : std::vector<pid_t>{};
  if (pid > 0 && vm::ProcessHas(pid, marker) && std::find(pids.begin(), pids.end(), pid) == pids.end())
    pids.push_back(pid);
  for (pid_t p : pids) {
    if (!vm::KillAndWait(p, 5000) && vm::ProcessHas(p, marker))
      return Status::Internal("microvm " + id + ": its QEMU (pid " + std::to_string(p) + ") did not exit after SIGKILL");
  }
  if (groups_->Exists(rel)) {
    groups_->KillAndRemove(rel);
    if (groups_->Exists(rel)) return Status::Internal("microvm " + id + ": its cgroup " + rel + " could not be removed");
  }
  return Status::Ok();
}

Status MicrovmDriver::MachineStillThere(const Box& box) const {
  auto in_group = groups_->Pids(box.cgroup_rel);
  if (!vm::ProcessHas(box.pid, box.dir + "/") ||
      std::find(in_group.begin(), in_group.end(), box.pid) == in_group.end())
    return Status::Unavailable("its QEMU (pid " + std::to_string(box.pid) + ") is gone");
  return Status::Ok();
}

void MicrovmDriver::AddStats(nlohmann::json& stats) const { stats["qemu"] = qemu_; }

}  // namespace dsec::drivers
