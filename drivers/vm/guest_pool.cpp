// A VM kind's warm pool (docs/running.md "The warm pool"): guests booted
// ahead per image and size, and restored ahead per named snapshot, taken by
// a creation that matches; refilled one at a time in the background, at
// most a few pools kept (the least used goes), a removed snapshot's pool
// dropped, every pooled guest stopped with dsecd.
#include <sys/stat.h>

#include <functional>
#include <vector>

#include "drivers/vm/guest_driver.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"

namespace dsec::drivers {

std::string GuestDriver::PoolKey(const v1::SandboxSpec& spec) const {
  auto image = opts_.images->Get(spec.image());
  uint64_t memory;
  uint32_t vcpus;
  if (!image.ok() || !GuestSize(spec, &memory, &vcpus).ok()) return "";
  const v1::Limits& lim = spec.limits();
  // What the machine is launched with: the image, the guest's size, and the
  // limits and task guard its kernel command line and its QEMU's group carry.
  // A snapshot's guests: its dir (one per snapshot taken: a name taken
  // again is another pool).
  return image->digest() + "/" + std::to_string(memory) + "/" + std::to_string(vcpus) + "/" +
         std::to_string(lim.cpu_millis()) + "/" + std::to_string(lim.pids()) + "/" + std::to_string(lim.disk_bytes()) +
         (spec.has_task() ? "/task-" + std::to_string(std::hash<std::string>{}(spec.task().SerializeAsString())) : "") +
         (spec.snapshot().empty() || spec.layers().dirs().empty() ? "" : "/snapshot:" + spec.layers().dirs(0));
}

std::shared_ptr<GuestDriver::Box> GuestDriver::TakeFromPool(const std::string& key) {
  DropStalePools();
  for (;;) {
    std::shared_ptr<Box> box;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto& pool = pools_[key];
      pool.used_ms = SteadyClockMs();
      if (pool.ready.empty()) return nullptr;
      box = pool.ready.front();
      pool.ready.pop_front();
    }
    // A pooled guest is not watched: one that ended meanwhile is dropped.
    if (box->agent && box->agent->connected() && MachineState(*box) == RunState::kRunning) return box;
    Log(2, std::string(kind_name()) + " " + box->mid + ": a pooled guest that no longer runs; removed");
    if (box->agent) box->agent->Close();
    RemoveOrSay(*box, "a stale pooled guest");
  }
}

void GuestDriver::Refill(const std::string& key, const v1::SandboxSpec& spec) {
  constexpr size_t kPools = 4;  // sizes kept warm at once; the least used goes
  for (;;) {
    std::vector<std::shared_ptr<Box>> evicted;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (pools_closed_) return;
      auto& pool = pools_[key];
      if (pool.ready.size() + pool.booting >= static_cast<size_t>(opts_.pool_size)) return;
      ++pool.booting;
      while (pools_.size() > kPools) {
        auto lru = pools_.end();
        for (auto it = pools_.begin(); it != pools_.end(); ++it)
          if (it->first != key && it->second.booting == 0 && (lru == pools_.end() || it->second.used_ms < lru->second.used_ms))
            lru = it;
        if (lru == pools_.end()) break;
        for (auto& b : lru->second.ready) evicted.push_back(b);
        pools_.erase(lru);
      }
    }
    for (auto& b : evicted) {
      if (b->agent) b->agent->Close();
      RemoveOrSay(*b, "a pooled guest evicted for another size");
    }
    auto booted = Boot("p-" + RandomHex(12), spec, /*pooled=*/true);
    ++pool_boots_;
    std::shared_ptr<Box> extra;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = pools_.find(key);
      if (it != pools_.end()) --it->second.booting;
      if (booted.ok()) {
        if (it != pools_.end() && !pools_closed_) it->second.ready.push_back(*booted);
        else extra = *booted;
      }
    }
    if (extra) {
      if (extra->agent) extra->agent->Close();
      RemoveOrSay(*extra, "a pooled guest nobody wants now");
      return;
    }
    if (!booted.ok()) {
      Log(2, std::string(kind_name()) + ": the pool could not boot a guest: " + booted.status().message());
      return;
    }
  }
}

void GuestDriver::DropStalePools() {
  // A snapshot's pool whose snapshot was removed (its dir has no meta.json
  // any more): its guests go, and the memory they hold of it.
  std::vector<std::shared_ptr<Box>> stale;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = pools_.begin(); it != pools_.end();) {
      size_t at = it->first.find("/snapshot:");
      struct stat st;
      if (at == std::string::npos || it->second.booting > 0 ||
          ::stat((it->first.substr(at + 10) + "/meta.json").c_str(), &st) == 0) {
        ++it;
        continue;
      }
      for (auto& b : it->second.ready) stale.push_back(b);
      it = pools_.erase(it);
    }
  }
  if (stale.empty()) return;
  Log(1, std::string(kind_name()) + ": " + std::to_string(stale.size()) +
             " pooled guest(s) of a removed snapshot stopped");
  Work([this, stale] {
    for (auto& b : stale) {
      if (b->agent) b->agent->Close();
      RemoveOrSay(*b, "a pooled guest of a removed snapshot");
    }
  });
}

void GuestDriver::DrainPools() {
  std::vector<std::shared_ptr<Box>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pools_closed_ = true;
    for (auto& [key, pool] : pools_)
      for (auto& b : pool.ready) all.push_back(b);
    pools_.clear();
  }
  for (auto& b : all) {
    if (b->agent) b->agent->Close();
    RemoveOrSay(*b, "a pooled guest, at the stop");
  }
}

}  // namespace dsec::drivers
