// AgentClient: the host side of the agent protocol (agent.proto), used by
// the container driver inside dsecd and by tests. Plain C++, no CAF. One
// connection to one dsec-agent, served by one I/O thread; requests may be
// made from any thread and answer through callbacks.
//
// Callbacks run on the I/O thread, in the order the agent's events arrive:
// they must not block, and must not call the *Sync wrappers (that would wait
// on the thread that has to deliver the answer). When the connection drops,
// every request in flight fails at once with Unavailable, and later requests
// fail at once too (then the callback runs on the caller's thread).
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
  using StatusCallback = std::function<void(const Status&)>;
  template <class T>
  using Callback = std::function<void(Result<T>)>;

  // Connects to the agent's unix socket.
  static Result<std::unique_ptr<AgentClient>> Connect(const std::string& socket_path,
                                                      AgentClientOptions options = {});
  // Serves an already-connected stream fd (socketpair end, virtio-serial socket).
  static Result<std::unique_ptr<AgentClient>> FromFd(UniqueFd fd, AgentClientOptions options = {});
  ~AgentClient();  // Close()
  AgentClient(const AgentClient&) = delete;
  AgentClient& operator=(const AgentClient&) = delete;

  // Runs a command. With req.stream(), output arrives through on_output
  // (may be empty) and ExecDone carries none. `done` gets the ExecDone, or a
  // failure: the agent refused the request (InvalidArgument...), or the
  // connection dropped (Unavailable; the command may still be running).
  // Returns the exec's id for Signal (0 when it failed at once).
  uint64_t Exec(const agent::Exec& req, OutputCallback on_output, Callback<agent::ExecDone> done);
  // Sends `signal` to the process group of a running exec of this client.
  void Signal(uint64_t exec_id, int signal, StatusCallback done);
  // The file's contents; files above max_bytes (0: 64 MiB) are refused.
  void ReadFile(const std::string& path, uint64_t max_bytes, Callback<std::string> done);
  void WriteFile(const agent::WriteFile& req, StatusCallback done);
  // lstat: a symlink is described, not followed.
  void Stat(const std::string& path, Callback<agent::FileInfo> done);
  // Entries sorted by name, without "." and "..".
  void ListDir(const std::string& path, Callback<std::vector<agent::FileInfo>> done);
  void Ping(Callback<agent::Pong> done);

  // Blocking wrappers, for start-up and tests. A timeout gives
  // DeadlineExceeded; the request itself is not cancelled.
  using Millis = std::chrono::milliseconds;
  Result<agent::Pong> PingSync(Millis timeout);
  Result<agent::ExecDone> ExecSync(const agent::Exec& req, Millis timeout, OutputCallback on_output = {});
  Status SignalSync(uint64_t exec_id, int signal, Millis timeout);
  Result<std::string> ReadFileSync(const std::string& path, Millis timeout, uint64_t max_bytes = 0);
  Status WriteFileSync(const agent::WriteFile& req, Millis timeout);
  Result<agent::FileInfo> StatSync(const std::string& path, Millis timeout);
  Result<std::vector<agent::FileInfo>> ListDirSync(const std::string& path, Millis timeout);

  // False once the connection dropped or Close() was called.
  bool connected() const { return !closed_.load(); }
  const std::string& name() const { return opts_.name; }
  // Closes the connection, fails what is in flight with Unavailable, stops
  // the I/O thread. Idempotent. From a callback it only asks the I/O thread
  // to stop; the destructor must not run on the I/O thread.
  void Close();

 private:
  // What waits for the answer to one request.
  struct Pending {
    OutputCallback on_output;                    // Exec only
    std::function<void(Result<agent::Event>)> done;  // the final event (or failure)
  };

  AgentClient(UniqueFd fd, AgentClientOptions options);
  // Registers `p` under a fresh id, frames the request, wakes the I/O thread.
  // Fails `p` at once (returns 0) when closed or the request is too large.
  uint64_t Send(agent::Request& req, std::shared_ptr<Pending> p);
  void IoLoop();
  void OnFrame(const std::string& frame);
  void FailAll(const std::string& why);
  void Wake();

  AgentClientOptions opts_;
  UniqueFd fd_, epoll_, wake_;
  std::thread io_;
  std::mutex mu_;  // guards pending_, outbox_, close_reason_
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;
  std::string outbox_;
  std::string close_reason_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> closed_{false}, stopping_{false};
  std::mutex close_mu_;  // serialises Close()
};

}  // namespace dsec::drivers
