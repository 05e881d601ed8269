// The fake shell's streams and a shell's state: the exec's capped output
// (kept or streamed), pipes between stages, files and devices of the box,
// what $(...) captures, and the checkpoint (Shell::Check) every stream
// passes, where stops, deadlines and pauses act. A stream blocks the way
// its real counterpart does, polling its run's control every 5 ms.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "drivers/fake/fake_shell_internal.hpp"

namespace dsec::drivers::fakesh {

constexpr size_t kPipeBytes = 64 << 10;
constexpr uint64_t kDefaultOutputCap = 1 << 20;  // as the agent: Limits.output_bytes = 0
constexpr auto kPoll = std::chrono::milliseconds(5);

// The exec's stdout and stderr: capped per stream; past the cap the run's
// process group (the exec and its jobs) is stopped and the rest dropped.
class Sink {
 public:
  Sink(std::shared_ptr<FakeRunControl> group, uint64_t cap, std::function<void(bool, const std::string&)> stream)
      : group_(std::move(group)), cap_(cap ? cap : kDefaultOutputCap), stream_(std::move(stream)) {}
  int Write(bool is_err, std::string_view data) {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return EPIPE;  // a job writing after its exec was answered
    Stream& s = s_[is_err ? 1 : 0];
    uint64_t room = s.count < cap_ ? cap_ - s.count : 0;
    size_t take = data.size() < room ? data.size() : static_cast<size_t>(room);
    if (take > 0) {
      s.count += take;
      // Under the lock: pieces reach the callback in the order written.
      if (stream_)
        stream_(is_err, std::string(data.substr(0, take)));
      else
        s.buf.append(data.data(), take);
    }
    if (take == data.size()) return 0;
    if (!s.truncated) {
      s.truncated = true;
      group_->Stop(FakeStop::kOutputLimit, "");
    }
    return -1;
  }
  void Close(FakeResult* r) {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    r->out = std::move(s_[0].buf);
    r->err = std::move(s_[1].buf);
    r->out_truncated = s_[0].truncated;
    r->err_truncated = s_[1].truncated;
  }

 private:
  struct Stream {
    std::string buf;
    uint64_t count = 0;
    bool truncated = false;
  };
  std::shared_ptr<FakeRunControl> group_;
  const uint64_t cap_;
  std::function<void(bool, const std::string&)> stream_;
  std::mutex mu_;
  Stream s_[2];
  bool closed_ = false;
};

namespace {

class SinkOut : public Writer {
 public:
  SinkOut(std::shared_ptr<Sink> sink, bool is_err) : sink_(std::move(sink)), is_err_(is_err) {}
  int Write(Shell& sh, std::string_view data) override {
    if (!sh.Check()) return -1;
    return sink_->Write(is_err_, data);
  }

 private:
  std::shared_ptr<Sink> sink_;
  bool is_err_;
};

class StringIn : public Reader {
 public:
  explicit StringIn(std::string data) : data_(std::move(data)) {}
  long Read(Shell& sh, std::string* out, size_t max) override {
    if (!sh.Check()) return -1;
    size_t n = std::min(max, data_.size() - off_);
    out->append(data_, off_, n);
    off_ += n;
    return static_cast<long>(n);
  }

 private:
  std::string data_;
  size_t off_ = 0;
};

class NullIn : public Reader {
 public:
  long Read(Shell& sh, std::string*, size_t) override { return sh.Check() ? 0 : -1; }
};

class ZeroIn : public Reader {
 public:
  long Read(Shell& sh, std::string* out, size_t max) override {
    if (!sh.Check()) return -1;
    size_t n = std::min<size_t>(max, kPipeBytes);
    out->append(n, '\0');
    return static_cast<long>(n);
  }
};

class FileIn : public Reader {
 public:
  explicit FileIn(FakeNodePtr node) : node_(std::move(node)) {}
  long Read(Shell& sh, std::string* out, size_t max) override {
    if (!sh.Check()) return -1;
    auto lk = sh.Lock();
    size_t size = node_->data.size();
    size_t n = off_ < size ? std::min(max, size - off_) : 0;
    out->append(node_->data, off_, n);
    off_ += n;
    return static_cast<long>(n);
  }

