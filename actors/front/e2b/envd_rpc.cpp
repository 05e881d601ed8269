// envd's Connect services, as E2B's SDK calls them (docs/e2b.md): the
// Connect protocol with JSON. A unary call is a JSON body answered by one
// (errors: the HTTP status of the Connect code, {"code", "message"}); a
// server stream is one request envelope ([flags][u32 big-endian length]
// [JSON]) answered by 200 and envelopes, the last one flagged 0x02
// (end of stream) carrying {} or {"error": {...}}. Each call becomes calls
// of the table (wire/calls.hpp) to the entry actor; a process's stream is an
// actor of its own that passes the exec's pieces on as they come.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <map>

#include "actors/front/e2b/door_internal.hpp"
#include "dsec/status_proto.hpp"

namespace dsec::e2b {

namespace {

using nlohmann::json;

// The user of "Authorization: Basic base64(user:)", or "".
std::string BasicUser(const HttpRequest& req) {
  const std::string* auth = req.Header("authorization");
  if (!auth || auth->rfind("Basic ", 0) != 0 || auth->size() > 1024) return "";
  std::string raw;
  if (!Unbase64(auth->substr(6), &raw)) return "";
  raw.resize(std::min(raw.find(':'), raw.find('\0')));
  return raw;
}



// One Connect call: how it answers (unary or as a stream), and the asks it
// makes of dsec.
class Rpc : public std::enable_shared_from_this<Rpc> {
 public:
  Rpc(caf::event_based_actor* self, entry_actor entry, Call c, std::string sandbox, bool streaming)
      : self_(self), entry_(std::move(entry)), c_(std::move(c)), sandbox_(std::move(sandbox)), streaming_(streaming) {
    user_ = EnvdUser(BasicUser(c_.req));
  }

  const std::string& user() const { return user_; }
  const std::string& sandbox() const { return sandbox_; }
  const HttpRequest& req() const { return c_.req; }
  const std::shared_ptr<HttpResponder>& reply() const { return c_.reply; }

  // The first answer counts; later ones (another ask of a walk failing) are dropped.
  void Fail(const Status& s) {
    if (answered_) return;
    answered_ = true;
    if (!streaming_) return c_.reply->Send(ConnectHttp(s.code()), kJson, ErrorJson(s).dump());
    if (!begun_) Begin();
    c_.reply->Write(Envelope(2, json{{"error", ErrorJson(s)}}.dump()));
    c_.reply->End();
  }
  void Answer(const json& msg) {
    if (answered_) return;
    answered_ = true;
    c_.reply->Send(200, kJson, msg.dump());
  }
  // A stream's end without error.
  void EndStream() {
    if (answered_) return;
    answered_ = true;
    if (!begun_) Begin();
    c_.reply->Write(Envelope(2, "{}"));
    c_.reply->End();
  }
  bool begun() const { return begun_; }
  void Begin() {
    begun_ = true;
    c_.reply->Begin(200, "application/connect+json");
  }

  // Asks dsec; a failed status (or none) fails the call here, unless
  // `fine` takes it (then `ok` gets the reply).
  template <class Reply, class Req>
  void Ask(Req req, std::function<void(Reply&)> ok, std::function<bool(const Status&)> fine = nullptr) {
    auto me = shared_from_this();
    self_->request(entry_, kCallTimeout, std::move(req))
        .then(
            [me, ok, fine](Reply& r) {
              Status s = FromProto(r.status());
              if (!s.ok() && !(fine && fine(s))) return me->Fail(s);
              ok(r);
            },
            [me](caf::error& e) { me->Fail(Status::Unavailable("dsec did not answer: " + caf::to_string(e))); });
  }

  void ListFiles(const std::string& path, std::function<void(v1::FileReply&)> ok) {
    v1::ListFilesRequest req;
    req.set_sandbox_id(sandbox_);
    req.set_path(path);
    Ask<v1::FileReply>(std::move(req), std::move(ok));
  }

