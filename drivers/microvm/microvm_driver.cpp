#include "drivers/microvm/microvm_driver.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "drivers/vm/vm_state.pb.h"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr uint64_t kMiB = 1ull << 20;
constexpr int kWorkers = 8;
// Guest memory beyond the sandbox's limit: the guest kernel, its page
// cache and the agent live outside the sandbox's cgroup in the guest.
constexpr uint64_t kGuestHeadroom = 192 * kMiB;
// What QEMU itself takes beyond the guest's memory (TCG's translation
// cache is capped at 64 MiB by tb-size).
constexpr uint64_t kQemuOverhead = 256 * kMiB;

std::string FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string p = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

// Waits up to timeout_ms for `pid` (not our child) to exit.
bool WaitGone(pid_t pid, int timeout_ms) {
  UniqueFd pfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pfd) return errno == ESRCH;
  pollfd p{pfd.get(), POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

bool KillAndWait(pid_t pid, int timeout_ms) {
  UniqueFd pfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pfd) return errno == ESRCH;
  ::syscall(SYS_pidfd_send_signal, pfd.get(), SIGKILL, nullptr, 0);
  pollfd p{pfd.get(), POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

Status RemoveTree(const std::string& dir) {
  for (const auto& name : ListEntries(dir)) {
    std::string p = dir + "/" + name;
    struct stat st;
    if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      DSEC_RETURN_IF_ERROR(RemoveTree(p));
    } else if (::unlink(p.c_str()) < 0 && errno != ENOENT) {
      return Status::FromErrno(errno, "remove " + p);
    }
  }
  if (::rmdir(dir.c_str()) < 0 && errno != ENOENT) return Status::FromErrno(errno, "remove " + dir);
  return Status::Ok();
}

}  // namespace

struct MicrovmDriver::Box : AgentBox {
  bool TrustsAgentOom() const override { return true; }
  pid_t pid = 0;
  std::string dir, cgroup_rel, digest, image_file;
  uint64_t guest_memory = 0;
  uint32_t vcpus = 1;
  bool paused = false;
};

const KindTraits& MicrovmDriver::Traits() {
  static const KindTraits t = [] {
    KindTraits t;
    t.isolation = v1::ISOLATION_KERNEL;
    t.stateful = true;
    t.files = true;
    t.pause = true;
    t.streaming = true;
    t.readoptable = true;
    t.own_loopback = true;
    return t;
  }();
  return t;
}

MicrovmDriver::MicrovmDriver(MicrovmOptions options) : opts_(std::move(options)) {}

Result<std::unique_ptr<MicrovmDriver>> MicrovmDriver::Start(MicrovmOptions o) {
  if (o.agent_path.empty()) o.agent_path = SiblingExecutable("DSEC_AGENT", "dsec-agent");
  if (o.guest_dir.empty()) o.guest_dir = o.data_dir + "/guest";
  std::unique_ptr<MicrovmDriver> d(new MicrovmDriver(std::move(o)));
  d->qemu_ = FindInPath(d->opts_.qemu);
  if (d->qemu_.empty())
    return Status::FailedPrecondition("QEMU (" + d->opts_.qemu +
                                      ") is not installed: apt-get install qemu-system-x86, or give --microvm-qemu PATH");
  auto accel = vm::ChooseAccelerator(d->opts_.accel, &d->accel_why_);
  if (!accel.ok()) return accel.status();
  d->accel_ = *accel;
  if (d->accel_ == "kvm") {
    // Nothing else to check: /dev/kvm opened.
  }
  auto groups = cgroup::Groups::Discover();
  if (!groups.ok()) return groups.status().Annotate("microvm: QEMU runs in a cgroup of its own");
  d->groups_ = std::move(*groups);
  DSEC_RETURN_IF_ERROR(MakeDirs(d->opts_.data_dir + "/vms", 0700));
  d->tsc_khz_ = vm::HostTscKhz();
  d->Log(1, "microvm: QEMU " + d->qemu_ + ", accelerator " + d->accel_ + " (" + d->accel_why_ + "), guest in " +
                d->opts_.guest_dir);
  // A worker waits out a boot (QEMU does the work): up to kWorkers boots at
  // once, the others queue.
  for (int i = 0; i < kWorkers; ++i) d->workers_.emplace_back([p = d.get()] { p->WorkerLoop(); });
  d->watcher_ = std::make_unique<vm::VmWatcher>(
      [p = d.get()](const std::string& id, const std::string& what) { p->OnEnded(id, what); });
  return d;
}

