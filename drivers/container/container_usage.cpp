// What a container uses: its disk (the sandbox filesystem's quota count)
// and, from its cgroup, CPU time and memory. Read on the caller's thread
// without waking a frozen container.
#include <unistd.h>

#include <algorithm>

#include "drivers/container/container_box.hpp"
#include "drivers/container/sandbox_disk.hpp"

namespace dsec::drivers {

Result<uint64_t> ContainerDriver::DiskUsage(const v1::SandboxRecord& sb) const {
  if (!disk_) return Status::FailedPrecondition("container disk limits unavailable: " + disk_status_.message());
  return disk_->Usage(sb.id());
}

void ContainerDriver::Usage(const v1::SandboxRecord& sb, UsageCallback done) {
  auto box = FindAs<Box>(sb.id());
  cgroup::Groups* groups = nullptr;
  if (box) {
    std::lock_guard<std::mutex> lk(box->idle_mu);  // a removal clears it under that lock
    groups = box->groups;
  }
  if (!groups) return done(Status::Unavailable("container " + sb.id() + " is not running on this node"));
  v1::SandboxUsage u;
  long host_cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  uint32_t cpus = host_cpus > 0 ? static_cast<uint32_t>(host_cpus) : 1;
  if (uint32_t millis = box->limits.cpu_millis()) cpus = std::min(cpus, (millis + 999) / 1000);
  u.set_cpu_count(cpus);
  u.set_cpu_ns(groups->CpuUsageNs(box->cgroup_rel));
  // Used: what it is charged less the inactive page cache (as docker stats
  // counts), so tmpfs files, which cannot be reclaimed, count as used.
  auto mem = groups->Memory(box->cgroup_rel);
  u.set_mem_cache_bytes(mem.cache);
  u.set_mem_used_bytes(mem.charged > mem.inactive_file ? mem.charged - mem.inactive_file : 0);
  uint64_t total = box->limits.memory_bytes();
  if (!total && box->group_limits.memory > 0) total = static_cast<uint64_t>(box->group_limits.memory);
  if (!total) total = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  u.set_mem_total_bytes(total);
  done(std::move(u));
}

}  // namespace dsec::drivers
