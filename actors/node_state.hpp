// Internal to the node actor (node.cpp, node_admin.cpp): its state.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "actors/context.hpp"
#include "actors/image_worker.hpp"
#include "actors/node.hpp"
#include "actors/sandbox.hpp"
#include "actors/session.hpp"
#include "actors/supervision.hpp"

namespace dsec {

struct RunInfo {
  std::string argv0;
  int64_t started_ms = 0;
  drivers::Driver* driver = nullptr;  // that runs it
};

struct NodeCounters {
  uint64_t runs = 0;            // one-shot runs finished
  uint64_t runs_ok = 0;
  uint64_t runs_platform_error = 0;
  uint64_t rejected = 0;        // requests refused before running (bad input, limits)
  uint64_t restarts = 0;        // supervisor restarts
  uint64_t gave_up = 0;         // children left down by the restart-intensity limit
};

// Results of AnnotateBatch calls for one sender, sent together once the
// node's mailbox holds nothing older (a posted flush).
struct AnnotateOut {
  caf::actor to;
  v1::AnnotateResults results;
  bool flush_posted = false;
};

// SDK clients (by the client id of their Hello) and what they own.
struct Clients {
  std::unordered_map<caf::actor_addr, std::string> id_of;   // connected agents
  std::unordered_map<std::string, int> connections;         // client id -> connected agents
  std::unordered_map<std::string, std::unordered_set<std::string>> owned;  // client id -> sandbox ids
  std::unordered_map<std::string, int64_t> gone_since;      // owners without a connection, since when
  std::unordered_map<std::string, std::string> owner_of;    // sandbox id -> its owner's client id
};

struct NodeState {
  std::shared_ptr<NodeContext> ctx;
  Clients clients;
  // Why recently ended sandboxes ended, so a call for one says so instead
  // of only "not found" (the last kMaxEnded, not stored).
  std::unordered_map<std::string, std::string> ended;
  std::deque<std::string> ended_order;
  static constexpr size_t kMaxEnded = 4096;
  std::unordered_map<caf::actor_addr, AnnotateOut> annotate_out;
  std::unordered_map<std::string, sandbox_actor> sandboxes;
  std::unordered_map<caf::actor_addr, std::string> sandbox_of;
  std::unordered_map<std::string, session_actor> sessions;
  std::unordered_map<caf::actor_addr, std::string> session_of;
  std::unordered_map<std::string, RunInfo> runs;  // one-shot runs in flight
  std::unique_ptr<RestartIntensity> intensity;
  // Restarts of a child ("sb/<id>", "se/<name>") as last counted: its
  // checkpoint may not have the last count yet when it crashes again.
  std::unordered_map<std::string, uint32_t> restart_counts;
  image_worker_actor images;  // blocking registry work, off the node's thread
  NodeCounters counters;
  // The restore at start: sandboxes whose driver has not yet answered
  // Readopt, and those that have; done once the scan is too.
  struct {
    size_t readopting = 0;
    size_t readopted = 0;
    bool scanned = false;  // every record seen (the scan did not fail)
    bool done = false;
    std::chrono::steady_clock::time_point started;
  } restore;
  uint64_t next_run = 0;
  int64_t started_ms = 0;
  static constexpr const char* name = "node";
};

using NodeSelf = node_actor::stateful_pointer<NodeState>;

// Admin console commands (node_admin.cpp).
caf::result<std::string> HandleAdmin(NodeSelf self, const std::string& cmd,
                                     const std::vector<std::string>& args);

}  // namespace dsec
