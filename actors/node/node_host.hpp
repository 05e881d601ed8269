// One host's side of the node: its drivers (which kind takes a spec), its
// one-shot runs and their capacity, the restore of its sandboxes and
// sessions at start, and its record (id, boot, uptime, counters). The
// router talks to it only through this interface, on the router's thread;
// a controller would talk to many hosts through the same one.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/node/context.hpp"
#include "dsec/store/v1/records.pb.h"
#include "wire/wire.hpp"

namespace dsec {

struct RunInfo {
  std::string argv0;
  int64_t started_ms = 0;
  drivers::Driver* driver = nullptr;  // that runs it
};

struct HostCounters {
  uint64_t runs = 0;  // one-shot runs finished
  uint64_t runs_ok = 0;
  uint64_t runs_platform_error = 0;
  uint64_t rejected = 0;  // requests refused before running (bad input, limits)
};

// This node in the `nodes` table: what it is, where, and what it can run
// (written once dsecd's ports are open).
Status WriteNodeRecord(const NodeContext& ctx);

class NodeHost {
 public:
  // Runs a function on the owner's thread (drivers call back on theirs).
  using PostFn = std::function<void(std::function<void()>)>;
  NodeHost(std::shared_ptr<NodeContext> ctx, PostFn post);

  // The driver that takes a new sandbox with `spec`, or why none does.
  Result<drivers::Driver*> Admit(const v1::SandboxSpec& spec);
  // A request the router refused itself (counted with the host's).
  void Rejected() { ++counters_.rejected; }

  // A one-shot run (kinds without state): refused at once (the reply's
  // status; nothing started), or started and answered through `done` on
  // the owner's thread. `done` is called exactly once either way.
  void Run(v1::RunRequest& req, std::function<void(v1::RunReply)> done);
  const std::unordered_map<std::string, RunInfo>& runs() const { return runs_; }
  Status KillRun(const std::string& id, const std::string& why);

  // At start: the records to bring back (stopped sandboxes' rows are
  // removed, corrupt rows skipped and logged). The router spawns their
  // actors; each sandbox's driver re-adopts it and then the router calls
  // Readopted. Once all have, drivers drop what no record claims.
  struct Restored {
    std::vector<store::v1::SandboxRow> sandboxes;
    std::vector<v1::SessionRecord> sessions;
  };
  Restored Restore();
  void Readopted();
  size_t readopting() const { return restore_.readopting; }

  const NodeOptions& options() const { return ctx_->options; }
  int64_t started_ms() const { return started_ms_; }
  const HostCounters& counters() const { return counters_; }

 private:
  void MaybeRestoreDone();

  std::shared_ptr<NodeContext> ctx_;
  PostFn post_;
  int64_t started_ms_;
  HostCounters counters_;
  std::unordered_map<std::string, RunInfo> runs_;  // one-shot runs in flight
  uint64_t next_run_ = 0;
  // The restore at start: sandboxes whose driver has not yet answered
  // Readopt, and those that have; done once the scan is too.
  struct {
    size_t readopting = 0;
    size_t readopted = 0;
    bool scanned = false;  // every record seen (the scan did not fail)
    bool done = false;
    std::chrono::steady_clock::time_point started;
  } restore_;
};

}  // namespace dsec
