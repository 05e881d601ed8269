// What a fake sandbox is made of, in memory: its filesystem (FakeFs), the
// box holding it with its runs, background jobs and pause state (FakeBox),
// the control of one run (FakeRunControl), and the world the boxes live in
// (FakeWorld). The world is shared, so it outlives a FakeDriver: a test
// "restarts dsecd" by making a second driver on the same world. No
// processes, no root, nothing on the host unless a state file is asked for.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dsec/status.hpp"

namespace dsec::drivers {

// Milliseconds since the epoch; file times come from it (a test can fix it).
using FakeClock = std::function<int64_t()>;

// One file, directory or device. Shared: a file open for writing keeps its
// node after rm, as a process keeps an unlinked inode.
struct FakeNode {
  uint32_t mode = 0;  // st_mode: type and permission bits
  std::string data;   // a regular file's bytes; a device's name ("null", "zero")
  int64_t mtime_ms = 0;
  bool linked = true;  // still named in its FakeFs
  bool is_dir() const { return S_ISDIR(mode); }
  bool is_reg() const { return S_ISREG(mode); }
  bool is_dev() const { return S_ISCHR(mode); }
};
using FakeNodePtr = std::shared_ptr<FakeNode>;

// `path` made absolute against `cwd`, without ".", "..", "//" or a trailing
// '/' ("/" stays "/"). ".." above the root stays at the root, as in a shell.
std::string FakeJoinPath(const std::string& cwd, const std::string& path);
std::string FakeBaseName(const std::string& path);

// The files of one box, by normalized absolute path. Errors are errno
// values (0: done), so messages read like the real tools'. Not thread-safe:
// its FakeBox's lock guards it.
class FakeFs {
 public:
  // "/", /bin, /dev (null, zero), /etc, /root, /tmp (1777), /usr/bin, /work.
  explicit FakeFs(int64_t now_ms = 0);

  // The node at `path`: ENOENT, or ENOTDIR when a parent is a file.
  FakeNodePtr Find(const std::string& path, int* err) const;
  // EEXIST (not with `parents` when it is a directory), ENOENT, ENOTDIR.
  int Mkdir(const std::string& path, uint32_t perm, bool parents, int64_t now_ms);
  // The regular file (or device) at `path`, created with `perm` when
  // missing, emptied when `truncate`. EISDIR, ENOENT, ENOTDIR.
  FakeNodePtr OpenWrite(const std::string& path, bool truncate, uint32_t perm, int64_t now_ms, int* err);
  // Appends to an open file. EFBIG past `max_file_bytes` (0: none), ENOSPC
  // past the capacity; what fits is written first, as write(2) does.
  int Append(const FakeNodePtr& node, std::string_view data, uint64_t max_file_bytes, int64_t now_ms);
  // Empties a file (the size counts).
  void Truncate(const FakeNodePtr& node, int64_t now_ms);
  // ENOENT; EISDIR for a directory unless `recursive`; EBUSY for "/".
  int Remove(const std::string& path, bool recursive);
  // rename(2): EINVAL to move a directory into itself; EISDIR/ENOTDIR on a type clash.
  int Rename(const std::string& from, const std::string& to, int64_t now_ms);
  // The names in directory `dir`, sorted, with their nodes. ENOENT, ENOTDIR.
  std::vector<std::pair<std::string, FakeNodePtr>> List(const std::string& dir, int* err) const;
  // A node's mode or mtime changed in place: counted as a change.
  void Changed() { ++version_; }

  // Writes past this many bytes of file data fail with ENOSPC; 0: no cap.
  void set_capacity(uint64_t bytes) { capacity_ = bytes; }
  uint64_t bytes() const { return bytes_; }  // of regular files, cheap
  size_t count() const { return nodes_.size(); }
  // Grows with every change: what a state file has seen is compared to it.
  uint64_t version() const { return version_; }

