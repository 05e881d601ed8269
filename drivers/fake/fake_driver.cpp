#include "drivers/fake/fake_driver.hpp"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "drivers/fake/fake_shell.hpp"
#include "drivers/run_outcome.pb.h"
#include "drivers/verdict.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"

namespace dsec::drivers {

// The driver's threads: as many as calls in flight need (an exec holds one
// while it runs, and execs may wait on each other, so a fixed pool could
// deadlock), kept for reuse. Stop runs what is queued, then joins.
class FakePool {
 public:
  ~FakePool() { Stop(); }
  bool Post(std::function<void()> job) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return false;
    jobs_.push_back(std::move(job));
    if (idle_ < jobs_.size())
      threads_.emplace_back([this] { Loop(); });
    else
      cv_.notify_one();
    return true;
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (;;) {
      std::thread t;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (threads_.empty()) {
          stopped_ = true;  // a job posting from its own thread got in until now
          return;
        }
        t = std::move(threads_.back());
        threads_.pop_back();
      }
      t.join();
    }
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (!jobs_.empty()) {
        auto job = std::move(jobs_.front());
        jobs_.pop_front();
        lk.unlock();
        job();
        lk.lock();
        continue;
      }
      if (stopping_) return;
      ++idle_;
      cv_.wait(lk);
      --idle_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
  bool stopped_ = false;
};

namespace {

constexpr char kStatePrefix[] = "fake-box 1 ";
constexpr char kBoxSuffix[] = ".box";
constexpr uint64_t kDefaultReadMax = 64ull << 20;  // ReadFileRequest.max_bytes = 0

// errno to a Status code, as the agent's answers are mapped (agent_client.cpp).
Status::Code CodeFor(int err) {
  switch (err) {
    case ENOENT:
      return Status::Code::kNotFound;
    case EEXIST:
      return Status::Code::kAlreadyExists;
    case EINVAL:
      return Status::Code::kInvalidArgument;
    case EISDIR:
    case ENOTDIR:
    case ENOTEMPTY:
      return Status::Code::kFailedPrecondition;
    case EFBIG:
    case ENOSPC:
      return Status::Code::kResourceExhausted;
    default:
      return Status::Code::kInternal;
  }
}

const char* TypeName(const FakeNode& n) { return n.is_dir() ? "a directory" : "a character device"; }

v1::FileInfo Info(const std::string& name, const FakeNode& n) {
  v1::FileInfo f;
  f.set_name(name);
  f.set_mode(n.mode);
  f.set_size(n.is_reg() ? n.data.size() : n.is_dir() ? 4096 : 0);
  f.set_mtime_ms(n.mtime_ms);
  return f;
}

run::Outcome ToOutcome(FakeResult& r) {
  run::Outcome o;
  using E = FakeResult::Ending;
  switch (r.ending) {
    case E::kExited:
      o.set_exited(true);
      o.set_exit_code(r.exit_code);
      break;
    case E::kTimedOut:
      o.set_timed_out(true);
      break;
    case E::kOutputLimit:
      o.set_output_exceeded(true);
      break;
    case E::kMemoryLimit:
      o.set_oom_killed(true);
      break;
    case E::kKilled:
      o.set_killed(true);
      o.set_kill_reason(r.detail);
      break;
    case E::kPlatform:
      o.set_platform_error(r.detail);
      break;
    case E::kNotFound:
      o.set_exec_errno(ENOENT);
      break;
    case E::kNotExecutable:
      o.set_exec_errno(EACCES);
      break;
    case E::kBadCwd:
      o.set_user_error(r.detail);
      break;
  }
  o.set_signal(r.signal);
  o.set_stdout(std::move(r.out));
  o.set_stderr(std::move(r.err));
  o.set_stdout_truncated(r.out_truncated);
  o.set_stderr_truncated(r.err_truncated);
  o.set_cpu_us(r.cpu_us);
  o.set_wall_us(r.wall_us);
  o.set_peak_memory_bytes(r.peak_memory_bytes);
  return o;
}

// One line; bytes that are not UTF-8 (a command's argv may hold any) are
// replaced instead of throwing.
std::string Dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

bool ValidId(const std::string& id) {
  return !id.empty() && id[0] != '.' && id.find('/') == std::string::npos && id.size() <= 255;
}

}  // namespace

