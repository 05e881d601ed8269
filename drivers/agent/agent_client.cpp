#include "drivers/agent/agent_client.hpp"

#include "drivers/agent/channel_sync.hpp"

#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>

#include "runtime/frame.hpp"

namespace dsec::drivers {

namespace {

using Event = agent::Event;

Status::Code CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ESRCH: return Status::Code::kNotFound;
    case EEXIST: return Status::Code::kAlreadyExists;
    case EINVAL:
    case EBADMSG:
    case EMSGSIZE:
    case ENAMETOOLONG: return Status::Code::kInvalidArgument;
    case EACCES:
    case EPERM:
    case EROFS:
    case EISDIR:
    case ENOTDIR:
    case ENOTEMPTY:
    case ELOOP:
    case ETXTBSY: return Status::Code::kFailedPrecondition;
    case EFBIG:
    case E2BIG:
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
    case ENOBUFS: return Status::Code::kResourceExhausted;
    case ETIMEDOUT: return Status::Code::kDeadlineExceeded;
    case ECANCELED: return Status::Code::kAborted;
    case EOPNOTSUPP: return Status::Code::kUnimplemented;
    default: return Status::Code::kInternal;
  }
}

Status FromAgentError(const std::string& name, const agent::Error& e) {
  return Status(CodeForErrno(e.errno_value()), name + ": " + e.message());
}

Status Unexpected(const std::string& name, const char* request) {
  return Status::Internal(name + ": the agent answered " + request + " with an unexpected event");
}

// Adapts a typed callback to the final event of a request: an Error becomes
// its Status; `extract` takes the expected body out of the event.
template <class T, class Extract>
std::function<void(Result<Event>)> Answer(std::string name, std::function<void(Result<T>)> done,
                                          Extract extract) {
  return [name = std::move(name), done = std::move(done), extract](Result<Event> r) mutable {
    if (!r.ok()) return done(r.status());
    if (r->has_error()) return done(FromAgentError(name, r->error()));
    done(extract(*r));
  };
}

std::function<void(Result<Event>)> AnswerOk(std::string name, std::function<void(const Status&)> done,
                                            const char* request) {
  return [name = std::move(name), done = std::move(done), request](Result<Event> r) {
    if (!r.ok()) return done(r.status());
    if (r->has_error()) return done(FromAgentError(name, r->error()));
    done(r->has_ok() ? Status::Ok() : Unexpected(name, request));
  };
}

template <class T>
Result<T> Wait(const std::string& name, const char* what, std::chrono::milliseconds timeout,
               const std::function<void(std::function<void(Result<T>)>)>& start) {
  auto prom = std::make_shared<std::promise<Result<T>>>();
  auto fut = prom->get_future();
  start([prom](Result<T> r) { prom->set_value(std::move(r)); });
  if (fut.wait_for(timeout) != std::future_status::ready)
    return Status::DeadlineExceeded(name + ": " + what + " got no answer within " +
                                    std::to_string(timeout.count()) + " ms");
  return fut.get();
}

Status WaitStatus(const std::string& name, const char* what, std::chrono::milliseconds timeout,
                  const std::function<void(std::function<void(const Status&)>)>& start) {
  auto prom = std::make_shared<std::promise<Status>>();
  auto fut = prom->get_future();
  start([prom](const Status& s) { prom->set_value(s); });
  if (fut.wait_for(timeout) != std::future_status::ready)
    return Status::DeadlineExceeded(name + ": " + what + " got no answer within " +
                                    std::to_string(timeout.count()) + " ms");
  return fut.get();
}

}  // namespace

// --- connection -----------------------------------------------------------------

namespace {

// A connected unix stream socket to `path`, or the errno of the connect
// (0 and *fd set on success); InvalidArgument for a path too long.
Result<int> ConnectUnix(const std::string& path, UniqueFd* fd) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    return Status::InvalidArgument("agent socket path '" + path + "' is longer than " +
                                   std::to_string(sizeof addr.sun_path - 1) + " bytes");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd->Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!*fd) return Status::FromErrno(errno, "agent client: socket");
  int rc;
  do {
    rc = ::connect(fd->get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } while (rc < 0 && errno == EINTR);
  return rc < 0 ? errno : 0;
}

}  // namespace

