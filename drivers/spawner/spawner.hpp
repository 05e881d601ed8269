// dsec-spawner: a small, single-threaded, statically linked helper that dsecd
// starts once. It keeps a warm pool of runners (runner.hpp) already inside
// fresh namespaces, hands each fncall run to one, collects its output,
// enforces the wall-clock and output limits, reads the run's cgroup, and
// reports an Outcome. Being small keeps clone() of a runner cheap; being a
// separate process keeps fork() out of the multi-threaded daemon.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace dsec::fncall {

struct SpawnerOptions {
  int control_fd = 3;                // socket to dsecd (framed spawner.proto)
  uid_t uid = 65534;                 // sandbox user
  gid_t gid = 65534;
  size_t pool_size = 16;             // ready runners kept warm
  size_t max_runners = 1024;         // runs beyond this wait in a queue
  // New net and ipc namespaces per run instead of recycled ones (costs ~1.4 ms of CPU).
  bool fresh_namespaces = false;
  std::string cgroup_parent = "dsec";  // groups go to <controller>/<parent>/sp<pid>/r<N>
  uint64_t tmpfs_bytes = 1ull << 30;   // size of /work and /tmp (the memory cgroup is the cap)
  // Serves containers: keeps container::kContainerCaps in the bounding set
  // (a fncall-only spawner empties it) and answers CreateContainer.
  bool containers = false;
  size_t container_netns = 0;          // fresh net namespaces kept ready for containers
  // Containers' writes refused by a read-only mount are counted (their
  // filter notifies the calls that write; write_watch.cpp).
  bool watch_writes = true;
};

// Runs until dsecd sends Shutdown or closes the socket; returns the exit code.
int RunSpawner(const SpawnerOptions& options);

}  // namespace dsec::fncall
