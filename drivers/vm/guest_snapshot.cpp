// Snapshots of VM guests (DESIGN.md section 14): the kind saves the
// machine (memory and device state; microvm_memory.cpp), this file adds
// what any VM kind's snapshot needs around it: the refusals, meta.json
// (the guest's size, its image, what the saved state needs to load) and,
// for a guest made from a snapshot, a new identity: its hostname, machine-id,
// a reseeded RNG and the host's time, set by its agent before anyone else
// can run in it.
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>

#include "drivers/agent/agent_client.hpp"
#include "drivers/net/policy.hpp"
#include "drivers/vm/guest_driver.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

namespace {
constexpr int kMetaFormat = 1;

// The task guard a guest booted with (its kernel command line, in its
// memory): a guest made from a snapshot keeps its source's.
std::string TaskKey(const v1::SandboxSpec& spec) {
  return spec.has_task() ? std::to_string(std::hash<std::string>{}(spec.task().SerializeAsString())) : "";
}
}  // namespace

Status GuestDriver::SaveMachine(const Box&, const std::string&, uint64_t, bool, uint64_t*) {
  return Status::Unimplemented(std::string(kind_name()) + " sandboxes cannot be snapshotted yet (microvm ones can)");
}

pid_t GuestDriver::CurrentPid(const Box& box) const {
  auto p = ReadFileToString(box.dir + "/pid");  // QEMU's -pidfile
  return p.ok() ? static_cast<pid_t>(std::atoi(p->c_str())) : 0;
}

Status GuestDriver::IncomingMachine(const Box&, const std::string&) {
  return Status::Unimplemented(std::string(kind_name()) + " sandboxes cannot be made from a snapshot");
}

void GuestDriver::Snapshot(const v1::SandboxRecord& sb, const std::string& dest, uint64_t max_bytes,
                           SnapshotCallback done) {
  auto box = Find(sb.id());
  const std::string what = std::string(kind_name()) + " " + sb.id();
  if (!box || !box->agent) return done(Status::Unavailable(what + " is not running on this node"));
  if (box->saved)
    return done(Status::FailedPrecondition(what + " is paused with its memory on disk: resume it, then snapshot it"));
  if (box->networked)
    return done(Status::FailedPrecondition(
        what + " has a network link: a snapshot would give every guest made from it the same address; "
               "snapshot guests made with network policy none"));
  Work([this, box, dest, max_bytes, what, spec = sb.spec(), done = std::move(done)] {
    if (::mkdir(dest.c_str(), 0700) < 0) return done(Status::FromErrno(errno, "mkdir " + dest));
    uint64_t bytes = 0;
    Status s = SaveMachine(*box, dest, max_bytes, /*stay_stopped=*/false, &bytes);
    if (!s.ok()) return done(s.Annotate(what + ": snapshot"));
    if (Status m = WriteMeta(*box, dest, TaskKey(spec)); !m.ok()) return done(m);
    done(SnapshotStats{bytes, 0, box->digest});
  });
}

Status GuestDriver::WriteMeta(const Box& box, const std::string& dir, const std::string& task) const {
  // Written last: a dir with meta.json holds a whole saved guest.
  nlohmann::json meta = {{"format", kMetaFormat},        {"kind", kind_name()},
                         {"machine", MachineFingerprint()}, {"guest_memory", box.guest_memory},
                         {"vcpus", box.vcpus},            {"image_digest", box.digest}, {"task", task}};
  return WriteFileAtomic(dir + "/meta.json", meta.dump(1) + "\n", 0600);
}