Result<std::unique_ptr<AgentClient>> AgentClient::Connect(const std::string& socket_path,
                                                          AgentClientOptions options) {
  UniqueFd fd;
  auto err = ConnectUnix(socket_path, &fd);
  if (!err.ok()) return err.status();
  if (*err != 0)
    return Status(*err == ENOENT || *err == ECONNREFUSED ? Status::Code::kUnavailable : CodeForErrno(*err),
                  "connect to the agent at " + socket_path + ": " + std::strerror(*err) +
                      " (is dsec-agent running there?)");
  if (options.name.empty()) options.name = "agent at " + socket_path;
  return FromFd(std::move(fd), std::move(options));
}

Result<std::unique_ptr<AgentClient>> AgentClient::ConnectChannel(const std::string& socket_path, int timeout_ms,
                                                                 AgentClientOptions options) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    return static_cast<int>(
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
  };
  UniqueFd fd;
  for (;;) {
    auto err = ConnectUnix(socket_path, &fd);
    if (!err.ok()) return err.status();
    if (*err == 0) break;
    // QEMU serves one client at a time and makes its socket as it starts.
    if ((*err == ENOENT || *err == ECONNREFUSED || *err == EAGAIN) && left_ms() > 0) {
      ::usleep(20'000);
      continue;
    }
    return Status(*err == ENOENT || *err == ECONNREFUSED ? Status::Code::kUnavailable : CodeForErrno(*err),
                  "connect to the agent channel at " + socket_path + ": " + std::strerror(*err));
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  std::string got;
  char nonce[8];
  auto ask = [&]() -> bool {
    uint64_t n = (static_cast<uint64_t>(Clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull) ^
                 reinterpret_cast<uintptr_t>(&got);
    std::memcpy(nonce, &n, 8);
    std::string msg(agent::kSyncAsk, 8);
    msg.append(nonce, 8);
    return WriteFull(fd.get(), msg.data(), msg.size()) == 0;
  };
  if (!ask()) return Status::Unavailable("agent channel at " + socket_path + ": write: " + std::strerror(errno));
  auto next_ask = Clock::now() + std::chrono::milliseconds(250);
  for (;;) {
    int wait = std::min<int>(left_ms(), static_cast<int>(std::max<int64_t>(
                                            0, std::chrono::duration_cast<std::chrono::milliseconds>(next_ask - Clock::now()).count())));
    pollfd p{fd.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, wait);
    if (rc < 0 && errno != EINTR) return Status::FromErrno(errno, "agent channel: poll");
    if (rc > 0) {
      char buf[4096];
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n == 0) return Status::Unavailable("agent channel at " + socket_path + ": closed by the VM's end");
      if (n > 0) {
        got.append(buf, static_cast<size_t>(n));
        size_t at = agent::FindSync(got, agent::kSyncAnswer, nonce);
        if (at != std::string::npos) {
          // Nothing follows the answer before our first request.
          if (got.size() > at + agent::kSyncBytes)
            return Status::Internal("agent channel at " + socket_path + ": bytes after the sync answer");
          break;
        }
        if (got.size() > agent::kSyncBytes) got.erase(0, got.size() - (agent::kSyncBytes - 1));
      }
    }
    if (left_ms() == 0)
      return Status::DeadlineExceeded("the agent did not answer on its channel " + socket_path + " within " +
                                      std::to_string(timeout_ms) + " ms");
    if (Clock::now() >= next_ask) {
      if (!ask()) return Status::Unavailable("agent channel at " + socket_path + ": write: " + std::strerror(errno));
      next_ask = Clock::now() + std::chrono::milliseconds(250);
    }
  }
  if (options.name.empty()) options.name = "agent on channel " + socket_path;
  return FromFd(std::move(fd), std::move(options));
}

Result<std::unique_ptr<AgentClient>> AgentClient::FromFd(UniqueFd fd, AgentClientOptions options) {
  if (!fd) return Status::InvalidArgument("agent client: no fd");
  if (options.name.empty()) options.name = "agent on fd " + std::to_string(fd.get());
  std::unique_ptr<AgentClient> c(new AgentClient(std::move(fd), std::move(options)));
  ::fcntl(c->fd_.get(), F_SETFL, ::fcntl(c->fd_.get(), F_GETFL) | O_NONBLOCK);
  uint64_t key = 0;
  DSEC_RETURN_IF_ERROR(AgentLoop::Shared().Add(c.get(), &key));
  c->loop_id_ = key;
  return c;
}

AgentClient::AgentClient(UniqueFd fd, AgentClientOptions options)
    : opts_(std::move(options)), fd_(std::move(fd)) {}

AgentClient::~AgentClient() { Close(); }

void AgentClient::Close(const std::string& why) {
  if (AgentLoop::Shared().OnLoopThread()) {
    // From a callback: the loop closes it once the callback returns (and
    // looks at it this round even when the agent is silent).
    if (!stopping_) stop_reason_ = why;
    stopping_ = true;
    AgentLoop::Shared().Wake(this);
    return;
  }
  std::lock_guard<std::mutex> lk(close_mu_);
  AgentLoop::Shared().Remove(this);
  FailAll(why);  // no-op when the loop already did
  fd_.Reset();
}

uint64_t AgentClient::Send(agent::Request& req, std::shared_ptr<Pending> p) {
  uint64_t id = next_id_++;
  req.set_id(id);
  std::string payload = req.SerializeAsString();
  if (payload.size() > kMaxFrameBytes) {
    p->done(Status::InvalidArgument(name() + ": the request is " + std::to_string(payload.size()) +
                                    " bytes, above the protocol's limit of " +
                                    std::to_string(kMaxFrameBytes)));
    return 0;
  }
  std::string reason;
  std::shared_ptr<Pending> refused;  // answered out of the lock
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) {
      reason = close_reason_;
      refused = std::move(p);
    } else {
      pending_[id] = std::move(p);
      AppendFrame(&outbox_, payload);
    }
  }
  if (refused) {
    refused->done(Status::Unavailable(name() + ": " + reason));
    return 0;
  }
  AgentLoop::Shared().Wake(this);
  return id;
}