  void PathOp(v1::PathOp op, const std::string& path, const std::string& dest, std::function<void(v1::FileReply&)> ok,
              std::function<bool(const Status&)> fine = nullptr) {
    v1::PathOpRequest req;
    req.set_sandbox_id(sandbox_);
    req.set_op(op);
    req.set_path(path);
    req.set_destination(dest);
    req.set_user(user_);
    Ask<v1::FileReply>(std::move(req), std::move(ok), std::move(fine));
  }

  caf::event_based_actor* self() const { return self_; }
  const entry_actor& entry() const { return entry_; }

 private:
  caf::event_based_actor* self_;
  entry_actor entry_;
  Call c_;
  std::string sandbox_;
  std::string user_;
  bool streaming_;
  bool begun_ = false;
  bool answered_ = false;
};

// A string field of a message, or "" (a wrong type: false).
bool StringField(const json& msg, const char* name, std::string* out) {
  auto it = msg.find(name);
  if (it == msg.end() || it->is_null()) return true;
  if (!it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

// ListDir to a depth: each directory's entries, listed one call at a time,
// then put in walk order (a directory, then what it holds).
class DirWalk : public std::enable_shared_from_this<DirWalk> {
 public:
  static constexpr size_t kMaxEntries = 100'000;
  DirWalk(std::shared_ptr<Rpc> rpc, uint32_t depth) : rpc_(std::move(rpc)), depth_(depth) {}

  void Start(const std::string& root) {
    auto me = shared_from_this();
    rpc_->ListFiles(root, [me, root](v1::FileReply& r) {
      if (!S_ISDIR(r.info().mode()))
        return me->rpc_->Fail(Status::InvalidArgument("path is not a directory: " + root));
      me->Take(root, 1, r);
      me->Done();
    });
  }

 private:
  void Take(const std::string& dir, uint32_t level, v1::FileReply& r) {
    auto& mine = listed_[dir];
    for (const auto& e : r.entries()) {
      mine.push_back(e);
      if (++count_ > kMaxEntries) failed_ = true;
      if (level < depth_ && S_ISDIR(e.mode())) List(Join(dir, e.name()), level + 1);
    }
  }
  void List(const std::string& dir, uint32_t level) {
    ++pending_;
    auto me = shared_from_this();
    rpc_->ListFiles(dir, [me, dir, level](v1::FileReply& r) {
      me->Take(dir, level, r);
      --me->pending_;
      me->Done();
    });
  }
  void Done() {
    if (pending_ || answered_) return;
    answered_ = true;
    if (failed_)
      return rpc_->Fail(Status::ResourceExhausted("more than " + std::to_string(kMaxEntries) +
                                                  " entries; list with a smaller depth"));
    json entries = json::array();
    Emit(listed_.begin()->first, &entries);
    rpc_->Answer({{"entries", entries}});
  }
  void Emit(const std::string& dir, json* out) {
    for (const auto& e : listed_[dir]) {
      std::string path = Join(dir, e.name());
      out->push_back(Entry(e, path));
      if (S_ISDIR(e.mode()) && listed_.count(path)) Emit(path, out);
    }
  }

  std::shared_ptr<Rpc> rpc_;
  uint32_t depth_;
  std::map<std::string, std::vector<v1::FileInfo>> listed_;
  size_t pending_ = 0, count_ = 0;
  bool failed_ = false, answered_ = false;
};

void WatchDir(const std::shared_ptr<Rpc>& rpc, const std::string& path, bool recursive, bool include_entry);

void Filesystem(const std::shared_ptr<Rpc>& rpc, const std::string& method, const json& msg) {
  std::string path, dest;
  if (method == "CreateWatcher" || method == "GetWatcherEvents" || method == "RemoveWatcher") {
    if (!StringField(msg, "path", &path)) return rpc->Fail(Status::InvalidArgument("path is a string"));
    if (method == "CreateWatcher" && path.empty()) return rpc->Fail(Status::InvalidArgument("path is required"));
    ServeWatchers(rpc->self(), rpc->entry(), rpc->sandbox(), method, msg, EnvdPath(path, rpc->user()),
                  [rpc](Result<json> r) { r.ok() ? rpc->Answer(*r) : rpc->Fail(r.status()); });
    return;
  }
  if (!StringField(msg, "path", &path) || !StringField(msg, "source", &path) ||
      !StringField(msg, "destination", &dest))
    return rpc->Fail(Status::InvalidArgument("path, source and destination are strings"));
  if (method != "Move" && path.empty() && !msg.contains("path"))
    return rpc->Fail(Status::InvalidArgument("path is required"));
  path = EnvdPath(path, rpc->user());
  if (method == "Stat") {
    return rpc->ListFiles(path, [rpc, path](v1::FileReply& r) { rpc->Answer({{"entry", Entry(r.info(), path)}}); });
  }
  if (method == "ListDir") {
    uint32_t depth = 1;
    if (auto it = msg.find("depth"); it != msg.end() && !it->is_null()) {
      if (!it->is_number_unsigned()) return rpc->Fail(Status::InvalidArgument("depth is a whole number"));
      depth = std::max<uint32_t>(1, it->get<uint32_t>());
    }
    auto walk = std::make_shared<DirWalk>(rpc, std::min<uint32_t>(depth, 64));
    return walk->Start(path);
  }
  if (method == "MakeDir") {
    return rpc->PathOp(v1::PATH_OP_MAKE_DIR, path, "",
                       [rpc, path](v1::FileReply& r) { rpc->Answer({{"entry", Entry(r.info(), path)}}); });
  }
  if (method == "Move") {
    if (dest.empty()) return rpc->Fail(Status::InvalidArgument("source and destination are required"));
    dest = EnvdPath(dest, rpc->user());
    return rpc->PathOp(v1::PATH_OP_MOVE, path, dest,
                       [rpc, dest](v1::FileReply& r) { rpc->Answer({{"entry", Entry(r.info(), dest)}}); });
  }
  if (method == "Remove") {  // as envd's: a path that is not there is removed already
    return rpc->PathOp(
        v1::PATH_OP_REMOVE, path, "", [rpc](v1::FileReply&) { rpc->Answer(json::object()); },
        [](const Status& s) { return s.code() == Status::Code::kNotFound; });
  }
  if (method == "WatchDir")
    return WatchDir(rpc, path, msg.contains("recursive") && msg["recursive"] == true,
                    msg.contains("includeEntry") && msg["includeEntry"] == true);
  rpc->Fail(Status::Unimplemented("filesystem." + method.substr(0, 64) +
                                  " is not served by this dsec yet (docs/e2b.md lists what is)"));
}

// Each stream's id (its pieces carry it).
std::atomic<uint64_t> next_stream{1};

// The name of a signal as Go's ProcessState.String() gives it.
std::string SignalName(int sig) {
  switch (sig) {
    case SIGKILL: return "killed";
    case SIGTERM: return "terminated";
    case SIGINT: return "interrupt";
    case SIGSEGV: return "segmentation fault";
    case SIGABRT: return "aborted";
    case SIGPIPE: return "broken pipe";
    default: return "signal " + std::to_string(sig);
  }
}

// A message's pty.size object, or nullptr.
const json* PtySize(const json& msg) {
  auto pty = msg.find("pty");
  if (pty == msg.end() || !pty->is_object()) return nullptr;
  auto size = pty->find("size");
  return size != pty->end() && size->is_object() ? &*size : nullptr;
}

// A terminal dimension (0: the agent's default; at most 10 000).
uint32_t Dim(const json& size, const char* key) {
  auto it = size.find(key);
  if (it == size.end() || !it->is_number_unsigned()) return 0;
  return static_cast<uint32_t>(std::min<uint64_t>(it->get<uint64_t>(), 10000));
}

struct Tick {};

}  // namespace
}  // namespace dsec::e2b

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::e2b::Tick)

namespace dsec::e2b {
namespace {

// What a streamed call's actor shares: `send` writes one message (in a
// ProcessEvent's "event" when `wrapped`); a piece the client cannot take
// (gone, or max_buffered waiting) cuts the stream without an end message
// and ends the actor. Keepalives at the client's Keepalive-Ping-Interval
// (at most 50 s), once the stream has begun.
struct Streamer {
  Streamer(std::shared_ptr<Rpc> r, caf::event_based_actor* s, bool wrapped) : rpc(std::move(r)), self(s) {
    auto reply = rpc->reply();
    auto* me = self;
    auto gone = cut;
    send = [reply, gone, me, wrapped](const json& ev) {
      if (*gone) return;
      if (!reply->Write(Envelope(0, (wrapped ? json{{"event", ev}} : ev).dump()))) {
        *gone = true;
        reply->End();
        me->quit();
      }
    };
    if (const std::string* k = rpc->req().Header("keepalive-ping-interval"))
      keepalive_s = std::clamp(std::atoi(k->c_str()), 1, 50);
  }
  // dsec not answering the call fails it.
  std::function<void(caf::error&)> Unanswered() const {
    return [rpc = rpc, me = self](caf::error& e) {
      rpc->Fail(Status::Unavailable("dsec did not answer: " + caf::to_string(e)));
      me->quit();
    };
  }
  void Keepalives() const { self->delayed_send(self, std::chrono::seconds(keepalive_s), Tick{}); }
  // Each tick also asks whether the sandbox is still there: a stream whose
  // node died (through a controller's door) would otherwise wait forever.
  // Gone, or its node down, the stream is cut as a killed sandbox's is.
  std::function<void(Tick)> OnTick() const {
    return [send = send, rpc = rpc, me = self, s = keepalive_s, gone = cut](Tick) {
      if (rpc->begun()) send({{"keepalive", json::object()}});
      v1::GetSandboxRequest get;
      get.set_sandbox_id(rpc->sandbox());
      me->request(rpc->entry(), std::chrono::seconds(30), std::move(get))
          .then(
              [rpc, me, gone](v1::SandboxReply& r) {
                Status s = FromProto(r.status());
                if (*gone || (s.code() != Status::Code::kNotFound && s.code() != Status::Code::kUnavailable)) return;
                *gone = true;
                if (rpc->begun()) rpc->reply()->Abort();  // cut, as E2B's proxy cuts a killed sandbox's
                else rpc->Fail(s);
                me->quit();
              },
              [](caf::error&) {});  // slow to answer is not gone
      me->delayed_send(me, std::chrono::seconds(s), Tick{});
    };
  }