  std::string Serialize() const;
  // False when `data` is not what Serialize wrote (this FakeFs unchanged).
  bool Parse(const std::string& data);

 private:
  // 0 when the parent of `path` is a directory.
  int CheckParent(const std::string& path) const;
  void Unlink(std::map<std::string, FakeNodePtr>::iterator it);

  std::map<std::string, FakeNodePtr> nodes_;
  uint64_t bytes_ = 0;
  uint64_t capacity_ = 0;
  uint64_t version_ = 0;
};

// How a run was ended from outside its program; the first reason wins.
enum class FakeStop { kNone, kKilled, kTimedOut, kOutputLimit, kMemoryLimit, kPlatform };

// The control of one exec or background job: how it was stopped, its
// deadline and its memory. Checked by the interpreter between steps (every
// command, loop turn, read, write and 5 ms of sleep), so a stop takes
// effect within milliseconds. Thread-safe.
class FakeRunControl {
 public:
  // A job's `parent` is the exec that started it: stopping that exec (its
  // time or output limit, a kill) stops the job too, as a process group.
  explicit FakeRunControl(std::shared_ptr<FakeRunControl> parent = nullptr);

  // `detail`: the kill reason or the platform error.
  void Stop(FakeStop why, const std::string& detail);
  bool stopped() const;
  FakeStop why() const { return why_.load(); }
  std::string detail() const;

  void set_deadline(std::chrono::steady_clock::time_point t) { deadline_ = t; }
  // Stops the run with kTimedOut once its deadline has passed.
  bool PastDeadline();
  // 0: no limit.
  void set_memory_limit(uint64_t bytes) { memory_limit_ = bytes; }
  uint64_t memory_limit() const { return memory_limit_; }
  // Bytes a run buffers (a variable, a `tail`, a $(...)): false, and the
  // run stopped with kMemoryLimit, past the limit. Negative gives back.
  bool Charge(int64_t delta);
  uint64_t peak_memory() const { return peak_.load(); }
  void AddCpuUs(uint64_t us) { cpu_us_ += us; }
  uint64_t cpu_us() const { return cpu_us_.load(); }

  // A background job's end, for `wait`.
  void Finish(int status);
  // Waits up to `ms` for Finish: the status, or -1 if not yet.
  int WaitFinished(int ms);

 private:
  std::shared_ptr<FakeRunControl> parent_;
  std::atomic<FakeStop> why_{FakeStop::kNone};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string detail_;
  bool finished_ = false;
  int status_ = 0;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  uint64_t memory_limit_ = 0;
  std::atomic<int64_t> memory_{0};
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> cpu_us_{0};
};

// One fake sandbox: its files, its execs and background jobs in flight,
// whether it is paused, and (with a state file) its copy on disk.
class FakeBox {
 public:
  // `state_file`: where the box is written on every change a crash must
  // not lose (files, pause, vanishing); "" keeps it in memory only.
  FakeBox(std::string id, FakeClock clock, std::string state_file = "");
  ~FakeBox();
  FakeBox(const FakeBox&) = delete;
  FakeBox& operator=(const FakeBox&) = delete;

  // A box written by Sync; FailedPrecondition naming the file when it is
  // not one.
  static Result<std::shared_ptr<FakeBox>> Load(const std::string& id, const std::string& state_file, FakeClock clock);

  const std::string& id() const { return id_; }
  int64_t now_ms() const { return clock_(); }

  // The files, under Lock.
  std::unique_lock<std::mutex> Lock() const { return std::unique_lock<std::mutex>(mu_); }
  // Lock for a program of the box: waits while the box is paused (unless
  // `ctl` stops), so no file changes once SetPaused(true) has returned.
  std::unique_lock<std::mutex> LockRunnable(const FakeRunControl& ctl) const;
  FakeFs& fs() { return fs_; }
  const FakeFs& fs() const { return fs_; }
  // Writes the state file when something changed since the last write.
  // Without fsync: it is to survive dsecd's crash, not the host's.
  Status Sync();