void AgentClient::FailAll(const std::string& why) {
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> lost;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!closed_) {
      closed_ = true;
      close_reason_ = why;
    }
    lost.swap(pending_);
    outbox_.clear();
  }
  for (auto& [id, p] : lost)
    p->done(Status::Unavailable(name() + ": " + why + "; the outcome of request " + std::to_string(id) +
                                " is unknown"));
}

bool AgentClient::Flush(std::string* why) {
  if (off_ == out_.size()) {
    out_.clear();
    off_ = 0;
    std::lock_guard<std::mutex> lk(mu_);
    out_.swap(outbox_);
  }
  while (off_ < out_.size()) {
    // MSG_NOSIGNAL: a vanished agent must not SIGPIPE the host process.
    ssize_t w = is_socket_ ? ::send(fd_.get(), out_.data() + off_, out_.size() - off_, MSG_NOSIGNAL)
                           : ::write(fd_.get(), out_.data() + off_, out_.size() - off_);
    if (w < 0 && errno == ENOTSOCK) {
      is_socket_ = false;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) break;
    if (w < 0) {
      *why = std::string("write to the agent: ") + std::strerror(errno);
      return false;
    }
    off_ += static_cast<size_t>(w);
  }
  return true;
}

bool AgentClient::Readable(std::string* why) {
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd_.get(), buf, sizeof buf);
    if (r > 0) {
      dec_.Feed(buf, static_cast<size_t>(r));
      if (static_cast<size_t>(r) < sizeof buf) break;  // drained, most likely
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) *why = "the agent closed the connection";
    else if (errno != EAGAIN) *why = std::string("read from the agent: ") + std::strerror(errno);
    break;
  }
  // Frames that arrived before a close are still answers.
  std::string frame;
  int rc;
  while ((rc = dec_.Next(&frame)) == 1) OnFrame(frame);
  if (rc < 0) *why = "the agent sent a frame above the protocol's size limit";
  return why->empty();
}

// --- the shared I/O thread ------------------------------------------------------