 private:
  FakeNodePtr node_;
  size_t off_ = 0;
};

class NullOut : public Writer {
 public:
  int Write(Shell& sh, std::string_view) override { return sh.Check() ? 0 : -1; }
};

class FileOut : public Writer {
 public:
  explicit FileOut(FakeNodePtr node) : node_(std::move(node)) {}
  int Write(Shell& sh, std::string_view data) override {
    if (!sh.Check()) return -1;
    auto lk = sh.Lock();
    return sh.box->fs().Append(node_, data, sh.info->file_size_bytes, sh.box->now_ms());
  }

 private:
  FakeNodePtr node_;
};

// A pipe: bounded, blocking both ways; the read end closing gives the
// writer EPIPE, the last write end closing gives the reader EOF. Ends
// close when their last holder lets go, as file descriptors do.
struct PipeState {
  std::mutex mu;
  std::condition_variable cv;
  std::string buf;
  bool reader_gone = false;
  bool writer_gone = false;
};

class PipeIn : public Reader {
 public:
  explicit PipeIn(std::shared_ptr<PipeState> p) : p_(std::move(p)) {}
  ~PipeIn() override { Close(); }
  long Read(Shell& sh, std::string* out, size_t max) override {
    for (;;) {
      if (!sh.Check()) return -1;
      std::unique_lock<std::mutex> lk(p_->mu);
      if (!p_->buf.empty()) {
        size_t n = std::min(max, p_->buf.size());
        out->append(p_->buf, 0, n);
        p_->buf.erase(0, n);
        p_->cv.notify_all();
        return static_cast<long>(n);
      }
      if (p_->writer_gone) return 0;
      p_->cv.wait_for(lk, kPoll);
    }
  }
  void Close() override {
    std::lock_guard<std::mutex> lk(p_->mu);
    p_->reader_gone = true;
    p_->cv.notify_all();
  }

 private:
  std::shared_ptr<PipeState> p_;
};

class PipeOut : public Writer {
 public:
  explicit PipeOut(std::shared_ptr<PipeState> p) : p_(std::move(p)) {}
  ~PipeOut() override { Close(); }
  int Write(Shell& sh, std::string_view data) override {
    while (!data.empty()) {
      if (!sh.Check()) return -1;
      std::unique_lock<std::mutex> lk(p_->mu);
      if (p_->reader_gone) return EPIPE;
      size_t room = kPipeBytes > p_->buf.size() ? kPipeBytes - p_->buf.size() : 0;
      if (room == 0) {
        p_->cv.wait_for(lk, kPoll);
        continue;
      }
      size_t n = std::min(room, data.size());
      p_->buf.append(data.data(), n);
      data.remove_prefix(n);
      p_->cv.notify_all();
    }
    return 0;
  }
  void Close() override {
    std::lock_guard<std::mutex> lk(p_->mu);
    p_->writer_gone = true;
    p_->cv.notify_all();
  }