KindTraits FakeOptions::DefaultFakeTraits() {
  KindTraits t;
  t.isolation = v1::ISOLATION_PROCESS;
  t.host_image = true;
  t.stateful = true;
  t.files = true;
  t.pause = true;
  t.streaming = true;
  t.readoptable = true;
  t.own_loopback = false;
  t.test_only = true;
  return t;
}

std::string FakeDriver::StateFor(const std::string& id) { return kStatePrefix + id; }

std::string FakeDriver::BoxOfState(const std::string& state) {
  size_t n = sizeof kStatePrefix - 1;
  if (state.compare(0, n, kStatePrefix) != 0 || !ValidId(state.substr(n))) return "";
  return state.substr(n);
}

FakeDriver::FakeDriver(FakeOptions options)
    : opts_(std::move(options)),
      world_(opts_.world ? opts_.world : std::make_shared<FakeWorld>()),
      pool_(std::make_unique<FakePool>()) {
  if (!opts_.clock) opts_.clock = WallClockMs;
  // What the last run left: claimed by Readopt, the rest removed by Restored.
  for (const auto& id : world_->Ids()) leftovers_.insert(id);
  if (!opts_.state_dir.empty()) {
    std::string dir;
    for (size_t i = 0; i <= opts_.state_dir.size(); ++i) {
      if (i < opts_.state_dir.size() && opts_.state_dir[i] != '/') continue;
      dir = opts_.state_dir.substr(0, i);
      if (!dir.empty() && ::mkdir(dir.c_str(), 0700) < 0 && errno != EEXIST) {
        available_ = Status::FailedPrecondition("not available on this host: fake state dir " + opts_.state_dir +
                                                ": mkdir " + dir + ": " + std::strerror(errno));
        break;
      }
    }
    size_t suffix = sizeof kBoxSuffix - 1;
    for (const auto& name : ListEntries(opts_.state_dir))
      if (name.size() > suffix && name.compare(name.size() - suffix, suffix, kBoxSuffix) == 0)
        leftovers_.insert(name.substr(0, name.size() - suffix));
  }
  // The world may call while this driver stops: the guard says whether it still may.
  listener_ = world_->Listen([this, guard = guard_](const std::string& id, const std::string& why) {
    std::lock_guard<std::mutex> g(guard->mu);
    if (!guard->alive) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!owned_.count(id)) return;
    }
    Log(2, "fake " + id + " is gone: " + why);
    if (opts_.lost) (void)Post([this, id, why] { opts_.lost(id, why); });
  });
}

FakeDriver::~FakeDriver() { Stop(); }

bool FakeDriver::Post(std::function<void()> job) { return pool_->Post(std::move(job)); }

void FakeDriver::Log(int level, const std::string& text) const {
  if (opts_.log) opts_.log(level, text);
}

void FakeDriver::SyncOrLog(FakeBox& box) const {
  if (Status st = box.Sync(); !st.ok()) Log(3, "fake " + box.id() + ": its state is not saved: " + st.message());
}

std::string FakeDriver::StateFile(const std::string& id) const {
  return opts_.state_dir.empty() ? "" : opts_.state_dir + "/" + id + kBoxSuffix;
}

Result<std::shared_ptr<FakeBox>> FakeDriver::OwnBox(const std::string& id) const {
  std::shared_ptr<FakeBox> box;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (owned_.count(id)) box = world_->Find(id);
  }
  if (!box) return Status::Unavailable("fake " + id + " is not running on this node (not created or re-adopted here)");
  return box;
}

Status FakeDriver::CanHandle(const v1::SandboxSpec& spec) const {
  return available_;
}

Status FakeDriver::CheckExecLimits(const v1::SandboxRecord& sb, const v1::Limits& asked) const {
  if (!opts_.traits.stateful) return Status::Ok();  // each exec is a fresh box: its limits are its own
  return CheckSandboxWideLimits(name(), sb, asked);
}

void FakeDriver::Create(const v1::SandboxRecord& sb, CreateCallback done) {
  if (!Post([this, sb, done] { done(CreateNow(sb)); }))
    done(Status::Unavailable("fake: the driver is stopped (dsecd is shutting down)"));
}