Status GuestDriver::PrepareRestore(const v1::SandboxSpec& spec, Box* box, Launch* launch) const {
  const std::string& name = spec.snapshot();
  if (spec.layers().dirs().empty())
    return Status::FailedPrecondition("snapshot '" + name + "' was not resolved to its dir by the node");
  const std::string& dir = spec.layers().dirs(0);
  auto text = ReadFileToString(dir + "/meta.json");
  if (!text.ok()) return Status::FailedPrecondition("snapshot '" + name + "': " + text.status().message());
  auto meta = nlohmann::json::parse(*text, nullptr, false);
  if (!meta.is_object() || meta.value("format", 0) != kMetaFormat)
    return Status::FailedPrecondition("snapshot '" + name + "': " + dir + "/meta.json is not one this dsecd reads");
  if (meta.value("kind", "") != kind_name())
    return Status::FailedPrecondition("snapshot '" + name + "' is of a " + meta.value("kind", "?") + " guest, not " +
                                      kind_name());
  if (meta.value("machine", "") != MachineFingerprint())
    return Status::FailedPrecondition("snapshot '" + name + "' was taken under " + meta.value("machine", "?") +
                                      "; this node runs " + MachineFingerprint() +
                                      ": a guest's saved state loads only into the VMM that saved it");
  if (meta.value("image_digest", "") != box->digest || spec.layers().image_digest() != box->digest)
    return Status::FailedPrecondition("snapshot '" + name + "' stands on image " + spec.image() + " as it was (" +
                                      meta.value("image_digest", "") + "); that name now holds " + box->digest +
                                      ": a snapshot needs the image it was taken on");
  if (meta.value("task", "") != TaskKey(spec))
    return Status::FailedPrecondition("snapshot '" + name + "' is of a guest booted with another task guard (or " +
                                      "none): a VM guest's guard is set at its boot, so a guest made from it keeps " +
                                      "its source's; ask for the source's task, or boot a new guest");
  if (meta.value("guest_memory", uint64_t{0}) > opts_.max_memory || meta.value("vcpus", 1u) > opts_.max_vcpus)
    return Status::FailedPrecondition("snapshot '" + name + "' is of a guest larger than this node's VM maximum " +
                                      "(--vm-max-memory, --vm-max-vcpus)");
  auto policy = net::ParsePolicy(spec.network());
  if (!policy.ok()) return policy.status();
  if (NeedsLink(*policy))
    return Status::InvalidArgument("snapshot '" + name +
                                   "': a guest made from a snapshot has no network link (network policy none)");
  // Its size is the snapshot's: the memory is the source's.
  box->guest_memory = meta.value("guest_memory", uint64_t{0});
  box->vcpus = meta.value("vcpus", 1u);
  if (box->guest_memory == 0) return Status::FailedPrecondition("snapshot '" + name + "': no guest memory size");
  launch->restore = dir;
  launch->shared = true;
  return Status::Ok();
}