MicrovmDriver::~MicrovmDriver() {
  Stop();
  {
    std::lock_guard<std::mutex> lk(work_mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
  // With no VM left, their parent groups go too (rmdir: kept while not empty).
  if (groups_) {
    groups_->RemoveDirs(opts_.cgroup_parent + "/vm");
    groups_->RemoveDirs(opts_.cgroup_parent);
  }
}

void MicrovmDriver::Stop() {
  // VMs outlive dsecd: nothing is reported about them from here on. The
  // workers stay until the destructor, so calls still made answer.
  std::unique_ptr<vm::VmWatcher> w;
  {
    std::lock_guard<std::mutex> lk(watcher_mu_);
    w = std::move(watcher_);
  }
}

void MicrovmDriver::Work(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(work_mu_);
    work_.push_back(std::move(job));
  }
  work_cv_.notify_one();
}

void MicrovmDriver::WorkerLoop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(work_mu_);
      work_cv_.wait(lk, [this] { return stopping_ || !work_.empty(); });
      if (work_.empty()) return;
      job = std::move(work_.front());
      work_.pop_front();
    }
    job();
  }
}

void MicrovmDriver::Log(int level, const std::string& text) const {
  if (opts_.log) opts_.log(level, text);
}

std::string MicrovmDriver::VmDir(const std::string& id) const { return opts_.data_dir + "/vms/" + id; }
std::string MicrovmDriver::CgroupRel(const std::string& id) const { return opts_.cgroup_parent + "/vm/" + id; }

Status MicrovmDriver::Available() const {
  struct stat st;
  std::string kernel = opts_.guest_dir + "/vmlinux";
  if (::stat(kernel.c_str(), &st) < 0 || ::stat((opts_.guest_dir + "/base.cpio").c_str(), &st) < 0)
    return Status::FailedPrecondition("not available on this host: the VM guest is not prepared in " +
                                      opts_.guest_dir + ": run `" + vm::PrepareCommand(opts_.guest_dir) + "`");
  return Status::Ok();
}

Status MicrovmDriver::GuestSize(const v1::SandboxSpec& spec, uint64_t* memory, uint32_t* vcpus) const {
  const v1::Limits& lim = spec.limits();
  *memory = lim.memory_bytes() ? lim.memory_bytes() : opts_.default_memory;
  if (*memory > opts_.max_memory)
    return Status::InvalidArgument("limits.memory_bytes " + std::to_string(*memory) + " is above this node's VM maximum of " +
                                   std::to_string(opts_.max_memory) + " (--vm-max-memory)");
  *vcpus = lim.cpu_millis() ? (lim.cpu_millis() + 999) / 1000 : 1;
  if (*vcpus > opts_.max_vcpus)
    return Status::InvalidArgument("limits.cpu_millis " + std::to_string(lim.cpu_millis()) + " asks for " +
                                   std::to_string(*vcpus) + " vCPUs, above this node's VM maximum of " +
                                   std::to_string(opts_.max_vcpus) + " (--vm-max-vcpus)");
  return Status::Ok();
}

Status MicrovmDriver::CanHandle(const v1::SandboxSpec& spec) const {
  DSEC_RETURN_IF_ERROR(Available());
  uint64_t mem;
  uint32_t vcpus;
  DSEC_RETURN_IF_ERROR(GuestSize(spec, &mem, &vcpus));
  auto image = opts_.find_image(spec.image());
  if (!image.ok()) return image.status();
  return Status::Ok();
}

