// The driver interface: one implementation per sandbox kind, chosen in one
// place (registry.hpp). Drivers know nothing of CAF; calls return at once and
// report through callbacks, which run on a driver thread, so a caller posts
// the result to its own actor instead of doing work there.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "drivers/guard/upper_diff.hpp"
#include "dsec/status.hpp"
#include "dsec/v1/service.pb.h"
#include "dsec/v1/types.pb.h"

namespace dsec::drivers {

using StatusCallback = std::function<void(const Status&)>;
using ExecCallback = std::function<void(Result<v1::ExecResult>)>;
// Create's result: the driver's own state, kept with the record in the
// store (store::v1::SandboxRow.driver_state) and handed back to Destroy and
// Readopt (what they need after a restart).
using CreateCallback = std::function<void(Result<std::string>)>;
// A piece of a streamed exec's output (stream_id left for the caller).
using OutputCallback = std::function<void(const v1::ExecOutput&)>;
// ReadFile: content; ListFiles: info and entries; WriteFile: nothing.
using FileCallback = std::function<void(Result<v1::FileReply>)>;
using ProcessCallback = std::function<void(Result<v1::ProcessReply>)>;
using UsageCallback = std::function<void(Result<v1::SandboxUsage>)>;
// What Snapshot wrote: bytes of file contents and entries.
struct SnapshotStats {
  uint64_t bytes = 0;
  uint64_t entries = 0;
  std::string image_digest;  // of the image it stands on
};
using SnapshotCallback = std::function<void(Result<SnapshotStats>)>;

// What a kind can do, which actors ask instead of naming kinds.
struct KindTraits {
  v1::Isolation isolation = v1::ISOLATION_PROCESS;  // what its sandboxes give
  bool host_image = false;   // runs on the host's own files only (image "" or "host")
  // Processes and files live between calls. Without: every exec is one
  // fresh run, one-shot runs (RunRequest) are for this kind, and an
  // idempotency key means nothing.
  bool stateful = false;
  bool files = false;        // ReadFile / WriteFile / ListFiles
  bool pause = false;        // Pause freezes its processes
  bool streaming = false;    // ExecStreaming delivers output while it runs
  bool readoptable = false;  // sandboxes outlive dsecd; Readopt reconnects them
  // Its sandboxes have a loopback of their own, up (services inside talk to
  // each other); without: only a loopback that is down. No route out either way.
  bool own_loopback = false;
  // Its sandboxes write to a disk of their own, bounded by disk_bytes: the
  // node's disk default applies to them, and their files are bounded by
  // that disk rather than by a file size limit (limits.hpp).
  bool own_disk = false;
  // A kind for tests (fake): never chosen for `auto`, not listed where it
  // was not started, and not a kind the security suites hold to isolation.
  bool test_only = false;
  // Optional capabilities of the calls to come (a kind without one answers
  // Unimplemented naming itself and the capability: Require below).
  bool snapshot = false;  // a named, read-only copy of a sandbox's state
  bool fork = false;      // new sandboxes in a running one's current state
  bool pause_memory = false;  // a pause that frees the sandbox's memory (PauseMemory)
  // Network policies beyond none (allow-lists, open), enforced by the kernel
  // on the host side of the sandbox's link (drivers/net/policy.hpp).
  bool network = false;
  // A task guard (spec.task): protected paths read-only, hidden ones gone,
  // and what a step changed of them flagged (drivers/guard).
  bool guard = false;
  // What it changed can be carried into a grade sandbox (Session.Grade).
  bool carry = false;
};

// What a call may need of a kind beyond the basics.
enum class Capability { kFiles, kPause, kPauseMemory, kStreaming, kSnapshot, kFork, kNetwork, kGuard };
// "files", "pause", "streaming", "snapshot", "fork", "network", "guard"
const char* CapabilityName(Capability c);
bool Has(const KindTraits& traits, Capability c);

class Driver {
 public:
  virtual ~Driver() = default;

  virtual v1::Kind kind() const = 0;
  // "fncall", "container", ...
  virtual const char* name() const = 0;
  virtual const KindTraits& traits() const = 0;

  // Ok when this host can run this kind now; otherwise FailedPrecondition
  // saying why (e.g. "not available on this host: cgroup v1 memory missing").
  virtual Status Available() const = 0;
  // Ok when this driver can run `spec` (image known, limits in range).
  virtual Status CanHandle(const v1::SandboxSpec& spec) const = 0;