Result<std::string> FakeDriver::CreateNow(const v1::SandboxRecord& sb) {
  const std::string& id = sb.id();
  if (!ValidId(id)) return Status::InvalidArgument("fake: sandbox id '" + id + "' cannot name a box");
  DSEC_RETURN_IF_ERROR(CanHandle(sb.spec()));
  std::lock_guard<std::mutex> lk(mu_);  // against Restored removing a leftover of this id meanwhile
  if (owned_.count(id) && world_->Find(id)) return Status::AlreadyExists("fake " + id + " exists already");
  // A leftover of the same id (a creation a crash cut short) is replaced.
  // It has no execs of ours (an exec needs a box we own), so waiting for
  // its runs under our lock cannot wait on us.
  if (auto old = world_->Take(id)) old->EndAll(FakeStop::kPlatform, "fake " + id + " was replaced", true);
  auto box = std::make_shared<FakeBox>(id, opts_.clock, StateFile(id));
  {
    auto blk = box->Lock();
    box->fs().set_capacity(sb.spec().limits().disk_bytes() ? sb.spec().limits().disk_bytes() : opts_.disk_bytes);
    if (!sb.spec().workdir().empty())
      (void)box->fs().Mkdir(FakeJoinPath("/", sb.spec().workdir()), 0755, true, box->now_ms());
    box->fs().Changed();  // written at least once: a state file names every box
  }
  if (Status st = box->Sync(); !st.ok()) return st.Annotate("fake " + id + ": create");
  world_->Put(box);
  owned_.insert(id);
  leftovers_.erase(id);
  ++created_;
  return StateFor(id);
}

void FakeDriver::Exec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                      ExecCallback done) {
  StartExec(sb, run_id, req, nullptr, std::move(done));
}

void FakeDriver::ExecStreaming(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                               OutputCallback on_output, ExecCallback done) {
  if (req.attach_pid()) {
    done(Status::Unimplemented("fake " + sb.id() + ": processes by pid (attach) are not modelled by the fake kind"));
    return;
  }
  if (!opts_.traits.streaming) {
    if (!Post([this, sb, run_id, req, on_output, done] { Driver::ExecStreaming(sb, run_id, req, on_output, done); }))
      Driver::ExecStreaming(sb, run_id, req, on_output, done);
    return;
  }
  StartExec(sb, run_id, req, std::move(on_output), std::move(done));
}

void FakeDriver::StartExec(const v1::SandboxRecord& sb, const std::string& run_id, const v1::ExecRequest& req,
                           OutputCallback on_output, ExecCallback done) {
  auto ctl = std::make_shared<FakeRunControl>();
  {
    // Registered before anything runs: a Kill right after this call finds it.
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) ctl->Stop(FakeStop::kPlatform, "dsecd is shutting down");
    runs_[run_id] = RunRef{sb.id(), ctl};
  }
  ++execs_;
  bool posted = Post([this, sb, run_id, req, on_output, done, ctl] {
    std::shared_ptr<FakeBox> entered;
    auto res = RunExec(sb, run_id, req, on_output, ctl, &entered);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (auto it = runs_.find(run_id); it != runs_.end() && it->second.ctl == ctl) runs_.erase(it);
    }
    done(std::move(res));
    // Left only once answered: a Destroy waiting for this run answers after it.
    if (entered) entered->Leave(ctl);
  });
  if (!posted) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      runs_.erase(run_id);
    }
    done(Status::Unavailable("fake: the driver is stopped (dsecd is shutting down)"));
  }
}