Result<vm::Guest> MicrovmDriver::EnsureGuest() {
  std::lock_guard<std::mutex> lk(guest_mu_);
  struct stat st;
  int64_t mtime = ::stat((opts_.guest_dir + "/base.cpio").c_str(), &st) == 0 ? st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec : 0;
  if (guest_ && mtime == guest_mtime_) return *guest_;
  auto g = vm::LoadGuest(opts_.guest_dir, SiblingExecutable("DSEC_GUEST_INIT", "dsec-guest-init"), opts_.agent_path,
                         opts_.data_dir + "/vms/initrd");
  if (!g.ok()) return g.status();
  guest_ = *g;
  guest_mtime_ = mtime;
  Log(1, "microvm: guest kernel " + g->kernel_version + " from " + opts_.guest_dir);
  return *g;
}

std::shared_ptr<MicrovmDriver::Box> MicrovmDriver::Find(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = boxes_.find(id);
  return it == boxes_.end() ? nullptr : it->second;
}

std::shared_ptr<AgentBox> MicrovmDriver::FindBox(const std::string& id) const { return Find(id); }

Result<std::shared_ptr<AgentBox>> MicrovmDriver::RunningBox(const std::string& id) const {
  auto box = Find(id);
  if (!box || !box->agent || !box->agent->connected())
    return Status::Unavailable("microvm " + id + " is not running on this node (its agent is not connected)");
  {
    std::lock_guard<std::mutex> lk(box->idle_mu);
    box->last_active_ms = NowMs();
  }
  return std::shared_ptr<AgentBox>(box);
}

std::string MicrovmDriver::ConsoleTail(const std::string& dir, size_t max_bytes) const {
  auto r = vm::QmpExecute(dir + "/q", "ringbuf-read", R"({"device":"con","size":65536,"format":"utf8"})", 2000);
  if (!r.ok()) return "";
  auto j = nlohmann::json::parse(*r, nullptr, false);
  if (!j.is_string()) return "";
  std::string s = j.get<std::string>();
  if (s.size() > max_bytes) s = s.substr(s.size() - max_bytes);
  return s;
}

