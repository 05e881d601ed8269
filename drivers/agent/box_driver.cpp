#include "drivers/agent/box_driver.hpp"

#include "drivers/net/node_network.hpp"

#include "runtime/clock.hpp"

namespace dsec::drivers {

BoxDriver::~BoxDriver() {
  StopIdleScan();
  StopWorkers();
}

std::shared_ptr<AgentBox> BoxDriver::FindBox(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = boxes_.find(id);
  return it == boxes_.end() ? nullptr : it->second;
}

bool BoxDriver::PutBox(std::shared_ptr<AgentBox> box, bool if_absent) {
  std::lock_guard<std::mutex> lk(mu_);
  const std::string id = box->id;
  if (if_absent) return boxes_.emplace(id, std::move(box)).second;
  boxes_[id] = std::move(box);
  return true;
}

std::shared_ptr<AgentBox> BoxDriver::TakeBox(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = boxes_.find(id);
  if (it == boxes_.end()) return nullptr;
  auto box = std::move(it->second);
  boxes_.erase(it);
  return box;
}

size_t BoxDriver::BoxCount() const {
  std::lock_guard<std::mutex> lk(mu_);
  return boxes_.size();
}

void BoxDriver::StartIdleScan(std::chrono::milliseconds period) {
  scanner_ = std::thread([this, period] { IdleScanLoop(period); });
}

void BoxDriver::StopIdleScan() {
  {
    std::lock_guard<std::mutex> lk(scan_mu_);
    scan_stop_ = true;
  }
  scan_cv_.notify_all();
  if (scanner_.joinable()) scanner_.join();
}

void BoxDriver::IdleScanLoop(std::chrono::milliseconds period) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(scan_mu_);
      if (scan_cv_.wait_for(lk, period, [this] { return scan_stop_; })) return;
    }
    int64_t now = SteadyClockMs();
    for (const auto& box : BoxesAs<AgentBox>()) ScanIdle(box, now);
    ScanDone(now);
  }
}

bool BoxDriver::ClaimLeftover(const std::string& name) {
  std::unique_lock<std::mutex> lk(mu_);
  if (leftovers_.erase(name) > 0) return true;
  // The sweep may be removing it right now: not ours to take until it is done.
  removed_cv_.wait(lk, [&] { return removing_.count(name) == 0; });
  return false;
}

size_t BoxDriver::SweepLeftovers(const std::function<Status(const std::string&)>& remove, const std::string& why) {
  size_t removed = 0;
  for (;;) {
    std::string name;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (leftovers_.empty()) break;
      name = *leftovers_.begin();
      leftovers_.erase(leftovers_.begin());
      removing_.insert(name);
    }
    Say(1, name, why + "; removed");
    Status s = remove(name);
    Removed(s, std::string(kind_name_) + " " + name + "'s leftover");
    if (s.ok()) ++removed;
    {
      std::lock_guard<std::mutex> lk(mu_);
      removing_.erase(name);
    }
    removed_cv_.notify_all();
  }
  return removed;
}

Status BoxDriver::CheckNetwork(const v1::SandboxSpec& spec, const std::string& gap) const {
  auto p = net::ParsePolicy(spec.network());
  if (!p.ok()) return p.status();
  if (!NeedsLink(*p)) return Status::Ok();
  if (!net_.network)
    return Status::FailedPrecondition(std::string(kind_name_) + " networking is unavailable on this node: " +
                                      net_.unavailable);
  if (!gap.empty()) return Status::FailedPrecondition(std::string(kind_name_) + " networking: " + gap);
  if (p->mode == v1::NETWORK_MODE_OPEN && !net_.open)
    return Status::FailedPrecondition(
        "network mode open is off on this node (its operator turns it on with dsecd --network-open); "
        "list what the sandbox needs with mode allow");
  return Status::Ok();
}

void BoxDriver::SetNetwork(const v1::SandboxRecord& sb, const v1::NetworkPolicy& next, StatusCallback done) {
  if (!net_.network)
    return done(Status::FailedPrecondition("sandbox " + sb.id() + ": this node has no sandbox networking (" +
                                           net_.unavailable + ")"));
  Answer(std::move(done), [this, id = sb.id(), next]() -> Status {
    auto policy = net::ParsePolicy(next);
    if (!policy.ok()) return policy.status();
    return net_.network->Replace(id, *policy);
  });
}

Result<v1::NetworkReport> BoxDriver::Network(const v1::SandboxRecord& sb) const {
  if (!net_.network) return Status::NotFound("this node has no sandbox networking");
  return net_.network->Report(sb.id());
}

}  // namespace dsec::drivers