AgentLoop& AgentLoop::Shared() {
  static AgentLoop loop;
  return loop;
}

AgentLoop::AgentLoop() {
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // the wake-up
  if (epoll_ && wake_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  thread_ = std::thread([this] { Run(); });
}

AgentLoop::~AgentLoop() {
  stop_ = true;
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

Status AgentLoop::Add(AgentClient* c, uint64_t* id) {
  if (!epoll_ || !wake_) return Status::Internal(c->name() + ": the agent I/O loop has no epoll/eventfd");
  std::lock_guard<std::mutex> lk(busy_);
  uint64_t key = next_id_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = key;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, c->fd_.get(), &ev) < 0)
    return Status::FromErrno(errno, c->name() + ": cannot poll its fd");
  c->interest_ = EPOLLIN;
  clients_[key] = c;
  *id = key;
  c->loop_id_ = key;
  return Status::Ok();
}

void AgentLoop::Remove(AgentClient* c) {
  // Waits for the loop to finish what it is doing (it may hold events for
  // `c` fetched before the removal; it looks clients up by id under busy_).
  std::lock_guard<std::mutex> lk(busy_);
  if (c->loop_id_ == 0) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c->fd_.get(), nullptr);
  clients_.erase(c->loop_id_);
  c->loop_id_ = 0;
}

void AgentLoop::Wake(AgentClient* c) {
  {
    std::lock_guard<std::mutex> lk(dirty_mu_);
    dirty_.push_back(c->loop_id_);
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

void AgentLoop::Drop(uint64_t id, AgentClient* c, const std::string& why) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c->fd_.get(), nullptr);
  clients_.erase(id);
  c->loop_id_ = 0;
  c->FailAll(why);
}

void AgentLoop::Run() {
  epoll_event events[64];
  std::vector<uint64_t> dirty;
  while (!stop_) {
    int n = ::epoll_wait(epoll_.get(), events, 64, -1);
    if (n < 0 && errno != EINTR) return;
    std::lock_guard<std::mutex> lk(busy_);
    // Which clients to flush, read, or close; each at most once a round.
    std::unordered_map<uint64_t, uint32_t> work;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        uint64_t v;
        (void)!::read(wake_.get(), &v, sizeof v);
        std::lock_guard<std::mutex> dl(dirty_mu_);
        dirty.swap(dirty_);
        for (uint64_t id : dirty) work[id] |= EPOLLOUT;
        dirty.clear();
        continue;
      }
      work[events[i].data.u64] |= events[i].events;
    }
    for (const auto& [id, what] : work) {
      auto it = clients_.find(id);
      if (it == clients_.end()) continue;  // removed meanwhile
      AgentClient* c = it->second;
      std::string why;
      bool ok = true;
      if (what & (EPOLLIN | EPOLLHUP | EPOLLERR)) ok = c->Readable(&why);
      if (ok && !c->stopping_) ok = c->Flush(&why);
      if (c->stopping_) {
        Drop(id, c, c->stop_reason_);
        continue;
      }
      if (!ok) {
        Drop(id, c, why);
        continue;
      }
      uint32_t want = EPOLLIN | (c->off_ < c->out_.size() ? static_cast<uint32_t>(EPOLLOUT) : 0u);
      if (want != c->interest_) {
        epoll_event ev{};
        ev.events = want;
        ev.data.u64 = id;
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c->fd_.get(), &ev);
        c->interest_ = want;
      }
    }
  }
}

void AgentClient::OnFrame(const std::string& frame) {
  Event ev;
  if (!ev.ParseFromString(frame)) {
    if (opts_.log) opts_.log(name() + ": a frame that is not an agent Event; ignored");
    return;
  }
  if (ev.id() == 0) {
    if (opts_.log)
      opts_.log(name() + ": " + (ev.has_error() ? ev.error().message() : std::string("unsolicited event")));
    return;
  }
  bool final = !ev.has_output() && !ev.has_fs_events();
  std::shared_ptr<Pending> p;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pending_.find(ev.id());
    if (it != pending_.end()) {
      p = it->second;
      if (final) pending_.erase(it);
    }
  }
  if (!p) {
    if (opts_.log) opts_.log(name() + ": event for unknown request " + std::to_string(ev.id()) + "; ignored");
    return;
  }
  if (!final) {
    if (ev.has_fs_events()) {
      if (p->on_fs_events) p->on_fs_events(ev.fs_events());
    } else if (p->on_output) {
      p->on_output(ev.output());
    }
    return;
  }
  p->done(std::move(ev));
}