void MicrovmDriver::WorkOn(const std::string& id, std::function<void()> job) {
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

void MicrovmDriver::Create(const v1::SandboxRecord& sb, CreateCallback done) {
  WorkOn(sb.id(), [this, sb, done = std::move(done)] { done(CreateNow(sb)); });
}

Result<std::string> MicrovmDriver::CreateNow(const v1::SandboxRecord& sb) {
  const std::string& id = sb.id();
  auto image = opts_.find_image(sb.spec().image());
  if (!image.ok()) return image.status();
  uint64_t memory;
  uint32_t vcpus;
  DSEC_RETURN_IF_ERROR(GuestSize(sb.spec(), &memory, &vcpus));
  auto guest = EnsureGuest();
  if (!guest.ok()) return guest.status();
  auto box = std::make_shared<Box>();
  box->id = id;
  box->dir = VmDir(id);
  box->cgroup_rel = CgroupRel(id);
  box->digest = image->digest();
  box->image_file = image->file();
  box->limits = sb.spec().limits();
  box->vcpus = vcpus;
  uint64_t guest_mem = (memory + kGuestHeadroom + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
  box->guest_memory = guest_mem;
  struct stat st;
  if (::lstat(box->dir.c_str(), &st) == 0) {
    // A creation of this id that a crash cut short (a session creates its
    // sandboxes under ids it chose first): removed before anew.
    Log(1, "microvm " + id + ": left over from a creation cut short by a restart; removed before creating it again");
    DSEC_RETURN_IF_ERROR(DestroyNow(id, 0));
  }
  auto undo = [&](const Status& why) -> Result<std::string> {
    Log(2, "microvm " + id + ": creation failed: " + why.message());
    (void)DestroyNow(id, box->pid);
    return why.Annotate("sandbox " + id);
  };
  if (::mkdir(box->dir.c_str(), 0700) < 0) return Status::FromErrno(errno, "mkdir " + box->dir);
  // QEMU's group: the guest's memory and QEMU's own, the vCPUs' CPU time.
  if (Status s = groups_->Make(box->cgroup_rel); !s.ok()) return undo(s);
  cgroup::GroupLimits have = cgroup::GroupLimits::Fresh(), want;
  want.memory = static_cast<int64_t>(guest_mem + kQemuOverhead);
  want.pids = -1;
  uint32_t millis = sb.spec().limits().cpu_millis() ? sb.spec().limits().cpu_millis() : vcpus * 1000;
  want.cpu_quota = static_cast<int64_t>(millis) * 100;
  if (Status s = groups_->ApplyLimits(box->cgroup_rel, want, &have); !s.ok()) return undo(s);

  const v1::Limits& lim = sb.spec().limits();
  std::string append = "console=ttyS0 quiet panic=-1 reboot=t";
  if (tsc_khz_) append += " tsc_early_khz=" + std::to_string(tsc_khz_) + " tsc=reliable";
  append += " dsec.root=/dev/vda dsec.host=" + id.substr(0, 63);
  append += " dsec.mem=" + std::to_string(memory);
  append += " dsec.pids=" + (lim.pids() ? std::to_string(lim.pids()) : std::string("max"));
  append += " dsec.rw=" + std::to_string(lim.disk_bytes() ? lim.disk_bytes() : memory);
  std::vector<std::string> args = {
      qemu_, "-name", "dsec-" + id,
      "-M", "microvm,acpi=on,rtc=on",
      "-accel", accel_ == "kvm" ? "kvm" : "tcg,tb-size=64",
      "-cpu", accel_ == "kvm" ? "host" : "max",
      "-m", std::to_string(guest_mem / kMiB), "-smp", std::to_string(vcpus),
      "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-no-shutdown",
      "-kernel", guest->kernel, "-initrd", guest->initrd, "-append", append,
      "-chardev", "ringbuf,id=con,size=65536", "-serial", "chardev:con",
      "-drive", "id=img,file=" + box->image_file + ",format=raw,if=none,readonly=on,cache=none,aio=threads",
      "-device", "virtio-blk-device,drive=img",
      "-device", "virtio-serial-device",
      "-chardev", "socket,id=agent,path=" + box->dir + "/a,server=on,wait=off",
      "-device", "virtserialport,chardev=agent,name=dsec.agent",
      "-qmp", "unix:" + box->dir + "/q,server=on,wait=off",
      "-qmp", "unix:" + box->dir + "/e,server=on,wait=off",  // the watcher's (events)
      "-pidfile", box->dir + "/pid", "-daemonize"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string log_path = box->dir + "/qemu.log";
  auto procs = groups_->ProcsPaths(box->cgroup_rel);
  auto t0 = std::chrono::steady_clock::now();
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!log) return undo(Status::FromErrno(errno, "open " + log_path));
  pid_t launcher = ::fork();
  if (launcher < 0) return undo(Status::FromErrno(errno, "fork for QEMU"));
  if (launcher == 0) {
    // Async-signal-safe from here: join the group, leave our session, exec.
    for (const auto& p : procs) {
      int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::write(fd, "0", 1) != 1) ::_exit(120);
      ::close(fd);
    }
    ::setsid();
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ::dup2(devnull, 0);
    ::dup2(log.get(), 1);
    ::dup2(log.get(), 2);
    ::syscall(SYS_close_range, 3u, ~0u, 0u);  // QEMU outlives us: nothing of dsecd's goes with it
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
    std::string why = WIFEXITED(wst) && WEXITSTATUS(wst) == 120 ? "could not join its cgroup"
                                                                 : "QEMU failed to start (exit status " + std::to_string(WIFEXITED(wst) ? WEXITSTATUS(wst) : -1) + ")";
    return undo(Status::Internal(why + (out.empty() ? "" : ": " + out)));
  }
  auto pid_text = ReadFileToString(box->dir + "/pid");
  box->pid = pid_text.ok() ? static_cast<pid_t>(std::atoi(pid_text->c_str())) : 0;
  if (box->pid <= 0) return undo(Status::Internal("QEMU started but wrote no pid file"));
  auto t_started = std::chrono::steady_clock::now();
  // Until the agent answers: a guest that stopped (its /init failed and
  // powered off, or its kernel panicked: -no-shutdown keeps QEMU and its
  // console for us to read) fails the creation at once, with its console.
  Status connected;
  auto boot_deadline = t_started + std::chrono::milliseconds(opts_.boot_timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(boot_deadline - std::chrono::steady_clock::now());
    int attempt = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 3000));
    connected = ConnectAgent(*box, box->dir + "/a", attempt,
                             [this, id](const std::string& t) { Log(2, "microvm " + id + ": " + t); },
                             /*vm_channel=*/true);
    if (connected.ok()) break;
    auto status = vm::QmpExecute(box->dir + "/q", "query-status", "", 2000);
    std::string run_state;
    if (status.ok()) {
      auto j = nlohmann::json::parse(*status, nullptr, false);
      if (j.is_object()) run_state = j.value("status", "");
    }
    // Gone, or a run state that is not running; a monitor that is slow to
    // answer (a loaded host) is waited for until the deadline.
    bool gone = !vm::ProcessHas(box->pid, box->dir + "/");
    bool stopped = gone || (status.ok() && run_state != "running" && run_state != "prelaunch");
    if (stopped || std::chrono::steady_clock::now() >= boot_deadline) {
      std::string console = ConsoleTail(box->dir);
      if (gone) connected = Status::Unavailable("its QEMU exited during boot");
      else if (stopped) connected = Status::Unavailable("the guest stopped during boot (" + run_state + ")");
      Status why = connected.Annotate("microvm boot (" + accel_ + ")");
      if (!console.empty()) why = Status(why.code(), why.message() + "; the guest's console ends: " + console);
      return undo(why);
    }
  }
  auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  auto t_done = std::chrono::steady_clock::now();
  Log(0, "microvm " + id + ": QEMU up in " + std::to_string(ms(t_started - t0)) + " ms, agent answered after " +
             std::to_string(ms(t_done - t_started)) + " ms (" + accel_ + ")");
  box->last_active_ms = NowMs();
  {
    std::lock_guard<std::mutex> lk(mu_);
    boxes_[id] = box;
  }
  Watch(*box);
  ++created_;
  dsec::vm::VmState state;
  state.set_digest(box->digest);
  state.set_image_file(box->image_file);
  state.set_cgroup(box->cgroup_rel);
  state.set_pid(box->pid);
  state.set_dir(box->dir);
  state.set_accelerator(accel_);
  state.set_guest_memory_bytes(guest_mem);
  state.set_vcpus(vcpus);
  return state.SerializeAsString();
}

