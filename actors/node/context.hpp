// What the node's actors share: options, the store and its committer, the
// drivers, the logger. Owned by dsecd's main; actors hold a shared_ptr.
#pragma once

#include <spdlog/logger.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "drivers/limits.hpp"
#include "runtime/clock.hpp"
#include "drivers/registry.hpp"
#include "state/group_commit.hpp"
#include "state/store.hpp"

namespace dsec {

class FrontDoor;
namespace images {
class SnapshotStore;
class LazyImages;
}

struct NodeOptions {
  std::string node_id;                  // stable across restarts (meta table)
  uint64_t boot = 0;                    // how many times this data dir has started
  std::string sdk_address;              // for status output
  std::string admin_address;
  std::string http_address;             // "" when --http is off
  // Sandbox networking, for status: "on: <pool>" or "off: <why>" (only
  // mode none is taken then).
  std::string network = "off";
  std::string image_root;               // <data>/images: EROFS files of built images
  bool image_service = false;           // a controller's registry: chunk maps made at registration
  drivers::LimitPolicy limits = drivers::LimitPolicy::Default();
  size_t max_inflight_runs = 4096;      // one-shot runs; beyond: resource_exhausted
  uint64_t slots = 0;                   // sandboxes it holds at once (dsecd --slots); 0: no bound
  int max_restarts = 3;                 // supervisor: restarts of one child ...
  int restart_window_s = 10;            // ... within this many seconds
  uint32_t session_lease_s = 600;       // a session outlives its last trainer this long
  // Plain sandboxes' lifetimes (a spec may ask for others, within the maxima).
  uint32_t sandbox_ttl_s = 24 * 3600;        // destroyed this long after creation
  uint32_t sandbox_max_ttl_s = 7 * 24 * 3600;  // 0: no maximum (a spec may ask for no ttl)
  uint32_t sandbox_idle_timeout_s = 0;       // 0: none
  v1::IdleAction sandbox_on_idle = v1::IDLE_ACTION_PAUSE;
  uint32_t sandbox_lease_s = 600;            // an owned sandbox outlives its gone owner this long
  uint32_t session_retention_s = 7 * 24 * 3600;  // closed sessions' logs are kept this long
  bool test_hooks = false;              // honour crash injection (tests only)
};

// A text several threads read and one sets (under a lock).
class SharedText {
 public:
  void Set(std::string v) {
    std::lock_guard<std::mutex> lk(mu_);
    v_ = std::move(v);
  }
  std::string Get() const {
    std::lock_guard<std::mutex> lk(mu_);
    return v_;
  }

 private:
  mutable std::mutex mu_;
  std::string v_;
};

struct NodeContext {
  NodeOptions options;
  // The console's `e2b-key` command (args after it; a reply line), which
  // dsecd sets when it serves the E2B door; empty: --e2b off. Blocking
  // (the store): the node calls it off its thread.
  std::function<std::string(const std::vector<std::string>&)> e2b_keys;
  // Role node: the CAF node id (caf::to_string) of the controller it joined,
  // set by its link. What the controller forwards comes from there: it
  // keeps a session alive but is not a trainer a session could watch.
  std::shared_ptr<SharedText> controller_node = std::make_shared<SharedText>();
  state::Store* store = nullptr;
  state::GroupCommitter* committer = nullptr;
  // The sandbox kinds: each one's driver here, or why it cannot run.
  const drivers::Registry* kinds = nullptr;
  std::shared_ptr<spdlog::logger> log;
  FrontDoor* door = nullptr;            // dsecd's ports (counters for `stats`); may be null
  // This node's snapshots (drivers/images/snapshot_store.hpp); null: none
  // are kept here (a snapshot or a create from one says so).
  std::shared_ptr<images::SnapshotStore> snapshots;
  // A cluster node's lazy images (drivers/images/lazy_images.hpp); null in
  // other roles.
  std::shared_ptr<images::LazyImages> lazy;
  // Requests held by sandboxes that are being re-adopted after a restart
  // (console `status`: waiting_for_readopt).
  std::shared_ptr<std::atomic<int64_t>> waiting_for_readopt = std::make_shared<std::atomic<int64_t>>(0);
};


}  // namespace dsec
