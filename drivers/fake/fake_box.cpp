#include "drivers/fake/fake_box.hpp"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "runtime/files.hpp"

namespace dsec::drivers {

namespace {

constexpr char kBoxMagic[] = "dsec-fake-box 1\n";

// The state file's encoding: fixed-width little-endian integers and
// length-prefixed strings (files are binary).
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* out, std::string_view s) {
  PutU64(out, s.size());
  out->append(s.data(), s.size());
}

class Decoder {
 public:
  explicit Decoder(std::string_view in) : in_(in) {}
  bool U64(uint64_t* v) {
    if (in_.size() - pos_ < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool Str(std::string* s) {
    uint64_t n;
    if (!U64(&n) || in_.size() - pos_ < n) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Literal(std::string_view lit) {
    if (in_.compare(pos_, lit.size(), lit) != 0) return false;
    pos_ += lit.size();
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// Under `dir`: "/" for the root, else "dir/".
std::string ChildPrefix(const std::string& dir) { return dir == "/" ? "/" : dir + "/"; }

Status WriteWhole(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "fake: write state file " + tmp);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return Status::FromErrno(e, "fake: write state file " + tmp);
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) < 0) return Status::FromErrno(errno, "fake: close state file " + tmp);
  if (::rename(tmp.c_str(), path.c_str()) < 0) return Status::FromErrno(errno, "fake: rename " + tmp + " to " + path);
  return Status::Ok();
}

}  // namespace

std::string FakeJoinPath(const std::string& cwd, const std::string& path) {
  std::string whole = !path.empty() && path[0] == '/' ? path : cwd + "/" + path;
  std::vector<std::string> parts;
  for (size_t i = 0; i <= whole.size();) {
    size_t j = whole.find('/', i);
    if (j == std::string::npos) j = whole.size();
    std::string c = whole.substr(i, j - i);
    if (c == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!c.empty() && c != ".") {
      parts.push_back(std::move(c));
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

std::string FakeBaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos || p == "/" ? p : p.substr(slash + 1);
}

// --- FakeFs -----------------------------------------------------------------

FakeFs::FakeFs(int64_t now_ms) {
  auto dir = [&](const char* path, uint32_t perm) {
    auto n = std::make_shared<FakeNode>();
    n->mode = S_IFDIR | perm;
    n->mtime_ms = now_ms;
    nodes_[path] = n;
  };
  for (const char* d : {"/", "/bin", "/dev", "/etc", "/usr", "/usr/bin", "/work"}) dir(d, 0755);
  dir("/root", 0700);
  dir("/tmp", 01777);
  for (const char* dev : {"null", "zero"}) {
    auto n = std::make_shared<FakeNode>();
    n->mode = S_IFCHR | 0666;
    n->data = dev;
    n->mtime_ms = now_ms;
    nodes_[std::string("/dev/") + dev] = n;
  }
}

FakeNodePtr FakeFs::Find(const std::string& path, int* err) const {
  auto it = nodes_.find(path);
  if (it != nodes_.end()) {
    *err = 0;
    return it->second;
  }
  // ENOTDIR when the nearest existing ancestor is not a directory.
  std::string up = path;
  do {
    up = Parent(up);
    auto a = nodes_.find(up);
    if (a != nodes_.end()) {
      *err = a->second->is_dir() ? ENOENT : ENOTDIR;
      return nullptr;
    }
  } while (up != "/");
  *err = ENOENT;
  return nullptr;
}

int FakeFs::CheckParent(const std::string& path) const {
  int err;
  auto p = Find(Parent(path), &err);
  if (!p) return err;
  return p->is_dir() ? 0 : ENOTDIR;
}

int FakeFs::Mkdir(const std::string& path, uint32_t perm, bool parents, int64_t now_ms) {
  int err;
  if (auto n = Find(path, &err)) return parents && n->is_dir() ? 0 : EEXIST;
  if (parents && path != "/") {
    if (int e = Mkdir(Parent(path), 0755, true, now_ms)) return e == EEXIST ? ENOTDIR : e;
  } else if (int e = CheckParent(path)) {
    return e;
  }
  auto n = std::make_shared<FakeNode>();
  n->mode = S_IFDIR | (perm & 07777);
  n->mtime_ms = now_ms;
  nodes_[path] = n;
  ++version_;
  return 0;
}

FakeNodePtr FakeFs::OpenWrite(const std::string& path, bool truncate, uint32_t perm, int64_t now_ms, int* err) {
  if (auto n = Find(path, err)) {
    if (n->is_dir()) {
      *err = EISDIR;
      return nullptr;
    }
    if (truncate && n->is_reg()) Truncate(n, now_ms);
    return n;
  }
  if (*err != ENOENT || (*err = CheckParent(path)) != 0) return nullptr;
  auto n = std::make_shared<FakeNode>();
  n->mode = S_IFREG | (perm & 07777);
  n->mtime_ms = now_ms;
  nodes_[path] = n;
  ++version_;
  return n;
}

int FakeFs::Append(const FakeNodePtr& node, std::string_view data, uint64_t max_file_bytes, int64_t now_ms) {
  if (!node->is_reg()) return 0;  // devices: /dev/null and /dev/zero swallow writes
  size_t take = data.size();
  int err = 0;
  uint64_t size = node->data.size();
  if (max_file_bytes && size + take > max_file_bytes) {
    take = size >= max_file_bytes ? 0 : static_cast<size_t>(max_file_bytes - size);
    err = EFBIG;
  }
  if (node->linked && capacity_ && bytes_ + take > capacity_) {
    take = bytes_ >= capacity_ ? 0 : static_cast<size_t>(capacity_ - bytes_);
    err = ENOSPC;
  }
  if (take > 0) {
    node->data.append(data.data(), take);
    node->mtime_ms = now_ms;
    if (node->linked) bytes_ += take;
    ++version_;
  }
  return err;
}

void FakeFs::Truncate(const FakeNodePtr& node, int64_t now_ms) {
  if (node->linked) bytes_ -= node->data.size();
  node->data.clear();
  node->mtime_ms = now_ms;
  ++version_;
}

void FakeFs::Unlink(std::map<std::string, FakeNodePtr>::iterator it) {
  auto& n = it->second;
  if (n->is_reg()) bytes_ -= n->data.size();
  n->linked = false;
  nodes_.erase(it);
}

int FakeFs::Remove(const std::string& path, bool recursive) {
  if (path == "/") return EBUSY;
  int err;
  auto n = Find(path, &err);
  if (!n) return err;
  if (n->is_dir()) {
    if (!recursive) return EISDIR;
    std::string prefix = path + "/";
    for (auto it = nodes_.lower_bound(prefix); it != nodes_.end() && it->first.compare(0, prefix.size(), prefix) == 0;)
      Unlink(it++);
  }
  Unlink(nodes_.find(path));
  ++version_;
  return 0;
}

int FakeFs::Rename(const std::string& from, const std::string& to, int64_t now_ms) {
  int err;
  auto src = Find(from, &err);
  if (!src) return err;
  if (from == to) return 0;
  if (to.compare(0, from.size() + 1, from + "/") == 0) return EINVAL;
  if (int e = CheckParent(to)) return e;
  if (auto dst = Find(to, &err)) {
    if (dst->is_dir() && !src->is_dir()) return EISDIR;
    if (!dst->is_dir() && src->is_dir()) return ENOTDIR;
    if (dst->is_dir() && !List(to, &err).empty()) return ENOTEMPTY;
    Unlink(nodes_.find(to));
  }
  std::vector<std::pair<std::string, FakeNodePtr>> moved;
  std::string prefix = from + "/";
  for (auto it = nodes_.lower_bound(prefix); it != nodes_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    moved.emplace_back(to + it->first.substr(from.size()), it->second);
    it = nodes_.erase(it);
  }
  nodes_.erase(from);
  nodes_[to] = src;
  for (auto& [p, n] : moved) nodes_[p] = n;
  src->mtime_ms = now_ms;
  ++version_;
  return 0;
}

std::vector<std::pair<std::string, FakeNodePtr>> FakeFs::List(const std::string& dir, int* err) const {
  std::vector<std::pair<std::string, FakeNodePtr>> out;
  auto d = Find(dir, err);
  if (!d) return out;
  if (!d->is_dir()) {
    *err = ENOTDIR;
    return out;
  }
  std::string prefix = ChildPrefix(dir);
  for (auto it = nodes_.upper_bound(prefix); it != nodes_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it) {
    std::string name = it->first.substr(prefix.size());
    if (name.find('/') == std::string::npos) out.emplace_back(std::move(name), it->second);
  }
  return out;
}

std::string FakeFs::Serialize() const {
  std::string out;
  PutU64(&out, nodes_.size());
  for (const auto& [path, n] : nodes_) {
    PutStr(&out, path);
    PutU64(&out, n->mode);
    PutU64(&out, static_cast<uint64_t>(n->mtime_ms));
    PutStr(&out, n->data);
  }
  return out;
}

bool FakeFs::Parse(const std::string& data) {
  Decoder d(data);
  uint64_t count;
  if (!d.U64(&count)) return false;
  std::map<std::string, FakeNodePtr> nodes;
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < count; ++i) {
    auto n = std::make_shared<FakeNode>();
    std::string path;
    uint64_t mode, mtime;
    if (!d.Str(&path) || !d.U64(&mode) || !d.U64(&mtime) || !d.Str(&n->data)) return false;
    if (path.empty() || path[0] != '/') return false;
    n->mode = static_cast<uint32_t>(mode);
    n->mtime_ms = static_cast<int64_t>(mtime);
    if (n->is_reg()) bytes += n->data.size();
    nodes[path] = std::move(n);
  }
  if (!d.done() || !nodes.count("/")) return false;
  nodes_.swap(nodes);
  bytes_ = bytes;
  ++version_;
  return true;
}

// --- FakeRunControl -----------------------------------------------------------

FakeRunControl::FakeRunControl(std::shared_ptr<FakeRunControl> parent) : parent_(std::move(parent)) {}

void FakeRunControl::Stop(FakeStop why, const std::string& detail) {
  std::lock_guard<std::mutex> lk(mu_);
  FakeStop none = FakeStop::kNone;
  if (why_.compare_exchange_strong(none, why)) detail_ = detail;
  cv_.notify_all();
}

bool FakeRunControl::stopped() const { return why_.load() != FakeStop::kNone || (parent_ && parent_->stopped()); }

std::string FakeRunControl::detail() const {
  std::lock_guard<std::mutex> lk(mu_);
  return detail_;
}

bool FakeRunControl::PastDeadline() {
  if (deadline_ == std::chrono::steady_clock::time_point::max() || std::chrono::steady_clock::now() < deadline_)
    return false;
  Stop(FakeStop::kTimedOut, "");
  return true;
}

bool FakeRunControl::Charge(int64_t delta) {
  int64_t now = memory_ += delta;
  if (delta <= 0) return true;
  uint64_t peak = peak_.load();
  while (static_cast<uint64_t>(now) > peak && !peak_.compare_exchange_weak(peak, static_cast<uint64_t>(now))) {
  }
  if (memory_limit_ && static_cast<uint64_t>(now) > memory_limit_) {
    Stop(FakeStop::kMemoryLimit, "");
    return false;
  }
  return true;
}

void FakeRunControl::Finish(int status) {
  std::lock_guard<std::mutex> lk(mu_);
  finished_ = true;
  status_ = status;
  cv_.notify_all();
}

int FakeRunControl::WaitFinished(int ms) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, std::chrono::milliseconds(ms), [&] { return finished_; });
  return finished_ ? status_ : -1;
}

// --- FakeBox -------------------------------------------------------------------

FakeBox::FakeBox(std::string id, FakeClock clock, std::string state_file)
    : id_(std::move(id)), clock_(std::move(clock)), state_file_(std::move(state_file)), fs_(clock_()) {}

FakeBox::~FakeBox() { EndAll(FakeStop::kPlatform, "fake " + id_ + " was removed", true); }

Result<std::shared_ptr<FakeBox>> FakeBox::Load(const std::string& id, const std::string& state_file, FakeClock clock) {
  auto raw = ReadFileToString(state_file);
  if (!raw.ok()) return Status::FailedPrecondition("fake " + id + " is gone: " + raw.status().message());
  Decoder d(*raw);
  std::string stored_id, why, fs;
  uint64_t paused = 0, vanished = 0;
  auto box = std::make_shared<FakeBox>(id, std::move(clock), state_file);
  if (!d.Literal(kBoxMagic) || !d.Str(&stored_id) || !d.U64(&paused) || !d.U64(&vanished) || !d.Str(&why) ||
      !d.Str(&fs) || !d.done() || stored_id != id || !box->fs_.Parse(fs))
    return Status::FailedPrecondition("fake " + id + ": " + state_file +
                                      " is not a fake box's state file (remove it; the sandbox is lost)");
  box->paused_ = paused != 0;
  box->vanished_ = vanished != 0;
  box->vanished_why_ = why;
  box->synced_version_ = box->fs_.version();
  box->synced_meta_ = box->meta_version_;
  return box;
}

std::string FakeBox::SerializeLocked() const {
  std::string out = kBoxMagic;
  PutStr(&out, id_);
  PutU64(&out, paused_.load() ? 1 : 0);
  PutU64(&out, vanished_ ? 1 : 0);
  PutStr(&out, vanished_why_);
  PutStr(&out, fs_.Serialize());
  return out;
}

Status FakeBox::Sync() {
  if (state_file_.empty()) return Status::Ok();
  // Written under the lock: two writers cannot put an older copy last.
  std::lock_guard<std::mutex> lk(mu_);
  if (fs_.version() == synced_version_ && meta_version_ == synced_meta_) return Status::Ok();
  DSEC_RETURN_IF_ERROR(WriteWhole(state_file_, SerializeLocked()));
  synced_version_ = fs_.version();
  synced_meta_ = meta_version_;
  return Status::Ok();
}

void FakeBox::SetPaused(bool paused) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (paused_ == paused) return;
    paused_ = paused;
    ++meta_version_;
  }
  cv_.notify_all();
}