Status MicrovmDriver::DestroyNow(const std::string& id, pid_t pid) {
  std::string dir = VmDir(id);
  std::string marker = dir + "/";
  // Its processes: what is in its group (QEMU joined it before it ran), and
  // its recorded QEMU if that pid still names the VM's dir. Never a process
  // found by its command line alone: anyone can name a path.
  std::vector<pid_t> pids = groups_->Exists(CgroupRel(id)) ? groups_->Pids(CgroupRel(id)) : std::vector<pid_t>{};
  if (pid > 0 && vm::ProcessHas(pid, marker) && std::find(pids.begin(), pids.end(), pid) == pids.end())
    pids.push_back(pid);
  for (pid_t p : pids) {
    if (!KillAndWait(p, 5000) && vm::ProcessHas(p, marker))
      return Status::Internal("microvm " + id + ": its QEMU (pid " + std::to_string(p) + ") did not exit after SIGKILL");
  }
  if (groups_->Exists(CgroupRel(id))) {
    groups_->KillAndRemove(CgroupRel(id));
    if (groups_->Exists(CgroupRel(id)))
      return Status::Internal("microvm " + id + ": its cgroup " + CgroupRel(id) + " could not be removed");
  }
  if (Status s = RemoveTree(dir); !s.ok()) return s.Annotate("microvm " + id);
  std::lock_guard<std::mutex> lk(mu_);
  boxes_.erase(id);
  return Status::Ok();
}