 private:
  std::shared_ptr<PipeState> p_;
};

}  // namespace

// --- the shell's state -------------------------------------------------------------

Shell::Shell(const Shell& o)
    : box(o.box),
      ctl(o.ctl),
      info(o.info),
      vars(o.vars),
      exported(o.exported),
      args(o.args),
      cwd(o.cwd),
      status(o.status),
      last_pid(o.last_pid),
      in(o.in),
      out(o.out),
      err(o.err) {}

Shell::~Shell() {
  if (charged) ctl->Charge(-charged);
}

bool Shell::Check() {
  if (ctl->stopped() || ctl->PastDeadline()) return false;
  return box->WaitRunnable(*ctl);
}

std::string Shell::Var(const std::string& name) const {
  auto it = vars.find(name);
  return it == vars.end() ? "" : it->second;
}

bool Shell::SetVar(const std::string& name, const std::string& value) {
  auto it = vars.find(name);
  int64_t delta = static_cast<int64_t>(value.size()) - (it == vars.end() ? 0 : static_cast<int64_t>(it->second.size()));
  charged += delta;
  vars[name] = value;
  return ctl->Charge(delta);
}

void Shell::Unset(const std::string& name) {
  auto it = vars.find(name);
  if (it == vars.end()) return;
  charged -= static_cast<int64_t>(it->second.size());
  (void)ctl->Charge(-static_cast<int64_t>(it->second.size()));
  vars.erase(it);
  exported.erase(name);
}

bool Shell::Put(const WriterPtr& w, std::string_view data) {
  int r = w->Write(*this, data);
  if (r == 0) return true;
  if (r == EPIPE) {  // SIGPIPE: this shell (a stage, a job) dies
    exiting = true;
    sigpipe = true;
  } else if (r > 0 && !write_errno) {
    write_errno = r;
  }
  return false;
}

std::map<std::string, std::string> Shell::Environ() const {
  std::map<std::string, std::string> env;
  for (const auto& name : exported)
    if (auto it = vars.find(name); it != vars.end()) env[name] = it->second;
  return env;
}

int Capture::Write(Shell& sh, std::string_view data) {
  if (!sh.Check()) return -1;
  if (!ctl_) ctl_ = sh.ctl;
  buf_.append(data.data(), data.size());
  return ctl_->Charge(static_cast<int64_t>(data.size())) ? 0 : -1;
}

Capture::~Capture() {
  if (ctl_) ctl_->Charge(-static_cast<int64_t>(buf_.size()));
}

std::string Capture::Take() {
  if (ctl_) ctl_->Charge(-static_cast<int64_t>(buf_.size()));
  return std::move(buf_);
}

ReaderPtr StringReader(std::string data) { return std::make_shared<StringIn>(std::move(data)); }
ReaderPtr NullReader() { return std::make_shared<NullIn>(); }
WriterPtr NullWriter() { return std::make_shared<NullOut>(); }

ReaderPtr OpenRead(Shell& sh, const std::string& path, int* err) {
  auto lk = sh.Lock();
  auto node = sh.box->fs().Find(path, err);
  if (!node) return nullptr;
  if (node->is_dir()) {
    *err = EISDIR;
    return nullptr;
  }
  if (node->is_dev()) return node->data == "zero" ? ReaderPtr(std::make_shared<ZeroIn>()) : NullReader();
  return std::make_shared<FileIn>(node);
}

WriterPtr OpenWrite(Shell& sh, const std::string& path, bool append, int* err) {
  auto lk = sh.Lock();
  auto node = sh.box->fs().OpenWrite(path, !append, 0644, sh.box->now_ms(), err);
  if (!node) return nullptr;
  if (node->is_dev()) return NullWriter();
  return std::make_shared<FileOut>(node);
}

std::string ErrnoText(int err) { return std::strerror(err); }

std::pair<ReaderPtr, WriterPtr> MakePipe() {
  auto p = std::make_shared<PipeState>();
  return {std::make_shared<PipeIn>(p), std::make_shared<PipeOut>(p)};
}

std::shared_ptr<Sink> MakeSink(std::shared_ptr<FakeRunControl> group, uint64_t cap,
                               std::function<void(bool, const std::string&)> stream) {
  return std::make_shared<Sink>(std::move(group), cap, std::move(stream));
}

WriterPtr SinkWriter(const std::shared_ptr<Sink>& sink, bool is_err) { return std::make_shared<SinkOut>(sink, is_err); }

void CloseSink(Sink& sink, FakeResult* r) { sink.Close(r); }

}  // namespace dsec::drivers::fakesh