Result<v1::ExecResult> FakeDriver::RunExec(const v1::SandboxRecord& sb, const std::string& run_id,
                                           const v1::ExecRequest& req, const OutputCallback& on_output,
                                           const std::shared_ptr<FakeRunControl>& ctl,
                                           std::shared_ptr<FakeBox>* entered) {
  std::shared_ptr<FakeBox> box;
  if (opts_.traits.stateful) {
    auto own = OwnBox(sb.id());
    if (!own.ok()) return own.status();
    box = *own;
  } else {
    box = std::make_shared<FakeBox>(sb.id(), opts_.clock);  // every exec starts fresh
  }
  const v1::Limits& lim = req.limits();
  v1::Limits merged = lim;
  if (!merged.memory_bytes()) merged.set_memory_bytes(sb.spec().limits().memory_bytes());
  FakeExec e;
  e.argv.assign(req.argv().begin(), req.argv().end());
  e.env = {{"HOME", "/root"}, {"PATH", "/usr/bin:/bin"}};
  for (const auto& [k, v] : sb.spec().env()) e.env[k] = v;
  for (const auto& [k, v] : req.env()) e.env[k] = v;
  e.cwd = !req.cwd().empty() ? req.cwd() : !sb.spec().workdir().empty() ? sb.spec().workdir() : "/work";
  e.stdin_data = req.stdin();
  e.timeout_ms = lim.timeout_ms();
  e.memory_bytes = merged.memory_bytes();
  e.output_bytes = lim.output_bytes();
  e.file_size_bytes = lim.file_size_bytes();
  if (on_output)
    e.on_output = [on_output](bool is_err, const std::string& data) {
      v1::ExecOutput out;
      if (is_err)
        out.set_stderr(data);
      else
        out.set_stdout(data);
      on_output(out);
    };
  FakeResult r;
  std::string why;
  if (box->Enter(ctl, &why)) {
    *entered = box;
    r = RunFakeExec(*box, e, ctl);
    SyncOrLog(*box);
  } else {
    r.ending = FakeResult::Ending::kPlatform;
    r.detail = why;
  }
  auto res = ToExecResult(ToOutcome(r), merged, e.argv.empty() ? "" : e.argv[0]);
  res.set_run_id(run_id);
  return res;
}

Status FakeDriver::Kill(const std::string& run_id, const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return Status::NotFound("run " + run_id + " is not in flight");
  it->second.ctl->Stop(FakeStop::kKilled, reason.empty() ? "killed" : reason);
  return Status::Ok();
}

void FakeDriver::Destroy(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) {
  bool posted = Post([this, sb, driver_state, done] {
    std::string id = sb.id().empty() ? BoxOfState(driver_state) : sb.id();
    std::string why = "sandbox " + id + " was destroyed";
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [run, ref] : runs_)
        if (ref.sandbox == id) ref.ctl->Stop(FakeStop::kKilled, why);
    }
    if (auto box = world_->Take(id)) box->EndAll(FakeStop::kKilled, why, true);
    if (!opts_.state_dir.empty() && ::unlink(StateFile(id).c_str()) < 0 && errno != ENOENT)
      return done(Status::FromErrno(errno, "fake " + id + ": remove " + StateFile(id)));
    {
      std::lock_guard<std::mutex> lk(mu_);
      owned_.erase(id);
      leftovers_.erase(id);
    }
    ++destroyed_;
    done(Status::Ok());
  });
  if (!posted) done(Status::Unavailable("fake: the driver is stopped (dsecd is shutting down)"));
}

void FakeDriver::FileCall(const v1::SandboxRecord& sb, const std::string& path, FileCallback done,
                          std::function<Result<v1::FileReply>(FakeBox&, const std::string&)> body) {
  bool posted = Post([this, sb, path, done, body] {
    if (Status st = Require(*this, Capability::kFiles); !st.ok()) return done(st);
    if (Status st = CheckSandboxPath(path); !st.ok()) return done(st);
    auto box = OwnBox(sb.id());
    if (!box.ok()) return done(box.status());
    auto reply = body(**box, FakeJoinPath("/", path));
    SyncOrLog(**box);
    done(std::move(reply));
  });
  if (!posted) done(Status::Unavailable("fake: the driver is stopped (dsecd is shutting down)"));
}

namespace {

// "fake sb-1: read_file /work/x: No such file or directory", coded as the agent's answer would be.
Status FileError(const FakeBox& box, const char* op, const std::string& path, int err, const std::string& why) {
  return Status(CodeFor(err), "fake " + box.id() + ": " + op + " " + path + ": " + why);
}

}  // namespace