void MicrovmDriver::Destroy(const v1::SandboxRecord& sb, StatusCallback done) {
  auto box = Find(sb.id());
  pid_t pid = box ? box->pid : 0;
  if (!pid) {
    dsec::vm::VmState state;
    if (state.ParseFromString(sb.driver_state())) pid = state.pid();
  }
  {
    std::lock_guard<std::mutex> lk(watcher_mu_);
    if (watcher_) watcher_->Unwatch(sb.id());
  }
  Work([this, id = sb.id(), box, pid, done = std::move(done)] {
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
    Status s = DestroyNow(id, p);
    if (s.ok()) ++destroyed_;
    done(s);
  });
}

void MicrovmDriver::Pause(const v1::SandboxRecord& sb, bool paused, StatusCallback done) {
  auto box = Find(sb.id());
  if (!box) return done(Status::Unavailable("microvm " + sb.id() + " is not running on this node"));
  Work([box, paused, done = std::move(done)] {
    auto r = vm::QmpExecute(box->dir + "/q", paused ? "stop" : "cont", "", 5000);
    if (r.ok()) {
      std::lock_guard<std::mutex> lk(box->idle_mu);
      box->paused = paused;
    }
    done(r.ok() ? Status::Ok() : r.status().Annotate("microvm " + box->id + (paused ? ": pause" : ": resume")));
  });
}

void MicrovmDriver::Readopt(const v1::SandboxRecord& sb, StatusCallback done) {
  WorkOn(sb.id(), [this, sb, done = std::move(done)] {
    Status s = ReadoptNow(sb);
    if (s.ok()) ++readopted_;
    done(s);
  });
}

Status MicrovmDriver::ReadoptNow(const v1::SandboxRecord& sb) {
  dsec::vm::VmState state;
  if (!state.ParseFromString(sb.driver_state()) || state.dir().empty())
    return Status::FailedPrecondition("microvm " + sb.id() + ": its driver state is not a VmState");
  auto box = std::make_shared<Box>();
  box->id = sb.id();
  box->dir = state.dir();
  box->cgroup_rel = state.cgroup();
  box->digest = state.digest();
  box->image_file = state.image_file();
  box->pid = state.pid();
  box->guest_memory = state.guest_memory_bytes();
  box->vcpus = state.vcpus();
  box->limits = sb.spec().limits();
  auto fail = [&](const Status& why) {
    (void)DestroyNow(sb.id(), box->pid);
    return why;
  };
  if (box->dir != VmDir(sb.id())) return fail(Status::FailedPrecondition("microvm " + sb.id() + ": its dir moved"));
  auto in_group = groups_->Pids(box->cgroup_rel);
  if (!vm::ProcessHas(box->pid, box->dir + "/") ||
      std::find(in_group.begin(), in_group.end(), box->pid) == in_group.end())
    return fail(Status::Unavailable("microvm " + sb.id() + ": its QEMU (pid " + std::to_string(box->pid) + ") is gone"));
  // A paused guest cannot answer: resumed for the handshake, paused again.
  bool paused = sb.phase() == v1::SANDBOX_PHASE_PAUSED;
  (void)vm::QmpExecute(box->dir + "/q", "cont", "", 5000);
  Status connected = ConnectAgent(*box, box->dir + "/a", 30'000,
                                  [this, id = sb.id()](const std::string& t) { Log(2, "microvm " + id + ": " + t); },
                                  /*vm_channel=*/true);
  if (connected.ok() && paused) {
    Result<std::string> r = Status::Unavailable("not tried");
    for (int i = 0; i < 3 && !r.ok(); ++i) r = vm::QmpExecute(box->dir + "/q", "stop", "", 5000);
    if (!r.ok())  // the VM is fine, only not paused: kept for a destroy to remove
      return r.status().Annotate("microvm " + sb.id() + ": re-adopted but could not be paused again");
  }
  if (!connected.ok()) return fail(connected.Annotate("microvm " + sb.id() + ": re-adopt"));
  box->paused = paused;
  box->last_active_ms = NowMs();
  {
    std::lock_guard<std::mutex> lk(mu_);
    boxes_[sb.id()] = box;
  }
  Watch(*box);
  return Status::Ok();
}