bool FakeBox::paused() const { return paused_.load(); }

bool FakeBox::WaitRunnable(const FakeRunControl& ctl) const {
  if (!paused_.load()) return !ctl.stopped();
  std::unique_lock<std::mutex> lk(mu_);
  // Polled: a stop of `ctl` does not signal this box.
  while (paused_ && !ctl.stopped()) cv_.wait_for(lk, std::chrono::milliseconds(5));
  return !ctl.stopped();
}

std::unique_lock<std::mutex> FakeBox::LockRunnable(const FakeRunControl& ctl) const {
  std::unique_lock<std::mutex> lk(mu_);
  while (paused_ && !ctl.stopped()) cv_.wait_for(lk, std::chrono::milliseconds(5));
  return lk;
}

bool FakeBox::Enter(const std::shared_ptr<FakeRunControl>& ctl, std::string* why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_ || vanished_) {
    *why = vanished_ ? "fake " + id_ + " is gone: " + vanished_why_ : closed_why_;
    return false;
  }
  execs_.push_back(ctl);
  return true;
}

void FakeBox::Leave(const std::shared_ptr<FakeRunControl>& ctl) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    execs_.erase(std::remove(execs_.begin(), execs_.end(), ctl), execs_.end());
  }
  cv_.notify_all();
}