void FakeDriver::ReadFile(const v1::SandboxRecord& sb, const v1::ReadFileRequest& req, FileCallback done) {
  uint64_t max = req.max_bytes() ? req.max_bytes() : kDefaultReadMax;
  FileCall(sb, req.path(), std::move(done),
           [max, shown = req.path()](FakeBox& box, const std::string& path) -> Result<v1::FileReply> {
             auto lk = box.Lock();
             int err = 0;
             auto n = box.fs().Find(path, &err);
             if (!n) return FileError(box, "read_file", shown, err, std::strerror(err));
             if (!n->is_reg())
               return FileError(box, "read_file", shown, n->is_dir() ? EISDIR : EINVAL,
                                std::string("is ") + TypeName(*n) + ", not a regular file");
             if (n->data.size() > max)
               return FileError(box, "read_file", shown, EFBIG,
                                "the file is " + std::to_string(n->data.size()) + " bytes, above the limit of " +
                                    std::to_string(max));
             v1::FileReply reply;
             reply.set_content(n->data);
             return reply;
           });
}

void FakeDriver::WriteFile(const v1::SandboxRecord& sb, const v1::WriteFileRequest& req, FileCallback done) {
  FileCall(sb, req.path(), std::move(done), [req](FakeBox& box, const std::string& path) -> Result<v1::FileReply> {
    const std::string& shown = req.path();
    auto lk = box.Lock();
    auto& fs = box.fs();
    int64_t now = box.now_ms();
    if (req.make_parents()) {
      for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
        std::string dir = path.substr(0, slash);
        int e = fs.Mkdir(dir, 0755, false, now);
        if (e && e != EEXIST)
          return FileError(box, "write_file", shown, e, "create directory " + dir + ": " + std::strerror(e));
      }
    }
    uint32_t mode = req.mode() ? req.mode() & 07777 : 0644;
    int err = 0;
    auto n = fs.Find(path, &err);
    if (n && !n->is_reg())
      return FileError(box, "write_file", shown, n->is_dir() ? EISDIR : EINVAL,
                       std::string("is ") + TypeName(*n) + ", not a regular file");
    if (n) {
      // An existing file keeps its mode unless the request names one.
      if (req.mode()) n->mode = S_IFREG | mode;
      fs.Truncate(n, now);
    } else if (!(n = fs.OpenWrite(path, true, mode, now, &err))) {
      return FileError(box, "write_file", shown, err, std::strerror(err));
    }
    if (int e = fs.Append(n, req.content(), 0, now))
      return FileError(box, "write_file", shown, e, std::string("write: ") + std::strerror(e));
    return v1::FileReply();
  });
}

void FakeDriver::ListFiles(const v1::SandboxRecord& sb, const v1::ListFilesRequest& req, FileCallback done) {
  FileCall(sb, req.path(), std::move(done),
           [shown = req.path()](FakeBox& box, const std::string& path) -> Result<v1::FileReply> {
             auto lk = box.Lock();
             int err = 0;
             auto n = box.fs().Find(path, &err);
             if (!n) return FileError(box, "stat", shown, err, std::strerror(err));
             v1::FileReply reply;
             *reply.mutable_info() = Info(FakeBaseName(path), *n);
             if (n->is_dir())
               for (const auto& [name, child] : box.fs().List(path, &err)) *reply.add_entries() = Info(name, *child);
             return reply;
           });
}

void FakeDriver::Pause(const v1::SandboxRecord& sb, bool paused, StatusCallback done) {
  bool posted = Post([this, sb, paused, done] {
    if (!opts_.traits.pause) return Driver::Pause(sb, paused, done);
    auto box = OwnBox(sb.id());
    if (!box.ok()) return done(box.status());
    (*box)->SetPaused(paused);
    SyncOrLog(**box);
    done(Status::Ok());
  });
  if (!posted) done(Status::Unavailable("fake: the driver is stopped (dsecd is shutting down)"));
}

Result<uint64_t> FakeDriver::DiskUsage(const v1::SandboxRecord& sb) const {
  if (!opts_.traits.stateful) return Driver::DiskUsage(sb);
  auto box = OwnBox(sb.id());
  if (!box.ok()) return box.status();
  auto lk = (*box)->Lock();
  return (*box)->fs().bytes();
}

void FakeDriver::Readopt(const v1::SandboxRecord& sb, const std::string& driver_state, StatusCallback done) {
  if (!Post([this, sb, driver_state, done] { done(ReadoptNow(sb, driver_state)); }))
    done(Status::Unavailable("fake: the driver is stopped (dsecd is shutting down)"));
}

