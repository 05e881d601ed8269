// A container as its driver holds it (internal to drivers/container: the
// driver's files share it).
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "drivers/container/container_driver.hpp"

namespace dsec::drivers {

struct ContainerDriver::Box : AgentBox {
  uint64_t OomKills() const override { return groups ? groups->OomKills(cgroup_rel) : 0; }

  std::string digest;
  std::string image_file;
  std::string cgroup_rel;
  int init_pid = 0;
  cgroup::Groups* groups = nullptr;  // the driver's, once the box has its group
  cgroup::GroupLimits group_limits;  // what its group holds
  // Idle freezing (IdleLoop), under idle_mu (active and last_active_ms too).
  bool idle_frozen = false;  // frozen by the idle timer; the next call thaws it
  bool user_paused = false;  // frozen by Pause; only Resume thaws it
  bool carrying = false;     // frozen while a grade copies its changes (CarryLayers); the idle timer leaves it
  std::vector<std::string> layers;  // a snapshot's it stacks under its upper dir (spec.layers), newest first
  uint64_t cpu_ns_at_check = 0;
  // Syscalls its seccomp listener denied (the spawner's Denied events); a
  // lock of its own (idle_mu is held through freezes and grade copies).
  mutable std::mutex denied_mu;
  std::map<std::string, uint64_t> denied;
  std::map<std::string, uint64_t> writes;  // refused by a read-only mount, "<call> <path>" (Denied.writes)
};

}  // namespace dsec::drivers