// --- requests -------------------------------------------------------------------

uint64_t AgentClient::Exec(const agent::Exec& exec, OutputCallback on_output, Callback<run::Outcome> done) {
  auto p = std::make_shared<Pending>();
  p->on_output = std::move(on_output);
  p->done = Answer<run::Outcome>(name(), std::move(done), [n = name()](Event& ev) -> Result<run::Outcome> {
    if (!ev.has_exec_done()) return Unexpected(n, "exec");
    return std::move(*ev.mutable_exec_done());
  });
  agent::Request req;
  *req.mutable_exec() = exec;
  return Send(req, std::move(p));
}

uint64_t AgentClient::Watch(const agent::Watch& watch, FsEventsCallback on_events, StatusCallback done) {
  auto p = std::make_shared<Pending>();
  p->on_fs_events = std::move(on_events);
  p->done = AnswerOk(name(), std::move(done), "watch");
  agent::Request req;
  *req.mutable_watch() = watch;
  return Send(req, std::move(p));
}

void AgentClient::Signal(uint64_t exec_id, int signal, StatusCallback done) {
  auto p = std::make_shared<Pending>();
  p->done = AnswerOk(name(), std::move(done), "signal");
  agent::Request req;
  req.mutable_signal()->set_exec_id(exec_id);
  req.mutable_signal()->set_signal(signal);
  Send(req, std::move(p));
}

void AgentClient::ReadFile(const std::string& path, uint64_t max_bytes, Callback<std::string> done) {
  auto p = std::make_shared<Pending>();
  p->done = Answer<std::string>(name(), std::move(done), [n = name()](Event& ev) -> Result<std::string> {
    if (ev.body_case() != Event::kFileData) return Unexpected(n, "read_file");
    return std::move(*ev.mutable_file_data());
  });
  agent::Request req;
  req.mutable_read_file()->set_path(path);
  req.mutable_read_file()->set_max_bytes(max_bytes);
  Send(req, std::move(p));
}

void AgentClient::WriteFile(const agent::WriteFile& write, StatusCallback done) {
  auto p = std::make_shared<Pending>();
  p->done = AnswerOk(name(), std::move(done), "write_file");
  agent::Request req;
  *req.mutable_write_file() = write;
  Send(req, std::move(p));
}

void AgentClient::Stat(const std::string& path, Callback<agent::FileInfo> done) {
  auto p = std::make_shared<Pending>();
  p->done = Answer<agent::FileInfo>(name(), std::move(done), [n = name()](Event& ev) -> Result<agent::FileInfo> {
    if (!ev.has_stat()) return Unexpected(n, "stat");
    return std::move(*ev.mutable_stat());
  });
  agent::Request req;
  req.mutable_stat()->set_path(path);
  Send(req, std::move(p));
}

void AgentClient::ListDir(const std::string& path, Callback<std::vector<agent::FileInfo>> done) {
  using List = std::vector<agent::FileInfo>;
  auto p = std::make_shared<Pending>();
  p->done = Answer<List>(name(), std::move(done), [n = name()](Event& ev) -> Result<List> {
    if (!ev.has_dir_list()) return Unexpected(n, "list_dir");
    List out;
    out.reserve(static_cast<size_t>(ev.dir_list().entries_size()));
    for (auto& e : *ev.mutable_dir_list()->mutable_entries()) out.push_back(std::move(e));
    return out;
  });
  agent::Request req;
  req.mutable_list_dir()->set_path(path);
  Send(req, std::move(p));
}