Status FakeDriver::ReadoptNow(const v1::SandboxRecord& sb, const std::string& driver_state) {
  const std::string& id = sb.id();
  if (BoxOfState(driver_state) != id)
    return Status::FailedPrecondition("fake " + id + ": its driver state '" + driver_state.substr(0, 64) +
                                      "' does not name its box");
  std::lock_guard<std::mutex> lk(mu_);  // against Restored removing it meanwhile
  auto box = world_->Find(id);
  std::string file = StateFile(id);
  if (!box && !file.empty() && ::access(file.c_str(), F_OK) == 0) {
    auto loaded = FakeBox::Load(id, file, opts_.clock);
    if (!loaded.ok()) return loaded.status();
    box = *loaded;
    world_->Put(box);
  }
  if (!box)
    return Status::FailedPrecondition("fake " + id + " is gone: no such box " +
                                      (file.empty() ? "in the driver's world" : "in " + opts_.state_dir) +
                                      " (destroyed, or removed as a leftover)");
  std::string why;
  if (box->vanished(&why)) return Status::FailedPrecondition("fake " + id + " is gone: " + why);
  {
    auto blk = box->Lock();
    box->fs().set_capacity(sb.spec().limits().disk_bytes() ? sb.spec().limits().disk_bytes() : opts_.disk_bytes);
  }
  // As a container: frozen again when its record says paused, thawed otherwise.
  box->SetPaused(sb.phase() == v1::SANDBOX_PHASE_PAUSED);
  SyncOrLog(*box);
  owned_.insert(id);
  leftovers_.erase(id);
  ++readopted_;
  return Status::Ok();
}

void FakeDriver::Restored() {
  (void)Post([this] {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& id : leftovers_) {
      if (owned_.count(id)) continue;
      if (auto box = world_->Take(id)) box->EndAll(FakeStop::kPlatform, "fake " + id + " was removed", true);
      if (!opts_.state_dir.empty() && ::unlink(StateFile(id).c_str()) < 0 && errno != ENOENT)
        Log(2, "fake " + id + ": remove " + StateFile(id) + ": " + std::strerror(errno));
      Log(1, "fake " + id + ": left over from before the restart with no record; removed");
    }
    leftovers_.clear();
  });
}

std::string FakeDriver::DescribeState(const std::string& driver_state) const {
  std::string id = BoxOfState(driver_state);
  if (id.empty()) return "";
  nlohmann::json j = {{"box", id}};
  auto box = world_->Find(id);
  if (!box) {
    j["exists"] = false;
    return Dump(j);
  }
  j["paused"] = box->paused();
  j["running"] = box->Running();
  {
    auto lk = box->Lock();
    j["files"] = box->fs().count();
    j["bytes"] = box->fs().bytes();
  }
  std::string why;
  if (box->vanished(&why)) j["gone"] = why;
  return Dump(j);
}

std::string FakeDriver::StatsJson() const {
  std::lock_guard<std::mutex> lk(mu_);
  return Dump(nlohmann::json{{"boxes", owned_.size()},
                             {"world_boxes", world_->Ids().size()},
                             {"runs", runs_.size()},
                             {"execs", execs_.load()},
                             {"created", created_.load()},
                             {"destroyed", destroyed_.load()},
                             {"readopted", readopted_.load()},
                             {"state_dir", opts_.state_dir}});
}

size_t FakeDriver::RunsInFlight() const {
  std::lock_guard<std::mutex> lk(mu_);
  return runs_.size();
}

void FakeDriver::Stop() {
  std::vector<std::shared_ptr<FakeBox>> boxes;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    for (auto& [id, ref] : runs_) ref.ctl->Stop(FakeStop::kPlatform, "dsecd is shutting down");
    for (const auto& id : owned_)
      if (auto box = world_->Find(id)) boxes.push_back(box);
  }
  {
    std::lock_guard<std::mutex> g(guard_->mu);
    guard_->alive = false;
  }
  world_->Unlisten(listener_);
  // Their background jobs end with this dsecd; their files stay.
  for (auto& box : boxes) box->EndAll(FakeStop::kPlatform, "dsecd is shutting down", false);
  pool_->Stop();
}

}  // namespace dsec::drivers