  std::shared_ptr<Rpc> rpc;
  caf::event_based_actor* self;
  std::shared_ptr<bool> cut = std::make_shared<bool>(false);
  std::function<void(const json&)> send;
  int keepalive_s = 50;
};

void StreamExec(const std::shared_ptr<Rpc>& rpc, v1::ExecRequest req, bool keep_stdin);
uint32_t SelectedPid(const std::shared_ptr<Rpc>& rpc, const json& msg);

// process.Start: the command as an exec streamed to an actor of its own,
// which writes each piece as a data event as it comes (keepalives while
// it is quiet) and the end event when it ends. A client that stops
// reading is cut off once max_buffered bytes wait for it (no end message).
void Start(const std::shared_ptr<Rpc>& rpc, const json& msg) {
  const json* process = msg.contains("process") && msg["process"].is_object() ? &msg["process"] : nullptr;
  if (!process || !(*process).contains("cmd") || !(*process)["cmd"].is_string())
    return rpc->Fail(Status::InvalidArgument("process.cmd is required"));
  v1::ExecRequest req;
  if (msg.contains("pty") && !msg["pty"].is_null()) {  // a terminal (the SDK's pty.create)
    const json* size = PtySize(msg);
    if (!size) return rpc->Fail(Status::InvalidArgument("pty.size {cols, rows} is required"));
    req.mutable_pty()->set_cols(Dim(*size, "cols"));
    req.mutable_pty()->set_rows(Dim(*size, "rows"));
  }
  req.set_sandbox_id(rpc->sandbox());
  req.add_argv((*process)["cmd"].get<std::string>());
  if (auto it = process->find("args"); it != process->end() && !it->is_null()) {
    if (!it->is_array()) return rpc->Fail(Status::InvalidArgument("process.args is a list of strings"));
    for (const auto& a : *it) {
      if (!a.is_string()) return rpc->Fail(Status::InvalidArgument("process.args is a list of strings"));
      req.add_argv(a.get<std::string>());
    }
  }
  if (auto it = process->find("envs"); it != process->end() && !it->is_null()) {
    if (!it->is_object()) return rpc->Fail(Status::InvalidArgument("process.envs is an object of strings"));
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string()) return rpc->Fail(Status::InvalidArgument("process.envs." + k + " is not a string"));
      (*req.mutable_env())[k] = v.get<std::string>();
    }
  }
  std::string cwd;
  if (!StringField(*process, "cwd", &cwd)) return rpc->Fail(Status::InvalidArgument("process.cwd is a string"));
  req.set_cwd(EnvdPath(cwd, rpc->user()));
  req.set_user(rpc->user());
  req.set_stream(true);
  // Interactive, for its pid (the start event) and for SendInput and
  // CloseStdin by it; envd's stdin is open unless the request says false
  // (absent: open, as envd defaults): then it is closed at once.
  req.set_interactive(true);
  bool keep_stdin = !msg.contains("stdin") || msg["stdin"] != false;
  StreamExec(rpc, std::move(req), keep_stdin);
}

// The longest exec timeout a node allows (drivers/limits.cpp's maxima).
constexpr uint64_t kLongestExecMs = 24ull * 3600 * 1000;

// The call's Connect-Timeout-Ms (0: none).
uint64_t TimeoutMs(const std::shared_ptr<Rpc>& rpc) {
  const std::string* t = rpc->req().Header("connect-timeout-ms");
  if (!t) return 0;
  char* end = nullptr;
  unsigned long long ms = std::strtoull(t->c_str(), &end, 10);
  return !t->empty() && !*end ? ms : 0;
}

// A streamed exec (Start) or an attachment to one (Connect) as envd's
// stream of ProcessEvents: start (the pid), data, keepalives, end.
void StreamExec(const std::shared_ptr<Rpc>& rpc, v1::ExecRequest req, bool keep_stdin) {
  // A command's timeout: none (the SDK's timeoutMs 0) is the longest a node
  // allows, not dsec's 30 s default. An attachment's: none is none.
  uint64_t ms = TimeoutMs(rpc);
  if (ms || !req.attach_pid()) req.mutable_limits()->set_timeout_ms(ms ? ms : kLongestExecMs);
  req.set_stream_id(next_stream++);
  rpc->self()->spawn([rpc, req, keep_stdin](caf::event_based_actor* self) mutable -> caf::behavior {
    rpc->Begin();
    Streamer stream(rpc, self, true);  // the command runs on when the stream is cut
    auto send = stream.send;
    auto cut = stream.cut;
    self->request(rpc->entry(), caf::infinite, std::move(req))
        .then(
            [rpc, send, cut, self](v1::ExecReply& r) {
              if (*cut) return self->quit();
              Status s = FromProto(r.status());
              const v1::ExecResult& res = r.result();
              if (s.ok() && res.verdict() == v1::VERDICT_TIME_LIMIT)
                s = Status::DeadlineExceeded("the command ran past the call's timeout and was killed");
              if (!s.ok()) {
                rpc->Fail(s);
                return self->quit();
              }
              json end = {{"exitCode", res.signal() ? -1 : res.exit_code()},
                          {"exited", res.signal() == 0},
                          {"status", res.signal() ? "signal: " + SignalName(res.signal())
                                                  : "exit status " + std::to_string(res.exit_code())}};
              // envd's error: what Go's Wait said ("exit status 3"), or dsec's reason (a limit).
              if (!res.error().empty() && res.verdict() != v1::VERDICT_OK) end["error"] = res.error();
              else if (res.signal() || res.exit_code()) end["error"] = end["status"];
              auto finish = [rpc, send, cut, self, end] {
                send({{"end", end}});
                if (!*cut) rpc->EndStream();
                self->quit();
              };
              if (!res.signal()) return finish();
              // Killed: with its sandbox (killed, paused), the stream is cut
              // without an end, as E2B's proxy cuts it (the SDK then asks
              // /health and says the sandbox is gone).
              v1::GetSandboxRequest get;
              get.set_sandbox_id(rpc->sandbox());
              self->request(rpc->entry(), kCallTimeout, std::move(get))
                  .then(
                      [rpc, finish, self](v1::SandboxReply& sb) {
                        auto phase = sb.sandbox().phase();
                        if (FromProto(sb.status()).ok() && phase == v1::SANDBOX_PHASE_RUNNING) return finish();
                        rpc->reply()->Abort();
                        self->quit();
                      },
                      [finish](caf::error&) { finish(); });
            },
            stream.Unanswered());
    stream.Keepalives();
    return {
        [send, self, rpc, keep_stdin](v1::ExecOutput& out) {
          if (out.pid()) {  // the first piece: the process's own pid
            send({{"start", {{"pid", out.pid()}}}});
            if (!keep_stdin) {
              v1::ProcessRequest close;
              close.set_sandbox_id(rpc->sandbox());
              close.set_op(v1::PROCESS_OP_CLOSE_STDIN);
              close.set_pid(out.pid());
              self->request(rpc->entry(), kCallTimeout, std::move(close))
                  .then([](v1::ProcessReply&) {}, [](caf::error&) {});  // gone meanwhile: nothing to close
            }
          }
          if (!out.stdout().empty()) send({{"data", {{"stdout", Base64(out.stdout())}}}});
          if (!out.stderr().empty()) send({{"data", {{"stderr", Base64(out.stderr())}}}});
          if (!out.pty().empty()) send({{"data", {{"pty", Base64(out.pty())}}}});
        },
        stream.OnTick(),
    };
  });
}

// filesystem.WatchDir: a dsec watch streamed to an actor of its own: the
// start event once it is in place, then each change, keepalives while it
// is quiet; its end (Connect-Timeout-Ms, or the directory removed) ends
// the stream. A client that leaves ends the actor, and so the watch (the
// sandbox watches its caller). With include_entry, each event's entry.
void WatchDir(const std::shared_ptr<Rpc>& rpc, const std::string& path, bool recursive, bool include_entry) {
  v1::WatchRequest req;
  req.set_sandbox_id(rpc->sandbox());
  req.set_path(path);
  req.set_recursive(recursive);
  req.set_timeout_ms(TimeoutMs(rpc));
  req.set_stream_id(next_stream++);
  rpc->self()->spawn([rpc, req, include_entry](caf::event_based_actor* self) mutable -> caf::behavior {
    Streamer stream(rpc, self, false);  // WatchDirResponse: the oneof's field itself
    auto send = stream.send;
    auto cut = stream.cut;
    auto events = WatchEvents(self, rpc->entry(), rpc->sandbox(), req.path(), include_entry,
                              [send](json e) { send({{"filesystem", std::move(e)}}); });
    self->request(rpc->entry(), caf::infinite, req)
        .then(
            [rpc, cut, self, events](v1::WatchReply& r) {
              if (*cut) return self->quit();
              Status s = FromProto(r.status());
              events.finish([rpc, self, s] {  // the events before its end go out first
                if (s.ok()) rpc->EndStream();
                else rpc->Fail(s);
                self->quit();
              });
            },
            stream.Unanswered());
    stream.Keepalives();
    return {
        [send, rpc, events](v1::ExecOutput& piece) {
          if (piece.watching()) {  // the stream begins once the watch is in place: an error before is unary-like
            rpc->Begin();
            send({{"start", json::object()}});
          }
          events.add(piece);
        },
        stream.OnTick(),
    };
  });
}

// A process Start began (commands.connect): its events from now on.
void Connect(const std::shared_ptr<Rpc>& rpc, const json& msg) {
  uint32_t pid = SelectedPid(rpc, msg);
  if (!pid) return;
  v1::ExecRequest req;
  req.set_sandbox_id(rpc->sandbox());
  req.set_attach_pid(pid);
  req.set_stream(true);
  StreamExec(rpc, std::move(req), true);
}

// The pid of a ProcessSelector ({"pid": N}), or 0 with the call failed.
uint32_t SelectedPid(const std::shared_ptr<Rpc>& rpc, const json& msg) {
  auto p = msg.find("process");
  if (p != msg.end() && p->is_object()) {
    if (auto pid = p->find("pid"); pid != p->end() && pid->is_number_unsigned() && pid->get<uint64_t>() > 0 &&
                                   pid->get<uint64_t>() < (1u << 31))
      return pid->get<uint32_t>();
    if (p->contains("tag")) {
      rpc->Fail(Status::InvalidArgument("processes are selected by pid here, not by tag"));
      return 0;
    }
  }
  rpc->Fail(Status::InvalidArgument("process.pid is required"));
  return 0;
}

void Process(const std::shared_ptr<Rpc>& rpc, const std::string& method, const json& msg) {
  if (method == "Start") return Start(rpc, msg);
  if (method == "Connect") return Connect(rpc, msg);
  v1::ProcessRequest req;
  req.set_sandbox_id(rpc->sandbox());
  if (method == "List") {
    req.set_op(v1::PROCESS_OP_LIST);
    return rpc->Ask<v1::ProcessReply>(std::move(req), [rpc](v1::ProcessReply& r) {
      json procs = json::array();
      for (const auto& p : r.processes()) {
        json args = json::array();
        for (int i = 1; i < p.argv_size(); ++i) args.push_back(p.argv(i));
        procs.push_back({{"config", {{"cmd", p.argv_size() ? p.argv(0) : ""}, {"args", args}, {"envs", json::object()},
                                     {"cwd", p.cwd()}}},
                         {"pid", p.pid()}});
      }
      rpc->Answer({{"processes", procs}});
    });
  }
  if (method == "SendSignal") {
    uint32_t pid = SelectedPid(rpc, msg);
    if (!pid) return;
    int sig = 0;
    auto s = msg.find("signal");
    if (s != msg.end() && s->is_string()) sig = *s == "SIGNAL_SIGKILL" ? SIGKILL : *s == "SIGNAL_SIGTERM" ? SIGTERM : 0;
    if (s != msg.end() && s->is_number_integer()) sig = s->get<int>() == 9 || s->get<int>() == 15 ? s->get<int>() : 0;
    if (!sig) return rpc->Fail(Status::InvalidArgument("signal: SIGNAL_SIGKILL or SIGNAL_SIGTERM"));
    req.set_op(v1::PROCESS_OP_SIGNAL);
    req.set_pid(pid);
    req.set_signal(sig);
    return rpc->Ask<v1::ProcessReply>(std::move(req), [rpc](v1::ProcessReply&) { rpc->Answer(json::object()); });
  }
  if (method == "SendInput" || method == "CloseStdin") {
    uint32_t pid = SelectedPid(rpc, msg);
    if (!pid) return;
    req.set_pid(pid);
    req.set_op(method == "CloseStdin" ? v1::PROCESS_OP_CLOSE_STDIN : v1::PROCESS_OP_INPUT);
    if (method == "SendInput") {
      // input.stdin or input.pty: both are the process's input (a terminal's is its master)
      auto in = msg.find("input");
      bool ok = in != msg.end() && in->is_object();
      auto data = ok ? in->find("stdin") : msg.end();
      if (ok && data == in->end()) data = in->find("pty");
      if (!ok || data == in->end() || !data->is_string())
        return rpc->Fail(Status::InvalidArgument("input.stdin or input.pty (base64) is required"));
      std::string raw;
      if (!Unbase64(data->get<std::string>(), &raw)) return rpc->Fail(Status::InvalidArgument("input.stdin is not base64"));
      req.set_input(std::move(raw));
    }
    return rpc->Ask<v1::ProcessReply>(std::move(req), [rpc](v1::ProcessReply&) { rpc->Answer(json::object()); });
  }
  if (method == "Update") {  // a terminal's new size
    uint32_t pid = SelectedPid(rpc, msg);
    if (!pid) return;
    const json* size = PtySize(msg);
    if (!size) return rpc->Fail(Status::InvalidArgument("pty.size {cols, rows} is required"));
    req.set_op(v1::PROCESS_OP_RESIZE);
    req.set_pid(pid);
    req.mutable_size()->set_cols(Dim(*size, "cols"));
    req.mutable_size()->set_rows(Dim(*size, "rows"));
    return rpc->Ask<v1::ProcessReply>(std::move(req), [rpc](v1::ProcessReply&) { rpc->Answer(json::object()); });
  }
  rpc->Fail(Status::Unimplemented("process." + method.substr(0, 64) +
                                  " is not served by this dsec yet (docs/e2b.md lists what is)"));
}

}  // namespace