  void SetPaused(bool paused);
  bool paused() const;
  // Blocks while the box is paused: true once it runs, false when `ctl`
  // stops meanwhile.
  bool WaitRunnable(const FakeRunControl& ctl) const;

  // An exec starts here: false (and why) when the box was removed or died.
  bool Enter(const std::shared_ptr<FakeRunControl>& ctl, std::string* why);
  void Leave(const std::shared_ptr<FakeRunControl>& ctl);
  // Runs `body` on a thread of the box's own until it ends or the box ends
  // it; false (nothing started) when the box was removed.
  bool StartJob(std::shared_ptr<FakeRunControl> ctl, std::function<void()> body);
  // Stops every exec and job with `why`, then waits for the execs to leave
  // and joins the jobs. `close`: no exec or job may start after (removal,
  // death); otherwise the box takes new ones (a driver stopping).
  void EndAll(FakeStop why, const std::string& detail, bool close);
  size_t execs() const;
  size_t jobs() const;

  // Commands running now, for DescribeState and tests.
  uint64_t AddRunning(std::string command);
  void RemoveRunning(uint64_t token);
  std::vector<std::string> Running() const;
  // Every exec's argv, in order (at most kMaxLog, the oldest dropped).
  static constexpr size_t kMaxLog = 10000;
  void AddLog(const std::vector<std::string>& argv);
  std::vector<std::vector<std::string>> Log() const;

  // The box died (FakeWorld::Vanish): kept as a tombstone until destroyed.
  void MarkVanished(const std::string& why);
  bool vanished(std::string* why = nullptr) const;

 private:
  struct Job {
    std::shared_ptr<FakeRunControl> ctl;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::string SerializeLocked() const;
  void ReapJobsLocked(std::list<Job>* finished);

  const std::string id_;
  const FakeClock clock_;
  const std::string state_file_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // pause changes, execs leaving
  FakeFs fs_;
  std::atomic<bool> paused_{false};  // read without the lock on every check
  bool vanished_ = false;
  std::string vanished_why_;
  bool closed_ = false;
  std::string closed_why_;
  uint64_t synced_version_ = 0;
  uint64_t meta_version_ = 1;  // paused / vanished changes
  uint64_t synced_meta_ = 0;
  std::vector<std::shared_ptr<FakeRunControl>> execs_;
  std::list<Job> jobs_;
  std::map<uint64_t, std::string> running_;
  uint64_t next_token_ = 1;
  std::vector<std::vector<std::string>> log_;
};

// Where fake boxes live: shared by the FakeDrivers made on it (one at a
// time in practice), and the tests' window on them.
class FakeWorld {
 public:
  using LostFn = std::function<void(const std::string& id, const std::string& why)>;

  std::shared_ptr<FakeBox> Find(const std::string& id) const;
  void Put(std::shared_ptr<FakeBox> box);
  // Removes and returns the box (null when there is none).
  std::shared_ptr<FakeBox> Take(const std::string& id);
  std::vector<std::string> Ids() const;

  // Test hooks: the argv of every exec into box `id`; what runs there now.
  std::vector<std::vector<std::string>> ArgvLog(const std::string& id) const;
  std::vector<std::string> Running(const std::string& id) const;
  // Box `id` dies as if its process were killed: its execs and jobs end
  // with a platform error saying it is gone, later execs fail the same
  // way, and listening drivers are told (FakeOptions::lost). False when
  // there is no such box.
  bool Vanish(const std::string& id, const std::string& why);

  // A driver hears of vanished boxes until Unlisten.
  uint64_t Listen(LostFn fn);
  void Unlisten(uint64_t token);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<FakeBox>> boxes_;
  std::map<uint64_t, LostFn> listeners_;
  uint64_t next_listener_ = 1;
};

}  // namespace dsec::drivers
