// A pool of namespaces held open by file descriptor, handed to one runner at
// a time and taken back when it is gone. Creating a net namespace costs
// ~1.2 ms of CPU here and an ipc namespace ~0.2 ms (it mounts an internal
// mqueue filesystem); a namespace nobody inside could change (no
// capabilities) and that is verified empty is as good as new.
#pragma once

#include <sched.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/unique_fd.hpp"

namespace dsec::fncall {

class NamespacePool {
 public:
  // clone_flag: CLONE_NEWNET or CLONE_NEWIPC; name: "net" or "ipc".
  NamespacePool(int clone_flag, const char* name) : flag_(clone_flag), name_(name) {}
  // ipc only: true when the namespace holds no System V message queue,
  // semaphore set or shared memory segment. Reads /proc/sysvipc files opened
  // inside it when it was made (they stay bound to it), so no setns.
  bool IpcEmpty(int index) const;
  // net only, once every process that used it is gone: true when no socket
  // outlived them (TCP in TIME_WAIT or closing, one held by a
  // descriptor-passing cycle), so the next user can bind any port. Enters the namespace to read its sockstat
  // counters (the calling process is single-threaded).
  bool NetEmpty(int index) const;
  // net only: every namespace made has its loopback up (nothing inside
  // could change that: no CAP_NET_ADMIN), so its users need not.
  void set_loopback_up(bool up) { loopback_up_ = up; }
  // Free namespaces beyond this many are closed on Release.
  void set_max_free(size_t n) { max_free_ = n; }
  // A namespace index, or -1 with *error set. Creating one moves the calling
  // (single-threaded) process into it, which the spawner does not mind.
  int Acquire(std::string* error);
  // A new namespace, even when free ones exist (to fill the pool ahead of
  // need: Release it). Same contract as Acquire.
  int Make(std::string* error);
  void Release(int index) {
    if (free_.size() >= max_free_) Drop(index);
    else free_.push_back(index);
  }
  // Closes a namespace that must not be reused.
  void Drop(int index) {
    fds_[index].Reset();
    probes_[index].clear();
  }
  int fd(int index) const { return fds_[index].get(); }
  size_t free() const { return free_.size(); }
  size_t total() const { return fds_.size() - dropped(); }

 private:
  size_t dropped() const;
  int flag_;
  const char* name_;
  size_t max_free_ = SIZE_MAX;
  bool loopback_up_ = false;
  std::vector<UniqueFd> fds_;
  std::vector<int> free_;
  std::vector<std::vector<UniqueFd>> probes_;  // ipc: /proc/sysvipc/{msg,sem,shm} per namespace
};

}  // namespace dsec::fncall