void FakeBox::ReapJobsLocked(std::list<Job>* finished) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->done->load())
      finished->splice(finished->end(), jobs_, it++);
    else
      ++it;
  }
}

bool FakeBox::StartJob(std::shared_ptr<FakeRunControl> ctl, std::function<void()> body) {
  std::list<Job> finished;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_ || vanished_) return false;
    ReapJobsLocked(&finished);
    auto done = std::make_shared<std::atomic<bool>>(false);
    jobs_.push_back(Job{ctl, std::thread([body = std::move(body), done] {
                          body();
                          done->store(true);
                        }),
                        done});
  }
  for (auto& j : finished) j.thread.join();
  return true;
}

void FakeBox::EndAll(FakeStop why, const std::string& detail, bool close) {
  auto stop_jobs = [&] {
    std::list<Job> jobs;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& e : execs_) e->Stop(why, detail);
      for (auto& j : jobs_) j.ctl->Stop(why, detail);
      jobs.swap(jobs_);
    }
    cv_.notify_all();
    for (auto& j : jobs) j.thread.join();
  };
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (close && !closed_) {
      closed_ = true;
      closed_why_ = detail;
    }
  }
  stop_jobs();
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return execs_.empty(); });
  }
  stop_jobs();  // a job an exec started while it was being stopped
}

