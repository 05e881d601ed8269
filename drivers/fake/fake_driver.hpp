// FakeDriver: the fake sandbox kind, for tests. Its sandboxes are FakeBoxes
// in memory (optionally mirrored to a state directory) and its programs run
// in the fake shell (fake_shell.hpp): no processes, no root, no namespaces,
// deterministic, and a run takes microseconds. It behaves as the real
// stateful kinds do where the actors can tell: every call returns at once
// and answers on a thread of the driver's own; verdicts come from
// ToExecResult; kills, limits, pause, files, destroy and re-adoption after
// a restart follow the container kind, in its words.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "drivers/driver.hpp"
#include "drivers/fake/fake_box.hpp"

namespace dsec::drivers {

class FakePool;

struct FakeOptions {
  // What the kind offers; a test takes away what it wants refused (a fake
  // without pause or files). Default: FakeDriver::DefaultTraits(). Without
  // `stateful` every exec runs in a fresh box (as fncall runs).
  KindTraits traits = DefaultFakeTraits();
  // Where boxes live. Share one between two drivers to "restart dsecd" in
  // a test: the second re-adopts the first's boxes. Default (null): a
  // world of the driver's own.
  std::shared_ptr<FakeWorld> world;
  // Default "": boxes live only in `world`. Set: each box's files and
  // metadata are written to <state_dir>/<id>.box on every change a crash
  // must not lose, so a dsecd killed with -9 and started again on the same
  // directory re-adopts its fake sandboxes, files and all (their running
  // commands and jobs do not survive: they were threads of the dead dsecd).
  std::string state_dir;
  // A box vanished (FakeWorld::Vanish), as DriverEnv::lost: called on a
  // driver thread with the sandbox id and why. May be empty.
  std::function<void(const std::string& id, const std::string& why)> lost;
  // Log lines (level 0 debug .. 3 error), as DriverEnv::log gives. May be empty.
  std::function<void(int level, const std::string& text)> log;
  // File times. Default (empty): the wall clock; a test may fix it.
  FakeClock clock;
  // What one box's files may hold (writes past it fail with ENOSPC) when
  // its spec sets no disk_bytes. Default 256 MiB: the files are in memory.
  uint64_t disk_bytes = 256ull << 20;

  static KindTraits DefaultFakeTraits();
};

class FakeDriver final : public Driver {
 public:
  explicit FakeDriver(FakeOptions options = {});
  // Stop(): ends what runs, joins the threads.
  ~FakeDriver() override;
  FakeDriver(const FakeDriver&) = delete;
  FakeDriver& operator=(const FakeDriver&) = delete;

  // Process isolation, any image (there is none to check), state, files,
  // pause, streaming, re-adoption; no loopback of its own.
  static KindTraits DefaultTraits() { return FakeOptions::DefaultFakeTraits(); }
  // The driver state Create returns for box `id`; "" when `state` is none.
  static std::string StateFor(const std::string& id);
  static std::string BoxOfState(const std::string& state);

  v1::Kind kind() const override { return v1::KIND_FAKE; }
  const char* name() const override { return "fake"; }
  const KindTraits& traits() const override { return opts_.traits; }
  Status Available() const override { return available_; }
  Status CanHandle(const v1::SandboxSpec& spec) const override;
  Status CheckExecLimits(const v1::SandboxRecord& sandbox, const v1::Limits& asked) const override;
  void Create(const v1::SandboxRecord& sandbox, CreateCallback done) override;
  void Exec(const v1::SandboxRecord& sandbox, const std::string& run_id, const v1::ExecRequest& req,
            ExecCallback done) override;
  void ExecStreaming(const v1::SandboxRecord& sandbox, const std::string& run_id, const v1::ExecRequest& req,
                     OutputCallback on_output, ExecCallback done) override;
  Status Kill(const std::string& run_id, const std::string& reason) override;
  void Destroy(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) override;
  void ReadFile(const v1::SandboxRecord& sandbox, const v1::ReadFileRequest& req, FileCallback done) override;
  void WriteFile(const v1::SandboxRecord& sandbox, const v1::WriteFileRequest& req, FileCallback done) override;
  void ListFiles(const v1::SandboxRecord& sandbox, const v1::ListFilesRequest& req, FileCallback done) override;
  // Not modelled: Unimplemented, saying so.
  void Process(const v1::SandboxRecord& sandbox, const v1::ProcessRequest&, ProcessCallback done) override {
    done(Status::Unimplemented("fake " + sandbox.id() + ": processes by pid are not modelled by the fake kind"));
  }
  void PathOp(const v1::SandboxRecord& sandbox, const v1::PathOpRequest& req, FileCallback done) override {
    done(Status::Unimplemented("fake " + sandbox.id() + ": make_dir, move and remove are not modelled by the fake "
                               "kind (a container does them)"));
  }
  void Pause(const v1::SandboxRecord& sandbox, bool paused, StatusCallback done) override;
  Result<uint64_t> DiskUsage(const v1::SandboxRecord& sandbox) const override;
  void Readopt(const v1::SandboxRecord& sandbox, const std::string& driver_state, StatusCallback done) override;
  void Restored() override;
  std::string DescribeState(const std::string& driver_state) const override;
  std::string StatsJson() const override;
  // Ends every run in flight (a platform error: dsecd is shutting down)
  // and the boxes' background jobs, answers what is queued, joins the
  // threads. The boxes stay (in the world, in the state dir) for the next
  // driver to re-adopt. Idempotent.
  void Stop() override;

  const std::shared_ptr<FakeWorld>& world() const { return world_; }
  size_t RunsInFlight() const;

 private:
  struct RunRef {
    std::string sandbox;
    std::shared_ptr<FakeRunControl> ctl;
  };

  Result<std::string> CreateNow(const v1::SandboxRecord& sb);
  Status ReadoptNow(const v1::SandboxRecord& sb, const std::string& driver_state);
  // Runs `job` on a driver thread; false (nothing run) once stopped.
  bool Post(std::function<void()> job);
  void StartExec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                 OutputCallback on_output, ExecCallback done);
  Result<v1::ExecResult> RunExec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                                 const OutputCallback& on_output, const std::shared_ptr<FakeRunControl>& ctl,
                                 std::shared_ptr<FakeBox>* entered);
  // A file call: checks, its box, `body` under the calls' common frame.
  void FileCall(const v1::SandboxRecord& sb, const std::string& path, FileCallback done,
                std::function<Result<v1::FileReply>(FakeBox& box, const std::string& path)> body);
  // The box of a sandbox this driver created or re-adopted; Unavailable
  // naming it otherwise.
  Result<std::shared_ptr<FakeBox>> OwnBox(const std::string& id) const;
  std::string StateFile(const std::string& id) const;
  void Log(int level, const std::string& text) const;
  void SyncOrLog(FakeBox& box) const;

  FakeOptions opts_;
  std::shared_ptr<FakeWorld> world_;
  Status available_;
  std::unique_ptr<FakePool> pool_;
  struct ListenerGuard {
    std::mutex mu;
    bool alive = true;
  };
  std::shared_ptr<ListenerGuard> guard_ = std::make_shared<ListenerGuard>();
  uint64_t listener_ = 0;
  mutable std::mutex mu_;
  std::map<std::string, RunRef> runs_;  // run id -> its control
  std::set<std::string> owned_;         // created or re-adopted here
  std::set<std::string> leftovers_;     // of the last run, until Readopt claims or Restored removes them
  bool stopping_ = false;
  std::atomic<uint64_t> execs_{0}, created_{0}, destroyed_{0}, readopted_{0};
};

}  // namespace dsec::drivers
