#include "drivers/fault_driver.hpp"

#include <cstdlib>

namespace dsec::drivers {

namespace {

constexpr const char* kOpNames[] = {"create", "exec", "destroy", "pause", "readopt", "files"};

constexpr const char* kUsage =
    "usage: fault KIND OP fail N | fault KIND OP hold | fault KIND OP release | fault KIND clear "
    "(OP: create, exec, destroy, pause, readopt, files)";

}  // namespace

Result<FaultDriver::Op> FaultDriver::ParseOp(const std::string& name) {
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i)
    if (name == kOpNames[i]) return static_cast<Op>(i);
  return Status::InvalidArgument("unknown driver call '" + name + "'; " + kUsage);
}

const char* FaultDriver::OpName(Op op) { return kOpNames[static_cast<int>(op)]; }

const char* FaultDriver::Usage() { return kUsage; }

FaultDriver::FaultDriver(std::unique_ptr<Driver> base) : base_(std::move(base)) {}

void FaultDriver::FailNext(Op op, int n, Status error) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& o = ops_[static_cast<int>(op)];
  o.fail_next = n;
  o.error = std::move(error);
}

void FaultDriver::Hold(Op op) {
  std::lock_guard<std::mutex> lk(mu_);
  ops_[static_cast<int>(op)].hold = true;
}

void FaultDriver::Release(Op op) {
  // One at a time, still holding: a call that comes meanwhile queues behind
  // the held ones instead of overtaking them. Holding ends once none is left.
  for (;;) {
    std::function<void()> call;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto& o = ops_[static_cast<int>(op)];
      if (o.held.empty()) {
        o.hold = false;
        return;
      }
      call = std::move(o.held.front());
      o.held.pop_front();
    }
    call();
  }
}

size_t FaultDriver::held(Op op) const {
  std::lock_guard<std::mutex> lk(mu_);
  return ops_[static_cast<int>(op)].held.size();
}

uint64_t FaultDriver::calls(Op op) const {
  std::lock_guard<std::mutex> lk(mu_);
  return ops_[static_cast<int>(op)].calls;
}

void FaultDriver::Clear() {
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i) {
    FailNext(static_cast<Op>(i), 0);
    Release(static_cast<Op>(i));
  }
}

Result<std::string> FaultDriver::Command(const std::vector<std::string>& args) {
  if (args.size() == 1 && args[0] == "clear") {
    Clear();
    return std::string(name()) + ": every call passes";
  }
  if (args.size() < 2) return Status::InvalidArgument(kUsage);
  auto op = ParseOp(args[0]);
  if (!op.ok()) return op.status();
  std::string what = std::string(name()) + " " + args[0];
  if (args[1] == "fail" && args.size() == 3) {
    char* end = nullptr;
    long n = std::strtol(args[2].c_str(), &end, 10);
    if (args[2].empty() || *end || n < 0 || n > 1000000) return Status::InvalidArgument("N must be 0-1000000; " + std::string(kUsage));
    FailNext(*op, static_cast<int>(n));
    return what + ": the next " + std::to_string(n) + " call(s) fail";
  }
  if (args[1] == "hold" && args.size() == 2) {
    Hold(*op);
    return what + ": calls are held until released";
  }
  if (args[1] == "release" && args.size() == 2) {
    size_t n = held(*op);
    Release(*op);
    return what + ": " + std::to_string(n) + " held call(s) released";
  }
  return Status::InvalidArgument(kUsage);
}

void FaultDriver::Gate(Op op, std::function<void()> call, std::function<void(const Status&)> fail) {
  Status error;
  bool failed = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& o = ops_[static_cast<int>(op)];
    ++o.calls;
    if (o.fail_next > 0) {
      --o.fail_next;
      failed = true;
      error = o.error;
    } else if (o.hold) {
      o.held.push_back(std::move(call));
      return;
    }
  }
  if (failed) fail(error);
  else call();
}

void FaultDriver::Create(const v1::SandboxRecord& sb, CreateCallback done) {
  Gate(Op::kCreate, [this, sb, done] { base_->Create(sb, done); }, [done](const Status& s) { done(s); });
}

void FaultDriver::Exec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                       ExecCallback done) {
  Gate(Op::kExec, [this, sb, run_id, req, done] { base_->Exec(sb, run_id, req, done); },
       [done](const Status& s) { done(s); });
}

void FaultDriver::ExecStreaming(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                                OutputCallback on_output, ExecCallback done) {
  Gate(Op::kExec, [this, sb, run_id, req, on_output, done] { base_->ExecStreaming(sb, run_id, req, on_output, done); },
       [done](const Status& s) { done(s); });
}

void FaultDriver::Destroy(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) {
  Gate(Op::kDestroy, [this, sb, driver_state, done] { base_->Destroy(sb, driver_state, done); }, done);
}

void FaultDriver::ReadFile(const v1::SandboxRecord& sb, const v1::ReadFileRequest& req, FileCallback done) {
  Gate(Op::kFiles, [this, sb, req, done] { base_->ReadFile(sb, req, done); }, [done](const Status& s) { done(s); });
}

void FaultDriver::WriteFile(const v1::SandboxRecord& sb, const v1::WriteFileRequest& req, FileCallback done) {
  Gate(Op::kFiles, [this, sb, req, done] { base_->WriteFile(sb, req, done); }, [done](const Status& s) { done(s); });
}

void FaultDriver::ListFiles(const v1::SandboxRecord& sb, const v1::ListFilesRequest& req, FileCallback done) {
  Gate(Op::kFiles, [this, sb, req, done] { base_->ListFiles(sb, req, done); }, [done](const Status& s) { done(s); });
}

void FaultDriver::PathOp(const v1::SandboxRecord& sb, const v1::PathOpRequest& req, FileCallback done) {
  Gate(Op::kFiles, [this, sb, req, done] { base_->PathOp(sb, req, done); }, [done](const Status& s) { done(s); });
}

void FaultDriver::Pause(const v1::SandboxRecord& sb, bool paused, StatusCallback done) {
  Gate(Op::kPause, [this, sb, paused, done] { base_->Pause(sb, paused, done); }, done);
}

void FaultDriver::Readopt(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) {
  Gate(Op::kReadopt, [this, sb, driver_state, done] { base_->Readopt(sb, driver_state, done); }, done);
}

void FaultDriver::Stop() {
  // Held calls reach the driver before it stops (their callers are owed an answer).
  Clear();
  base_->Stop();
}

}  // namespace dsec::drivers