size_t FakeBox::execs() const {
  std::lock_guard<std::mutex> lk(mu_);
  return execs_.size();
}

size_t FakeBox::jobs() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& j : jobs_) n += j.done->load() ? 0 : 1;
  return n;
}

uint64_t FakeBox::AddRunning(std::string command) {
  std::lock_guard<std::mutex> lk(mu_);
  running_[next_token_] = std::move(command);
  return next_token_++;
}

void FakeBox::RemoveRunning(uint64_t token) {
  std::lock_guard<std::mutex> lk(mu_);
  running_.erase(token);
}

std::vector<std::string> FakeBox::Running() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::string> out;
  for (const auto& [t, c] : running_) out.push_back(c);
  return out;
}

void FakeBox::AddLog(const std::vector<std::string>& argv) {
  std::lock_guard<std::mutex> lk(mu_);
  if (log_.size() >= kMaxLog) log_.erase(log_.begin());
  log_.push_back(argv);
}

std::vector<std::vector<std::string>> FakeBox::Log() const {
  std::lock_guard<std::mutex> lk(mu_);
  return log_;
}

void FakeBox::MarkVanished(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  vanished_ = true;
  vanished_why_ = why;
  ++meta_version_;
}

bool FakeBox::vanished(std::string* why) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (why) *why = vanished_why_;
  return vanished_;
}

