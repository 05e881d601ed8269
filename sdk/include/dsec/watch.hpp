// Directory watches (service.proto, WatchRequest): a sandbox's directory
// (and, recursive, every one under it) watched by inotify in the sandbox;
// each change an FsEvent (create, write, remove, rename, chmod; named
// relative to the directory) handed to `on_event` on an SDK thread, in
// order. A recursive watch follows directories made or moved in (what one
// holds when its watch is added is told as created, once) or renamed within
// the tree.
// Container and VM kinds.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dsec/client.hpp"

namespace dsec {

struct WatchOptions {
  bool recursive = false;
  std::chrono::milliseconds timeout{0};  // ends it after this long; 0: until stopped
  // Called (on an SDK thread) when it ends, however: the events delivered,
  // or why it ended (as Stop and Wait say).
  std::function<void(const Result<uint64_t>&)> on_end;
};

class DirWatch {
 public:
  struct State;
  DirWatch(Sandbox sandbox, std::shared_ptr<State> state) : sandbox_(std::move(sandbox)), state_(std::move(state)) {}
  ~DirWatch();  // Stop()
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;
  // Stops it and waits for its end: how many events it delivered, or why it
  // ended before (the directory removed, the sandbox gone).
  Result<uint64_t> Stop();
  // Waits for it to end by itself (its timeout, an error).
  Result<uint64_t> Wait();

 private:
  Sandbox sandbox_;
  std::shared_ptr<State> state_;
};

// Returns once the watch is in place (changes from then on are reported),
// or why it could not be (NotFound: no such directory). `on_event` runs on
// an SDK thread: it must not call Stop or Wait (or destroy the DirWatch),
// which wait for that thread.
Result<std::unique_ptr<DirWatch>> WatchDir(const Sandbox& sandbox, const std::string& path,
                                           std::function<void(const v1::FsEvent&)> on_event,
                                           WatchOptions options = {});

}  // namespace dsec