  // Ok when an exec may ask for `asked` (the request's own limits, before
  // defaults) in this sandbox. Kinds whose memory, pids and CPU limits are
  // sandbox-wide refuse per-exec values that differ, instead of ignoring them.
  virtual Status CheckExecLimits(const v1::SandboxRecord& sandbox, const v1::Limits& asked) const;

  // Brings up the sandbox's resources. For stateless kinds (fncall) there is
  // nothing to create and this only validates.
  virtual void Create(const v1::SandboxRecord& sandbox, CreateCallback done) = 0;
  // Runs one command. `run_id` names the run for Kill. Limits in `req` are
  // final (see limits.hpp).
  virtual void Exec(const v1::SandboxRecord& sandbox, const std::string& run_id,
                    const v1::ExecRequest& req, ExecCallback done) = 0;
  // Exec with its output delivered through `on_output` while it runs; the
  // result then carries none. Kinds without traits().streaming are never
  // asked (the sandbox refuses a streamed exec); the default says so.
  virtual void ExecStreaming(const v1::SandboxRecord& sandbox, const std::string& run_id,
                             const v1::ExecRequest& req, OutputCallback on_output, ExecCallback done);
  // Stops a run in flight; its ExecCallback reports how it ended.
  virtual Status Kill(const std::string& run_id, const std::string& reason) = 0;
  // `driver_state`: what Create returned for it.
  virtual void Destroy(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) = 0;
  // Files of a sandbox with state. Paths were checked (CheckSandboxPath).
  // The defaults answer Unimplemented, naming the kind.
  virtual void ReadFile(const v1::SandboxRecord& sandbox, const v1::ReadFileRequest& req, FileCallback done);
  virtual void WriteFile(const v1::SandboxRecord& sandbox, const v1::WriteFileRequest& req, FileCallback done);
  virtual void ListFiles(const v1::SandboxRecord& sandbox, const v1::ListFilesRequest& req, FileCallback done);
  // Make a directory, move or remove a path (destination checked too).
  virtual void PathOp(const v1::SandboxRecord& sandbox, const v1::PathOpRequest& req, FileCallback done);
  // Its running execs by pid: listed, signalled, stdin written or closed.
  virtual void Process(const v1::SandboxRecord& sandbox, const v1::ProcessRequest& req, ProcessCallback done);
  // Watches a directory of the sandbox (WatchRequest): `on_events` gets
  // pieces (`watching` once it is in place, then `events`), `done` its end
  // (OK once stopped). Returns what stops it (callable any time, once or
  // more; nothing after `done`), or null when `done` was called at once.
  // The default: Unimplemented, naming the kind.
  virtual std::function<void()> Watch(const v1::SandboxRecord& sandbox, const v1::WatchRequest& req,
                                      OutputCallback on_events, StatusCallback done);
  // Freezes (paused) or thaws every process of the sandbox (traits().pause).
  virtual void Pause(const v1::SandboxRecord& sandbox, bool paused, StatusCallback done);
  // A pause that frees the sandbox's memory (traits().pause_memory): a VM's
  // memory and device state go to the node's disk and its VMM ends; a
  // container is frozen and its memory reclaimed. Resume is Pause(false).
  // Unimplemented elsewhere.
  virtual void PauseMemory(const v1::SandboxRecord& sandbox, StatusCallback done);
  // Writes the sandbox's state into `dest` (made here; it must not exist),
  // at most `max_bytes` of file contents (0: no bound), for new sandboxes
  // of the same kind to start from (traits().snapshot; Unimplemented
  // elsewhere). Containers: what it changed of its image and of the
  // snapshots under it (its overlay's upper dir), copied while it is
  // frozen; a sandbox made from a snapshot stacks spec.layers above its
  // image. On an error `dest` may be left half made (the caller removes it).
  virtual void Snapshot(const v1::SandboxRecord& sandbox, const std::string& dest, uint64_t max_bytes,
                        SnapshotCallback done);
  // Bytes the sandbox's files take on disk (cheap: kinds read a counter);
  // Unimplemented for kinds without a disk of their own.
  virtual Result<uint64_t> DiskUsage(const v1::SandboxRecord& sandbox) const {
    return Status::Unimplemented(std::string(name()) + " sandboxes have no disk of their own");
  }
  // What the sandbox uses now (UsageRequest): its CPU time and count,
  // memory used, cached and its total (at_ms, cpu_used_pct and the disk are
  // the caller's). Unimplemented for a kind that cannot tell.
  virtual void Usage(const v1::SandboxRecord& sandbox, UsageCallback done);

