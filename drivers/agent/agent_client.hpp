// AgentClient: the host side of the agent protocol (agent.proto), used by
// the container driver inside dsecd and by tests. Plain C++, no CAF. One
// connection to one dsec-agent; every client of the process is served by
// one shared I/O thread (AgentLoop, one epoll set), so thousands of idle
// containers cost one descriptor each and no thread. Requests may be made
// from any thread and answer through callbacks.
//
// Callbacks run on the I/O thread, in the order the agent's events arrive:
// they must not block (they hold up every other agent), and must not call
// the *Sync wrappers (that would wait on the thread that has to deliver the
// answer). When the connection drops, every request in flight fails at once
// with Unavailable, and later requests fail at once too (then the callback
// runs on the caller's thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "drivers/agent/agent.pb.h"
#include "dsec/status.hpp"
#include "runtime/frame.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers {

struct AgentClientOptions {
  // Names the agent in error messages (e.g. "sandbox sb-12"); default: the
  // socket path, or "fd N".
  std::string name;
  // Where notices go that no request waits for: an Error the agent sent for
  // a frame it could not read, events for unknown ids. May be empty.
  std::function<void(const std::string& text)> log;
};

class AgentClient {
 public:
  using OutputCallback = std::function<void(const agent::Output&)>;
  using FsEventsCallback = std::function<void(const agent::FsEvents&)>;
  using StatusCallback = std::function<void(const Status&)>;
  template <class T>
  using Callback = std::function<void(Result<T>)>;

  // Connects to the agent's unix socket.
  static Result<std::unique_ptr<AgentClient>> Connect(const std::string& socket_path,
                                                      AgentClientOptions options = {});
  // Connects to a channel that outlives its host side (the unix socket of a
  // VM's virtio-serial port: QEMU's end) and syncs with the agent on it
  // (channel_sync.hpp), asking again every 250 ms, for up to timeout_ms.
  static Result<std::unique_ptr<AgentClient>> ConnectChannel(const std::string& socket_path, int timeout_ms,
                                                             AgentClientOptions options = {});
  // Serves an already-connected stream fd (socketpair end, virtio-serial socket).
  static Result<std::unique_ptr<AgentClient>> FromFd(UniqueFd fd, AgentClientOptions options = {});
  ~AgentClient();  // Close()
  AgentClient(const AgentClient&) = delete;
  AgentClient& operator=(const AgentClient&) = delete;

  // Runs a command. With req.stream(), output arrives through on_output
  // (may be empty) and its outcome carries none. `done` gets the outcome, or a
  // failure: the agent refused the request (InvalidArgument...), or the
  // connection dropped (Unavailable; the command may still be running).
  // Returns the exec's id for Signal (0 when it failed at once).
  uint64_t Exec(const agent::Exec& req, OutputCallback on_output, Callback<run::Outcome> done);
  // Sends `signal` to the process group of a running exec of this client.
  void Signal(uint64_t exec_id, int signal, StatusCallback done);
  // The file's contents; files above max_bytes (0: 64 MiB) are refused.
  void ReadFile(const std::string& path, uint64_t max_bytes, Callback<std::string> done);
  void WriteFile(const agent::WriteFile& req, StatusCallback done);
  // lstat: a symlink is described, not followed.
  void Stat(const std::string& path, Callback<agent::FileInfo> done);
  // Entries sorted by name, without "." and "..".
  void ListDir(const std::string& path, Callback<std::vector<agent::FileInfo>> done);
  // Make a directory, move or remove a path: the result's lstat (a remove: an empty FileInfo).
  void PathOp(const agent::PathOp& req, Callback<agent::FileInfo> done);
  // The agent's running execs (list: their ProcList; else an empty one).
  void Proc(const agent::Proc& req, Callback<agent::ProcList> done);
  void Ping(Callback<agent::Pong> done, bool usage = false);  // usage: Ping.usage
  // Watches a directory: on_events gets `watching` once it is in place,
  // then the changes; `done` its end (OK once a Signal of the returned id
  // stopped it). Returns the id (0 when it failed at once).
  uint64_t Watch(const agent::Watch& req, FsEventsCallback on_events, StatusCallback done);
  // What a VM guest changed of its image (its writable layer against its
  // lower ones), at most `limit` changes.
  void Changes(uint32_t limit, Callback<agent::ChangeList> done);