Status GuestDriver::Reidentify(const Box& box, bool fresh) {
  // The agent's own binary (as Reclaim): dsec-agent --identity reads its
  // lines from stdin (nothing of them in a process list).
  unsigned char seed[64];
  if (::getrandom(seed, sizeof seed, 0) != static_cast<ssize_t>(sizeof seed))
    return Status::FromErrno(errno, "getrandom");
  std::string seed_hex = HexOf(seed, sizeof seed);
  auto now = std::chrono::system_clock::now().time_since_epoch();
  agent::Exec req;
  req.add_argv("/run/dsec/agent");
  req.add_argv("--identity");
  req.add_env("PATH=/usr/bin:/bin");
  req.set_stdin((fresh ? box.id.substr(0, 63) + "\n" + RandomHex(32) : std::string("\n")) + "\n" + seed_hex + "\n" +
                std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()) + "\n");
  req.mutable_limits()->set_timeout_ms(20'000);
  req.set_privileged(true);  // a guarded guest's execs lose CAP_SYS_ADMIN and CAP_SYS_TIME
  auto r = box.agent->ExecSync(req, std::chrono::milliseconds(25'000));
  if (!r.ok()) return r.status().Annotate("give the restored guest its identity");
  if (!r->exited() || r->exit_code() != 0)
    return Status::Internal("the restored guest's agent could not take its identity: " + r->stderr());
  return Status::Ok();
}

void GuestDriver::Pause(const v1::SandboxRecord& sb, bool paused, StatusCallback done) {
  auto box = Find(sb.id());
  if (!box) return done(Status::Unavailable(std::string(kind_name()) + " " + sb.id() + " is not running on this node"));
  Work([this, box, spec = sb.spec(), paused, done = std::move(done)] {
    // A guest paused with memory resumes from its saved state.
    Status s = box->saved ? (paused ? Status::Ok() : ResumeSaved(*box, spec)) : PauseMachine(*box, paused);
    if (s.ok()) {
      std::lock_guard<std::mutex> lk(box->idle_mu);
      box->paused = paused;
    }
    done(s.ok() ? s : s.Annotate(std::string(kind_name()) + " " + box->id + (paused ? ": pause" : ": resume")));
  });
}


void GuestDriver::PauseMemory(const v1::SandboxRecord& sb, StatusCallback done) {
  auto box = Find(sb.id());
  const std::string what = std::string(kind_name()) + " " + sb.id();
  if (Status can = Require(*this, Capability::kPauseMemory); !can.ok()) return done(can);
  if (!box) return done(Status::Unavailable(what + " is not running on this node"));
  if (box->networked)
    return done(Status::FailedPrecondition(what + " has a network link: pause it without memory (its link would "
                                                  "have to be handed over; not yet)"));
  Work([this, box, what, done = std::move(done)] {
    if (box->saved) return done(Status::Ok());
    done(PauseMemoryNow(*box).Annotate(what + ": pause with memory"));
  });
}

// Its memory and devices into <dir>/saved (meta.json last), then its QEMU
// ends; the saved files leave the page cache, so what the guest held is
// the host's again.
Status GuestDriver::PauseMemoryNow(Box& box) {
  const std::string saved = box.dir + "/saved";
  (void)RemoveTree(saved);  // what a save cut short left
  if (::mkdir(saved.c_str(), 0700) < 0) return Status::FromErrno(errno, "mkdir " + saved);
  {
    std::lock_guard<std::mutex> lk(watcher_mu_);
    if (watcher_) watcher_->Unwatch(box.id);  // its QEMU's end is ours, not a loss (a save may end it)
  }
  uint64_t bytes = 0;
  Status s = SaveMachine(box, saved, 0, /*stay_stopped=*/true, &bytes);
  if (s.ok()) s = WriteMeta(box, saved, "");
  if (!s.ok()) {
    if (MachineStillThere(box).ok()) {
      (void)PauseMachine(box, box.paused);  // as it was
      (void)RemoveTree(saved);
      Watch(box);
    }
    return s;
  }
  if (box.agent)
    box.agent->Close("the sandbox was paused with memory: what it runs goes on after its resume (attach to an "
                     "exec's process by its pid)");
  if (Status stop = StopMachine(box.mid, box.pid); !stop.ok()) return stop;
  UniqueFd ram(::open((saved + "/ram").c_str(), O_RDONLY | O_CLOEXEC));
  if (ram) ::posix_fadvise(ram.get(), 0, 0, POSIX_FADV_DONTNEED);  // written and synced: clean pages, dropped
  std::lock_guard<std::mutex> lk(box.idle_mu);
  box.pid = 0;
  box.saved = true;
  box.paused = true;
  box.hold.reset();
  Log(0, std::string(kind_name()) + " " + box.id + ": paused with memory (" + std::to_string(bytes >> 20) +
             " MiB to disk); its QEMU ended");
  return Status::Ok();
}

Status GuestDriver::ResumeSaved(Box& box, const v1::SandboxSpec& spec) {
  const std::string saved = box.dir + "/saved";
  auto guest = EnsureGuest();
  if (!guest.ok()) return guest.status();
  // What a resume cut short left (a VMM still loading), first.
  DSEC_RETURN_IF_ERROR(StopMachine(box.mid, 0));
  Launch launch{&box, &*guest, "", &spec, "", "", saved, /*shared=*/false};
  Status s = LaunchMachine(launch);
  if (s.ok()) s = IncomingMachine(box, saved);
  if (s.ok())
    s = ConnectAgent(box, box.dir + "/a", 30'000,
                     [this, id = box.id](const std::string& t) { Log(2, std::string(kind_name()) + " " + id + ": " + t); },
                     /*vm_channel=*/true);
  if (s.ok()) s = Reidentify(box, /*fresh=*/false);
  if (!s.ok()) {
    // Its saved state stays, for a resume again (or a destroy).
    if (Status stop = StopMachine(box.mid, box.pid); !stop.ok()) Log(3, stop.message());
    box.pid = 0;
    return s.Annotate("resume from its saved memory");
  }
  Watch(box);
  (void)RemoveTree(saved);
  std::lock_guard<std::mutex> lk(box.idle_mu);
  box.saved = false;
  box.last_active_ms = SteadyClockMs();
  return Status::Ok();
}

Status GuestDriver::ReadoptSaved(const std::shared_ptr<Box>& box, const v1::SandboxRecord& sb) {
  // A resume starts a new QEMU.
  if (pid_t now = CurrentPid(*box); now > 0) box->pid = now;
  const std::string saved = box->dir + "/saved";
  struct stat st;
  bool whole = ::stat((saved + "/meta.json").c_str(), &st) == 0;
  // A VMM still loading the saved state (dsecd died during a resume) is
  // not the guest: it goes, and the saved state stays.
  bool there = MachineStillThere(*box).ok();
  if (whole && there && MachineState(*box) == RunState::kStarting) {
    DSEC_RETURN_IF_ERROR(StopMachine(box->mid, box->pid));
    there = false;
  }
  if (!whole || there) {
    // Nothing saved whole, or saved and its QEMU not yet ended: it runs as it is.
    if (::stat(saved.c_str(), &st) == 0) (void)RemoveTree(saved);
    return Status::NotFound("nothing saved");
  }
  box->saved = true;
  box->pid = 0;
  // Its record says it runs (dsecd died between the save and the record):
  // it runs again.
  if (sb.phase() != v1::SANDBOX_PHASE_PAUSED) {
    if (Status s = ResumeSaved(*box, sb.spec()); !s.ok())  // its state stays: a Resume tries again
      Log(2, std::string(kind_name()) + " " + box->id + ": saved, and not resumed at re-adoption: " + s.message() +
                 " (its record says running; calls fail until it is paused and resumed)");
  }
  box->paused = box->saved;
  box->last_active_ms = SteadyClockMs();
  PutBox(box);
  return Status::Ok();
}

}  // namespace dsec::drivers