  // A new network policy (Admissible already) for a sandbox that has a
  // network link: one transaction. FailedPrecondition, saying why, for a
  // sandbox without one (made with mode none; a kind without networking).
  virtual void SetNetwork(const v1::SandboxRecord& sandbox, const v1::NetworkPolicy& next, StatusCallback done);
  // Its network as a read shows it (address, refusals); NotFound when it
  // has no link here.
  virtual Result<v1::NetworkReport> Network(const v1::SandboxRecord& sandbox) const;
  // What the sandbox changed of its image, read after a step (kinds with
  // the guard capability; Unimplemented elsewhere). Cheap: the changes only.
  virtual Result<guard::UpperDiff> Changes(const v1::SandboxRecord& sandbox) const;
  // The syscalls its seccomp filter denied and counted since this dsecd
  // started, by name (containers: NotifiedSyscalls; empty elsewhere).
  virtual std::map<std::string, uint64_t> DeniedCalls(const v1::SandboxRecord& sandbox) const { return {}; }
  // Waits (briefly) until what the sandbox's counters above saw before now
  // has reached them: a step's flags are read after it.
  virtual void SyncCounts(const v1::SandboxRecord& sandbox) const {}
  // Its reads of its image's watched files (ImageManifest.watched) since
  // this dsecd watched it, by path in the sandbox.
  virtual std::map<std::string, uint64_t> WatchedReads(const v1::SandboxRecord& sandbox) const { return {}; }
  // Its writes a read-only mount refused (a protected path's), by "<call>
  // <path>", since this dsecd started (containers; empty elsewhere).
  virtual std::map<std::string, uint64_t> RefusedWrites(const v1::SandboxRecord& sandbox) const { return {}; }

  // After a daemon restart: reconnect to a sandbox from its record (`done`
  // Ok), or say why it is gone. Returns at once, like every call here.
  virtual void Readopt(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) = 0;
  // After every Readopt has called back: what the driver still holds that
  // no record claims (a sandbox whose creation a crash cut short) is
  // removed. Returns at once (the driver sweeps on its own thread); called
  // once per start. Creations and removals of this run may be under way
  // meanwhile: only what the last run left may be taken for a leftover.
  virtual void Restored() {}

  // What runs its sandboxes' guests: "kvm" or "tcg" for the VM kinds, ""
  // for kinds on the host's kernel. Written in each new sandbox's record.
  virtual std::string accelerator() const { return ""; }

  // A sandbox's driver state (what Create returned) as a one-line JSON
  // object for the console's `inspect`; "" when the kind keeps none or it
  // does not parse.
  virtual std::string DescribeState(const std::string& driver_state) const { return ""; }

  // One-line JSON object of driver statistics for the admin console.
  virtual std::string StatsJson() const = 0;
  // dsecd is stopping: end what must not outlive it (runs in flight).
  virtual void Stop() {}
};

// For kinds whose memory, pids, CPU and disk limits hold for the whole
// sandbox (set at create): InvalidArgument naming the first limit an exec
// asks to change (a value that differs from the sandbox's).
Status CheckSandboxWideLimits(const char* kind, const v1::SandboxRecord& sandbox, const v1::Limits& asked);

// Ok when `driver`'s kind has `c`; else Unimplemented naming the kind and
// the capability ("sandbox kind 'fncall' cannot snapshot ...").
Status Require(const Driver& driver, Capability c);

// What a node checks of a spec before `driver` gets it: the spec's own
// bounds (CheckSpec, limits.hpp), its network policy (net::ParsePolicy) and
// that the kind can enforce it (Require kNetwork for allow and open), then
// the driver's own CanHandle. The first refusal, naming what is wrong.
struct LimitPolicy;
Status Admissible(const LimitPolicy& limits, const Driver& driver, const v1::SandboxSpec& spec);

// A path for the file calls: absolute, no "..", no NUL, at most 4096 bytes.
// InvalidArgument saying which rule it breaks.
Status CheckSandboxPath(const std::string& path);

}  // namespace dsec::drivers