void MicrovmDriver::Watch(const Box& box) {
  std::lock_guard<std::mutex> lk(watcher_mu_);
  if (!watcher_) return;
  if (Status s = watcher_->Watch(box.id, box.pid, box.dir + "/e"); !s.ok())
    Log(2, "microvm " + box.id + ": not watched (its end will be noticed at its next call): " + s.message());
}

void MicrovmDriver::OnEnded(const std::string& id, const std::string& what) {
  Work([this, id, what] {
    auto box = Find(id);
    if (!box) return;  // destroyed meanwhile
    std::string why;
    std::string console = what == "exited" ? "" : ConsoleTail(box->dir, 4000);
    size_t panic = console.find("Kernel panic");
    if (what == "exited") {
      why = "its QEMU (pid " + std::to_string(box->pid) + ") exited by itself (killed?)";
    } else if (what == "guest-panic" || panic != std::string::npos) {
      std::string line = panic == std::string::npos ? "" : console.substr(panic, console.find('\n', panic) - panic);
      why = "its guest kernel panicked" + (line.empty() ? "" : ": " + line);
    } else if (what == "guest-shutdown") {
      why = "its guest powered off";
    } else {
      why = "its guest stopped (" + what + ")";
    }
    Log(2, "microvm " + id + ": " + why);
    ++lost_;
    if (box->agent) box->agent->Close();
    if (opts_.lost) opts_.lost(id, "lost: " + why);
  });
}

void MicrovmDriver::Restored() {
  Work([this] { RestoredNow(); });
}

void MicrovmDriver::RestoredNow() {
  // Dirs no record claimed (a creation a crash cut short, a sandbox whose
  // record is gone): their QEMU is killed and they are removed. Only this
  // data dir's VMs are judged.
  for (const auto& name : ListSubdirs(opts_.data_dir + "/vms")) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (boxes_.count(name) || busy_.count(name)) continue;
    }
    Log(1, "microvm " + name + ": no record names it; stopping it and removing it");
    if (Status s = DestroyNow(name, 0); !s.ok()) Log(2, s.message());
    else ++swept_;
  }
}

std::string MicrovmDriver::StatsJson() const {
  size_t watched = 0;
  {
    std::lock_guard<std::mutex> lk(watcher_mu_);
    if (watcher_) watched = watcher_->size();
  }
  size_t n;
  {
    std::lock_guard<std::mutex> lk(mu_);
    n = boxes_.size();
  }
  nlohmann::json j = {{"vms", n},
                      {"created", created_.load()},
                      {"destroyed", destroyed_.load()},
                      {"readopted", readopted_.load()},
                      {"swept", swept_.load()},
                      {"lost", lost_.load()},
                      {"watched", watched},
                      {"accelerator", accel_},
                      {"accelerator_why", accel_why_},
                      {"qemu", qemu_},
                      {"guest_dir", opts_.guest_dir},
                      {"runs_in_flight", RunsInFlight()}};
  return j.dump();
}

}  // namespace dsec::drivers
