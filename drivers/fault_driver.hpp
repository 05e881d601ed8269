// FaultDriver: a Driver wrapper that fails or holds calls on command, for
// tests of everything built on drivers (what the actors do when a
// creation, exec, removal, pause, file call or re-adoption fails or takes
// long). The driver-side twin of state/fault_store.hpp. dsecd wraps every
// driver in one only with --test-hooks; the admin console's `fault`
// command (and dsecd --test-fault, for what happens at start) arms it.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "drivers/driver.hpp"

namespace dsec::drivers {

class FaultDriver final : public Driver {
 public:
  enum class Op { kCreate, kExec, kDestroy, kPause, kReadopt, kFiles, kCount };
  // "create", "exec", "destroy", "pause", "readopt", "files".
  static Result<Op> ParseOp(const std::string& name);
  static const char* OpName(Op op);
  // The console command's usage line.
  static const char* Usage();

  explicit FaultDriver(std::unique_ptr<Driver> base);

  // The next `n` calls of `op` fail with `error` and never reach the driver.
  void FailNext(Op op, int n, Status error = Status::Unavailable("injected driver fault (test hook)"));
  // Calls of `op` wait here, not yet handed to the driver, until Release.
  void Hold(Op op);
  // Hands the held calls of `op` to the driver, in order; later ones pass.
  void Release(Op op);
  // Calls of `op` held now, and every call of `op` seen so far.
  size_t held(Op op) const;
  uint64_t calls(Op op) const;
  // Back to passing every call through (held calls are released).
  void Clear();
  // Applies one console command: [op fail N] | [op hold] | [op release] |
  // [clear]. Says what it did, or InvalidArgument with the usage.
  Result<std::string> Command(const std::vector<std::string>& args);

  Driver* base() const { return base_.get(); }

  v1::Kind kind() const override { return base_->kind(); }
  const char* name() const override { return base_->name(); }
  const KindTraits& traits() const override { return base_->traits(); }
  Status Available() const override { return base_->Available(); }
  Status CanHandle(const v1::SandboxSpec& spec) const override { return base_->CanHandle(spec); }
  Status CheckExecLimits(const v1::SandboxRecord& sb, const v1::Limits& asked) const override {
    return base_->CheckExecLimits(sb, asked);
  }
  void Create(const v1::SandboxRecord& sb, CreateCallback done) override;
  void Exec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
            ExecCallback done) override;
  void ExecStreaming(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                     OutputCallback on_output, ExecCallback done) override;
  Status Kill(const std::string& run_id, const std::string& reason) override { return base_->Kill(run_id, reason); }
  void Destroy(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) override;
  void ReadFile(const v1::SandboxRecord& sb, const v1::ReadFileRequest& req, FileCallback done) override;
  void WriteFile(const v1::SandboxRecord& sb, const v1::WriteFileRequest& req, FileCallback done) override;
  void ListFiles(const v1::SandboxRecord& sb, const v1::ListFilesRequest& req, FileCallback done) override;
  void PathOp(const v1::SandboxRecord& sb, const v1::PathOpRequest& req, FileCallback done) override;
  void Process(const v1::SandboxRecord& sb, const v1::ProcessRequest& req, ProcessCallback done) override {
    base_->Process(sb, req, std::move(done));
  }
  std::function<void()> Watch(const v1::SandboxRecord& sb, const v1::WatchRequest& req, OutputCallback on_events,
                              StatusCallback done) override {
    return base_->Watch(sb, req, std::move(on_events), std::move(done));
  }
  void Pause(const v1::SandboxRecord& sb, bool paused, StatusCallback done) override;
  void PauseMemory(const v1::SandboxRecord& sb, StatusCallback done) override { base_->PauseMemory(sb, std::move(done)); }
  Result<uint64_t> DiskUsage(const v1::SandboxRecord& sb) const override { return base_->DiskUsage(sb); }
  void Usage(const v1::SandboxRecord& sb, UsageCallback done) override { base_->Usage(sb, std::move(done)); }
  void SetNetwork(const v1::SandboxRecord& sb, const v1::NetworkPolicy& next, StatusCallback done) override {
    base_->SetNetwork(sb, next, std::move(done));
  }
  Result<v1::NetworkReport> Network(const v1::SandboxRecord& sb) const override { return base_->Network(sb); }
  Result<guard::UpperDiff> Changes(const v1::SandboxRecord& sb) const override { return base_->Changes(sb); }
  void Snapshot(const v1::SandboxRecord& sb, const std::string& dest, uint64_t max_bytes, SnapshotCallback done) override {
    base_->Snapshot(sb, dest, max_bytes, std::move(done));
  }
  std::map<std::string, uint64_t> DeniedCalls(const v1::SandboxRecord& sb) const override {
    return base_->DeniedCalls(sb);
  }
  std::map<std::string, uint64_t> WatchedReads(const v1::SandboxRecord& sb) const override {
    return base_->WatchedReads(sb);
  }
  void SyncCounts(const v1::SandboxRecord& sb) const override { base_->SyncCounts(sb); }
  std::map<std::string, uint64_t> RefusedWrites(const v1::SandboxRecord& sb) const override {
    return base_->RefusedWrites(sb);
  }
  void Readopt(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) override;
  void Restored() override { base_->Restored(); }
  std::string StatsJson() const override { return base_->StatsJson(); }
  std::string DescribeState(const std::string& s) const override { return base_->DescribeState(s); }
  std::string accelerator() const override { return base_->accelerator(); }
  void Stop() override;

 private:
  // Runs `call` now, or later (held), or instead `fail` with the injected
  // error. Never under the lock.
  void Gate(Op op, std::function<void()> call, std::function<void(const Status&)> fail);

  std::unique_ptr<Driver> base_;
  mutable std::mutex mu_;
  struct PerOp {
    int fail_next = 0;
    Status error;
    bool hold = false;
    std::deque<std::function<void()>> held;
    uint64_t calls = 0;
  };
  PerOp ops_[static_cast<int>(Op::kCount)];
};

}  // namespace dsec::drivers