// --- FakeWorld -----------------------------------------------------------------

std::shared_ptr<FakeBox> FakeWorld::Find(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = boxes_.find(id);
  return it == boxes_.end() ? nullptr : it->second;
}

void FakeWorld::Put(std::shared_ptr<FakeBox> box) {
  std::lock_guard<std::mutex> lk(mu_);
  boxes_[box->id()] = std::move(box);
}

std::shared_ptr<FakeBox> FakeWorld::Take(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = boxes_.find(id);
  if (it == boxes_.end()) return nullptr;
  auto box = std::move(it->second);
  boxes_.erase(it);
  return box;
}

std::vector<std::string> FakeWorld::Ids() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::string> out;
  for (const auto& [id, b] : boxes_) out.push_back(id);
  return out;
}

std::vector<std::vector<std::string>> FakeWorld::ArgvLog(const std::string& id) const {
  auto box = Find(id);
  return box ? box->Log() : std::vector<std::vector<std::string>>{};
}

std::vector<std::string> FakeWorld::Running(const std::string& id) const {
  auto box = Find(id);
  return box ? box->Running() : std::vector<std::string>{};
}

bool FakeWorld::Vanish(const std::string& id, const std::string& why) {
  auto box = Find(id);
  if (!box) return false;
  box->MarkVanished(why);
  if (!box->Sync().ok()) {
    // The tombstone stays in memory; a restart on the state dir would see
    // the box alive, which a test hook may accept.
  }
  box->EndAll(FakeStop::kPlatform, "fake " + id + " is gone: " + why, true);
  std::vector<LostFn> fns;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [t, fn] : listeners_) fns.push_back(fn);
  }
  for (auto& fn : fns) fn(id, why);
  return true;
}

uint64_t FakeWorld::Listen(LostFn fn) {
  std::lock_guard<std::mutex> lk(mu_);
  listeners_[next_listener_] = std::move(fn);
  return next_listener_++;
}

void FakeWorld::Unlisten(uint64_t token) {
  std::lock_guard<std::mutex> lk(mu_);
  listeners_.erase(token);
}

}  // namespace dsec::drivers