  // Blocking wrappers, for start-up and tests. A timeout gives
  // DeadlineExceeded; the request itself is not cancelled.
  using Millis = std::chrono::milliseconds;
  Result<agent::Pong> PingSync(Millis timeout);
  Result<run::Outcome> ExecSync(const agent::Exec& req, Millis timeout, OutputCallback on_output = {});
  Status SignalSync(uint64_t exec_id, int signal, Millis timeout);
  Result<std::string> ReadFileSync(const std::string& path, Millis timeout, uint64_t max_bytes = 0);
  Status WriteFileSync(const agent::WriteFile& req, Millis timeout);
  Result<agent::FileInfo> StatSync(const std::string& path, Millis timeout);
  Result<std::vector<agent::FileInfo>> ListDirSync(const std::string& path, Millis timeout);
  Result<agent::ChangeList> ChangesSync(uint32_t limit, Millis timeout);

  // False once the connection dropped or Close() was called.
  bool connected() const { return !closed_.load(); }
  const std::string& name() const { return opts_.name; }
  // Closes the connection and fails what is in flight with Unavailable,
  // saying `why`. Idempotent. From a callback it only marks the connection
  // to be closed once the callback returns; the destructor must not run on
  // the I/O thread.
  void Close(const std::string& why = "connection closed by this client");

 private:
  friend class AgentLoop;
  // What waits for the answer to one request.
  struct Pending {
    OutputCallback on_output;                    // Exec only
    FsEventsCallback on_fs_events;               // Watch only
    std::function<void(Result<agent::Event>)> done;  // the final event (or failure)
  };

  AgentClient(UniqueFd fd, AgentClientOptions options);
  // Registers `p` under a fresh id, frames the request, wakes the I/O thread.
  // Fails `p` at once (returns 0) when closed or the request is too large.
  uint64_t Send(agent::Request& req, std::shared_ptr<Pending> p);
  // On the I/O thread: writes what is queued (false and *why when the
  // connection broke), reads what arrived and answers it.
  bool Flush(std::string* why);
  bool Readable(std::string* why);
  void OnFrame(const std::string& frame);
  void FailAll(const std::string& why);

  AgentClientOptions opts_;
  UniqueFd fd_;
  std::atomic<uint64_t> loop_id_{0};  // its key in the loop; 0 once removed
  // I/O state, touched by the I/O thread only.
  std::string out_;
  size_t off_ = 0;
  uint32_t interest_ = 0;
  bool is_socket_ = true;
  FrameDecoder dec_;
  std::mutex mu_;  // guards pending_, outbox_, close_reason_
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;
  std::string outbox_;
  std::string close_reason_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> closed_{false}, stopping_{false};
  std::string stop_reason_;  // Close's why, from a callback (the I/O thread's only)
  std::mutex close_mu_;  // serialises Close()
};

// The I/O thread shared by every AgentClient of the process.
class AgentLoop {
 public:
  static AgentLoop& Shared();
  ~AgentLoop();
  // Serves `c` from now on; its id in *id.
  Status Add(AgentClient* c, uint64_t* id);
  // After this returns the loop never touches `c` again. On the loop thread
  // (from a callback) it only asks for that after the callback.
  void Remove(AgentClient* c);
  // `c` has output queued.
  void Wake(AgentClient* c);
  bool OnLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  AgentLoop();
  void Run();
  void Drop(uint64_t id, AgentClient* c, const std::string& why);  // under busy_

  UniqueFd epoll_, wake_;
  std::thread thread_;
  std::mutex busy_;  // held while the loop works on clients; guards clients_
  std::unordered_map<uint64_t, AgentClient*> clients_;
  uint64_t next_id_ = 1;
  std::mutex dirty_mu_;
  std::vector<uint64_t> dirty_;  // clients with output queued
  std::atomic<bool> stop_{false};
};

}  // namespace dsec::drivers
