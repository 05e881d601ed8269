// VmWatcher: learns, on one thread for every VM of a driver, when a guest
// ends by itself: its QEMU exits (a pidfd), or its machine shuts down or
// resets (QMP's SHUTDOWN event on a monitor socket of its own: the guest
// powered off, or its kernel panicked and, with panic=-1 and -no-reboot,
// reset). The driver then fails the sandbox and frees what is left.
#pragma once

#include <sys/types.h>

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "dsec/status.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::drivers::vm {

class VmWatcher {
 public:
  // `what`: "exited" (QEMU is gone) or the SHUTDOWN event's reason
  // ("guest-panic", "guest-reset", "guest-shutdown", ...). Runs on the
  // watcher's thread once per watched VM; it must not block long.
  using Ended = std::function<void(const std::string& id, const std::string& what)>;
  explicit VmWatcher(Ended ended);
  ~VmWatcher();
  VmWatcher(const VmWatcher&) = delete;
  VmWatcher& operator=(const VmWatcher&) = delete;

  // Watches VM `id`: QEMU `pid`, its event monitor at `event_socket`
  // (QMP, one client at a time: this one's; "" for none: its pid alone,
  // for a QEMU whose monitor is libvirtd's). Replaces an earlier watch.
  Status Watch(const std::string& id, pid_t pid, const std::string& event_socket);
  // Stops watching (before the driver stops the VM itself).
  void Unwatch(const std::string& id);
  size_t size() const;

 private:
  struct Entry {
    std::string id;
    UniqueFd pidfd, qmp;
    std::string buf;
    uint64_t key = 0;
  };
  void Run();
  void Drop(uint64_t key);  // under mu_

  Ended ended_;
  UniqueFd epoll_, wake_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;  // by key
  std::unordered_map<std::string, uint64_t> by_id_;
  uint64_t next_key_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dsec::drivers::vm