void ServeEnvdRpc(caf::event_based_actor* self, const entry_actor& entry, Call& c, const std::string& sandbox) {
  const std::string& p = c.req.path;
  size_t slash = p.find('/', 1);
  std::string service = p.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
  std::string method = slash == std::string::npos ? "" : p.substr(slash + 1);
  const std::string* type = c.req.Header("content-type");
  std::string ct = type ? type->substr(0, type->find(';')) : "";
  bool streaming = ct == "application/connect+json";
  auto rpc = std::make_shared<Rpc>(self, entry, std::move(c), sandbox, streaming);
  if (!streaming && ct != "application/json")
    return rpc->reply()->Send(415, kJson,
                              ErrorJson(Status::InvalidArgument("Content-Type " + ct.substr(0, 64) +
                                                                ": this door speaks Connect with JSON "
                                                                "(application/json, application/connect+json)"))
                                  .dump());
  std::string body = rpc->req().body;
  if (streaming) {  // one envelope holding the request
    if (body.size() < 5) return rpc->Fail(Status::InvalidArgument("the request envelope is truncated"));
    uint8_t flags = static_cast<uint8_t>(body[0]);
    uint32_t n = 0;
    for (int i = 1; i <= 4; ++i) n = (n << 8) | static_cast<uint8_t>(body[i]);
    if (flags & 1) return rpc->Fail(Status::InvalidArgument("compressed envelopes are not accepted"));
    if (n != body.size() - 5)
      return rpc->Fail(Status::InvalidArgument("the request envelope says " + std::to_string(n) + " bytes; " +
                                               std::to_string(body.size() - 5) + " came"));
    body = body.substr(5);
  }
  json msg = body.empty() ? json::object() : json::parse(body, nullptr, false);
  if (!msg.is_object()) return rpc->Fail(Status::InvalidArgument("the request message is not a JSON object"));
  bool stream_method = (service == "process.Process" && (method == "Start" || method == "Connect")) ||
                       (service == "filesystem.Filesystem" && method == "WatchDir");
  if (stream_method != streaming)
    return rpc->Fail(Status::InvalidArgument(service + "/" + method.substr(0, 64) + " is " +
                                             (stream_method ? "a server stream (application/connect+json)"
                                                            : "unary (application/json)")));
  if (service == "filesystem.Filesystem") return Filesystem(rpc, method, msg);
  if (service == "process.Process") return Process(rpc, method, msg);
  rpc->Fail(Status::Unimplemented("no service " + service.substr(0, 64) + " (filesystem.Filesystem, process.Process)"));
}

}  // namespace dsec::e2b