void AgentClient::PathOp(const agent::PathOp& op, Callback<agent::FileInfo> done) {
  auto p = std::make_shared<Pending>();
  p->done = Answer<agent::FileInfo>(name(), std::move(done), [n = name()](Event& ev) -> Result<agent::FileInfo> {
    if (ev.has_ok()) return agent::FileInfo();
    if (!ev.has_stat()) return Unexpected(n, "path_op");
    return std::move(*ev.mutable_stat());
  });
  agent::Request req;
  *req.mutable_path_op() = op;
  Send(req, std::move(p));
}

void AgentClient::Proc(const agent::Proc& proc, Callback<agent::ProcList> done) {
  auto p = std::make_shared<Pending>();
  p->done = Answer<agent::ProcList>(name(), std::move(done), [n = name()](Event& ev) -> Result<agent::ProcList> {
    if (ev.has_ok()) return agent::ProcList();
    if (!ev.has_procs()) return Unexpected(n, "proc");
    return std::move(*ev.mutable_procs());
  });
  agent::Request req;
  *req.mutable_proc() = proc;
  Send(req, std::move(p));
}

void AgentClient::Changes(uint32_t limit, Callback<agent::ChangeList> done) {
  auto p = std::make_shared<Pending>();
  p->done = Answer<agent::ChangeList>(name(), std::move(done), [n = name()](Event& ev) -> Result<agent::ChangeList> {
    if (!ev.has_changes()) return Unexpected(n, "changes");
    return std::move(*ev.mutable_changes());
  });
  agent::Request req;
  req.mutable_changes()->set_limit(limit);
  Send(req, std::move(p));
}

Result<agent::ChangeList> AgentClient::ChangesSync(uint32_t limit, Millis timeout) {
  return Wait<agent::ChangeList>(name(), "changes", timeout,
                                 [&](Callback<agent::ChangeList> cb) { Changes(limit, std::move(cb)); });
}

void AgentClient::Ping(Callback<agent::Pong> done, bool usage) {
  auto p = std::make_shared<Pending>();
  p->done = Answer<agent::Pong>(name(), std::move(done), [n = name()](Event& ev) -> Result<agent::Pong> {
    if (!ev.has_pong()) return Unexpected(n, "ping");
    return std::move(*ev.mutable_pong());
  });
  agent::Request req;
  req.mutable_ping()->set_usage(usage);
  Send(req, std::move(p));
}

// --- blocking wrappers ------------------------------------------------------------

Result<agent::Pong> AgentClient::PingSync(Millis timeout) {
  return Wait<agent::Pong>(name(), "ping", timeout, [this](Callback<agent::Pong> cb) { Ping(std::move(cb)); });
}

Result<run::Outcome> AgentClient::ExecSync(const agent::Exec& req, Millis timeout, OutputCallback on_output) {
  return Wait<run::Outcome>(name(), "exec", timeout, [&](Callback<run::Outcome> cb) {
    Exec(req, std::move(on_output), std::move(cb));
  });
}

Status AgentClient::SignalSync(uint64_t exec_id, int signal, Millis timeout) {
  return WaitStatus(name(), "signal", timeout,
                    [&](StatusCallback cb) { Signal(exec_id, signal, std::move(cb)); });
}

Result<std::string> AgentClient::ReadFileSync(const std::string& path, Millis timeout, uint64_t max_bytes) {
  return Wait<std::string>(name(), "read_file", timeout, [&](Callback<std::string> cb) {
    ReadFile(path, max_bytes, std::move(cb));
  });
}

Status AgentClient::WriteFileSync(const agent::WriteFile& req, Millis timeout) {
  return WaitStatus(name(), "write_file", timeout, [&](StatusCallback cb) { WriteFile(req, std::move(cb)); });
}

Result<agent::FileInfo> AgentClient::StatSync(const std::string& path, Millis timeout) {
  return Wait<agent::FileInfo>(name(), "stat", timeout,
                               [&](Callback<agent::FileInfo> cb) { Stat(path, std::move(cb)); });
}

Result<std::vector<agent::FileInfo>> AgentClient::ListDirSync(const std::string& path, Millis timeout) {
  using List = std::vector<agent::FileInfo>;
  return Wait<List>(name(), "list_dir", timeout, [&](Callback<List> cb) { ListDir(path, std::move(cb)); });
}

}  // namespace dsec::drivers
