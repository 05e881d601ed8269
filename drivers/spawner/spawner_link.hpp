// SpawnerLink: dsecd's end of a dsec-spawner process. Starts it, speaks
// spawner.proto to it from one I/O thread, hands every event (but hello and
// log lines, which it handles) to its owner, and restarts it when it dies,
// within a restart-intensity limit. Each driver that needs namespaces
// (fncall, container) owns one.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsec/status.hpp"
#include "runtime/frame.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::spawner {
class Event;
class Request;
}  // namespace dsec::spawner

namespace dsec::drivers {

struct SpawnerLinkOptions {
  std::string name = "spawner";    // in messages: "fncall", "container"
  // The helper binary; default: dsec-spawner next to this executable (or $DSEC_SPAWNER).
  std::string spawner_path;
  std::vector<std::string> args;   // flags after "--fd 3"
  int start_timeout_ms = 30'000;   // wait for the hello
  int max_restarts = 5;            // restarts within restart_window_s before giving up
  int restart_window_s = 60;
  std::function<void(int level, const std::string& text)> log;  // 0 debug .. 3 error
  // After a restart's hello, on the I/O thread (Send works there): what the
  // new spawner must be told about the old one's (the container driver's
  // seccomp listeners to take back).
  std::function<void()> on_restarted;
};

class SpawnerLink {
 public:
  // Every event except hello and log, on the I/O thread.
  using EventHandler = std::function<void(spawner::Event& ev)>;
  // The spawner is gone (died, or the link stops): whatever was in flight is
  // lost. On the I/O thread, before any restart.
  using GoneHandler = std::function<void(const std::string& why, bool stopping)>;

  // Starts the spawner and waits for its hello; FailedPrecondition with the
  // spawner's reason when this host cannot do what it does.
  static Result<std::unique_ptr<SpawnerLink>> Start(SpawnerLinkOptions options, EventHandler on_event,
                                                    GoneHandler on_gone);
  ~SpawnerLink();

  // Queues a request (any thread). Unavailable when the spawner is not up.
  Status Send(const spawner::Request& request);
  // Ok while the spawner works; otherwise why not.
  Status Available() const;
  pid_t pid() const { return pid_.load(); }
  // Sends Shutdown, waits for the spawner to clean up and exit, stops the
  // I/O thread (SIGKILL after 15 s). Idempotent; the destructor calls it.
  void Stop();

 private:
  SpawnerLink(SpawnerLinkOptions options, EventHandler on_event, GoneHandler on_gone);
  Status Launch();
  void IoLoop();
  void OnFrame(const std::string& frame);
  void OnGone(const std::string& why);
  void Wake();

  SpawnerLinkOptions opts_;
  EventHandler on_event_;
  GoneHandler on_gone_;
  mutable std::mutex mu_;
  std::string outbox_;
  Status unavailable_;
  std::vector<int64_t> restarts_;  // steady-clock seconds of recent restarts
  UniqueFd sock_, wake_, pidfd_, epoll_;
  std::atomic<pid_t> pid_{-1};
  FrameDecoder decoder_;
  std::thread io_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
};

// dsec-spawner next to this executable, or $DSEC_SPAWNER.
std::string DefaultSpawnerPath();

}  // namespace dsec::drivers
