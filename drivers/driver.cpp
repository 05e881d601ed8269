#include "drivers/driver.hpp"

#include "drivers/guard/task_guard.hpp"
#include "drivers/limits.hpp"
#include "drivers/net/policy.hpp"

namespace dsec::drivers {

namespace {

Status NoState(const Driver& d, const char* what) {
  return Status::Unimplemented(std::string(d.name()) + " sandboxes have no " + what +
                               ": each run starts fresh (use a container sandbox)");
}

}  // namespace

const char* CapabilityName(Capability c) {
  switch (c) {
    case Capability::kFiles: return "files";
    case Capability::kPause: return "pause";
    case Capability::kPauseMemory: return "pause_memory";
    case Capability::kStreaming: return "streaming";
    case Capability::kSnapshot: return "snapshot";
    case Capability::kFork: return "fork";
    case Capability::kNetwork: return "network";
    case Capability::kGuard: return "guard";
  }
  return "?";
}

bool Has(const KindTraits& t, Capability c) {
  switch (c) {
    case Capability::kFiles: return t.files;
    case Capability::kPause: return t.pause;
    case Capability::kPauseMemory: return t.pause_memory;
    case Capability::kStreaming: return t.streaming;
    case Capability::kSnapshot: return t.snapshot;
    case Capability::kFork: return t.fork;
    case Capability::kNetwork: return t.network;
    case Capability::kGuard: return t.guard;
  }
  return false;
}

Status CheckSandboxWideLimits(const char* kind, const v1::SandboxRecord& sb, const v1::Limits& asked) {
  const v1::Limits& box = sb.spec().limits();
  auto differs = [](uint64_t want, uint64_t have) { return want != 0 && want != have; };
  const char* what = differs(asked.memory_bytes(), box.memory_bytes()) ? "memory"
                     : differs(asked.pids(), box.pids())                 ? "pids"
                     : differs(asked.cpu_millis(), box.cpu_millis())     ? "cpu"
                     : differs(asked.disk_bytes(), box.disk_bytes())     ? "disk"
                                                                         : nullptr;
  if (!what) return Status::Ok();
  return Status::InvalidArgument(std::string("the ") + what + " limit of " + kind + " " + sb.id() +
                                 " is set for the whole " + kind + " when it is created (dsecctl create --" +
                                 (std::string(what) == "cpu" ? "cpus" : what) + "); an exec cannot change it");
}

Status Require(const Driver& driver, Capability c) {
  if (Has(driver.traits(), c)) return Status::Ok();
  static const char* const kWhat[] = {"read or write files", "pause", "pause with its memory freed", "stream output",
                                      "snapshot", "fork",
                                      "enforce a network policy other than none", "guard a task's paths"};
  return Status::Unimplemented(std::string("sandbox kind '") + driver.name() + "' cannot " +
                               kWhat[static_cast<int>(c)] + " (it has no '" + CapabilityName(c) +
                               "' capability; `dsecctl status` lists each kind's)");
}

Status Admissible(const LimitPolicy& limits, const Driver& driver, const v1::SandboxSpec& spec) {
  DSEC_RETURN_IF_ERROR(CheckSpec(limits, spec));
  auto net = net::ParsePolicy(spec.network());
  if (!net.ok()) return net.status();
  if (net->mode != v1::NETWORK_MODE_NONE || !net->expose.empty()) DSEC_RETURN_IF_ERROR(Require(driver, Capability::kNetwork));
  auto guard = guard::ParseGuard(spec.task());
  if (!guard.ok()) return guard.status();
  if (guard->active() || !spec.carry().sandbox_id().empty()) DSEC_RETURN_IF_ERROR(Require(driver, Capability::kGuard));
  if (!spec.snapshot().empty()) DSEC_RETURN_IF_ERROR(Require(driver, Capability::kSnapshot));
  return driver.CanHandle(spec);
}

void Driver::ExecStreaming(const v1::SandboxRecord&, const std::string&, const v1::ExecRequest&, OutputCallback,
                           ExecCallback done) {
  done(Status::Unimplemented(std::string(name()) + " sandboxes cannot stream output"));
}

Status Driver::CheckExecLimits(const v1::SandboxRecord&, const v1::Limits&) const { return Status::Ok(); }

void Driver::ReadFile(const v1::SandboxRecord&, const v1::ReadFileRequest&, FileCallback done) {
  done(NoState(*this, "files"));
}
void Driver::WriteFile(const v1::SandboxRecord&, const v1::WriteFileRequest&, FileCallback done) {
  done(NoState(*this, "files"));
}
void Driver::ListFiles(const v1::SandboxRecord&, const v1::ListFilesRequest&, FileCallback done) {
  done(NoState(*this, "files"));
}
void Driver::PathOp(const v1::SandboxRecord&, const v1::PathOpRequest&, FileCallback done) {
  done(NoState(*this, "files"));
}
void Driver::Process(const v1::SandboxRecord&, const v1::ProcessRequest&, ProcessCallback done) {
  done(NoState(*this, "processes that outlive a call"));
}
void Driver::Usage(const v1::SandboxRecord&, UsageCallback done) {
  done(Status::Unimplemented(std::string(name()) + " sandboxes do not say what they use: each run is measured in its "
                             "own result (ExecResult.cpu_us, peak_memory_bytes)"));
}
std::function<void()> Driver::Watch(const v1::SandboxRecord&, const v1::WatchRequest&, OutputCallback,
                                    StatusCallback done) {
  done(NoState(*this, "directories to watch"));
  return nullptr;
}
void Driver::Pause(const v1::SandboxRecord&, bool, StatusCallback done) {
  done(NoState(*this, "processes to pause"));
}

void Driver::PauseMemory(const v1::SandboxRecord&, StatusCallback done) {
  Status s = Require(*this, Capability::kPauseMemory);
  done(s.ok() ? Status::Unimplemented(std::string(name()) + " sandboxes cannot pause with memory yet") : s);
}

void Driver::Snapshot(const v1::SandboxRecord&, const std::string&, uint64_t, SnapshotCallback done) {
  Status s = Require(*this, Capability::kSnapshot);
  done(s.ok() ? Status::Unimplemented(std::string(name()) + " sandboxes cannot snapshot yet") : s);
}

void Driver::SetNetwork(const v1::SandboxRecord& sb, const v1::NetworkPolicy&, StatusCallback done) {
  done(Status::FailedPrecondition("sandbox " + sb.id() + ": " + name() + " sandboxes have no network link to change"));
}
Result<v1::NetworkReport> Driver::Network(const v1::SandboxRecord& sb) const {
  return Status::NotFound("sandbox " + sb.id() + " has no network link");
}

Result<guard::UpperDiff> Driver::Changes(const v1::SandboxRecord& sb) const {
  return Status::Unimplemented("sandbox " + sb.id() + ": " + name() + " sandboxes cannot say what they changed");
}

Status CheckSandboxPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return Status::InvalidArgument("path '" + path + "' is not absolute");
  if (path.size() > 4096) return Status::InvalidArgument("path is longer than 4096 bytes");
  if (path.find('\0') != std::string::npos) return Status::InvalidArgument("path has a NUL byte");
  // ".." as a whole component, anywhere.
  for (size_t i = 0; i < path.size();) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (path.compare(i, j - i, "..") == 0)
      return Status::InvalidArgument("path '" + path + "' has a '..' component; name the file by its own path");
    i = j + 1;
  }
  return Status::Ok();
}

}  // namespace dsec::drivers
