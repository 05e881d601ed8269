// dsecd's start, one part at a time (docs/running.md): its flags, its data
// dir and stores, the kinds, the actors of its role, its listeners (each
// by name) behind the front door, and the stop, in the reverse order. One
// function per role (RunAll, RunNode, RunController in daemon.cpp)
// composes the parts.
//
// Exit codes: 0 clean stop (SIGINT/SIGTERM); 1 failed at run time; 2 bad
// usage; 3 the data dir is unusable or in use by another dsecd; 4 a port
// could not be opened.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "drivers/registry.hpp"
#include "wire/tls.hpp"

namespace dsec::daemon {

struct Flags {
  std::string role = "all";
  std::string data_dir = "./dsec-data";
  std::string listen = "127.0.0.1:7400";
  std::string admin = "127.0.0.1:7401";
  std::string http = "127.0.0.1:7402";  // "off": none
  std::string e2b = "127.0.0.1:7404";   // the E2B door; "off": none
  size_t e2b_max_connections = 4096;    // its HTTP connections at once (each E2B stream holds one)
  std::string log_level = "info";
  std::string log_file;
  size_t threads = 2;
  std::string cgroup_parent = "dsec";
  uint32_t sandbox_uid = 65534;
  uint32_t sandbox_gid = 65534;
  size_t max_inflight_runs = 4096;
  int max_restarts = 3;
  int restart_window_s = 10;
  uint32_t session_lease_s = 600;
  uint32_t sandbox_ttl_s = 24 * 3600;
  uint32_t sandbox_max_ttl_s = 7 * 24 * 3600;
  uint32_t sandbox_idle_timeout_s = 0;
  std::string sandbox_on_idle = "pause";
  uint32_t sandbox_lease_s = 600;
  double session_retention_h = 168;
  double snapshot_gib = 64;  // what all snapshots' layers may take (0: no bound)
  std::string sdk_token_file;  // default <data>/sdk.token
  size_t door_max_pending = 256;
  double door_timeout_s = 5;
  bool test_hooks = false;
  std::vector<std::string> test_faults;
  // Sandbox networking (docs/running.md, "Network").
  std::string sandbox_net = "100.96.0.0/12";
  bool network_open = false;
  bool no_sandbox_network = false;
  uint16_t sandbox_dns_port = 10053;
  std::vector<std::string> sandbox_dns_upstream;  // ADDRESS[:PORT]; empty: /etc/resolv.conf
  // The cluster (docs/cluster.md).
  std::string cluster_listen = "127.0.0.1:7403";  // controller: where nodes join
  std::string join;                               // node: the controller's cluster address
  std::string cluster_secret_file;                // default <data-dir>/cluster.secret (controller)
  uint64_t slots = 0;                             // node: sandboxes it takes (0: memory / 64 MiB)
  int heartbeat_ms = 1000;
  int down_after_ms = 3000;
  // Images on demand (docs/images.md).
  std::string image_fetch = "lazy";  // controller: lazy | whole
  double image_cache_gib = 20;       // node: its chunk cache
  int image_fetch_timeout_s = 30;    // node: a read waits this long for the image service, then EIO
  int image_record_s = 30;           // node: an image's first reads recorded this long (its prefetch order)
  // TLS on the SDK and cluster ports (wire/tls.hpp); files: certificates.
  bool tls = false;
  tls::Files tls_files;
};

// Every flag of dsecd, the kinds' own among them (flags.cpp).
void AddFlags(CLI::App& app, Flags* f, drivers::Registry& kinds);

// Starts dsecd in the role the flags name and runs it until SIGINT or
// SIGTERM; the exit code.
int Run(const Flags& f, drivers::Registry& kinds);

}  // namespace dsec::daemon
