// dsecd's flags, documented in docs/running.md ("dsecd flags and defaults").
#include "tools/dsecd/daemon.hpp"

namespace dsec::daemon {

void AddFlags(CLI::App& app, Flags* f, drivers::Registry& kinds) {
  app.add_option("--role", f->role,
                 "all (one node, embedded) | controller (the cluster's entry: placement and the directory) | node "
                 "(runs sandboxes, joins a controller)")
      ->capture_default_str();
  app.add_option("--cluster-listen", f->cluster_listen, "controller: where nodes join, host:port (port 0: any)")
      ->capture_default_str();
  app.add_option("--join", f->join, "node: the controller's --cluster-listen address, HOST:PORT");
  app.add_option("--cluster-secret", f->cluster_secret_file,
                 "the secret nodes prove they share with the controller (controller: created when absent, default "
                 "<data-dir>/cluster.secret; node: required, a copy of the controller's)");
  app.add_option("--slots", f->slots, "sandboxes a node holds at once: placement counts them and the node refuses a create past them, a "
                 "fork's included (0: no bound; for placement a node then counts its memory / 64 MiB)")
      ->capture_default_str();
  app.add_option("--heartbeat-ms", f->heartbeat_ms, "controller: how often nodes send their heartbeat")
      ->check(CLI::Range(50, 60000))
      ->capture_default_str();
  app.add_option("--node-down-after-ms", f->down_after_ms,
                 "controller: a node without a heartbeat this long is down (its sandboxes are reported lost)")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_option("--image-fetch", f->image_fetch,
                 "controller: how a node gets an image it lacks: lazy (its chunks when a sandbox first reads them, "
                 "docs/images.md) or whole (the whole file copied before the first sandbox starts)")
      ->check(CLI::IsMember({"lazy", "whole"}))
      ->capture_default_str();
  app.add_option("--image-cache-gib", f->image_cache_gib,
                 "node: the chunk cache its lazy images share (least recently used chunks go past it)")
      ->check(CLI::Range(0.004, 1e6))
      ->capture_default_str();
  app.add_option("--image-fetch-timeout", f->image_fetch_timeout_s,
                 "node: seconds a read of a lazy image waits for the image service (retrying) before it fails with EIO")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--image-record-s", f->image_record_s,
                 "node: seconds from the first read of a lazy image with no prefetch order during which its reads are "
                 "recorded; the record becomes the order later nodes prefetch")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_flag("--tls", f->tls,
               "TLS (CAF's OpenSSL module) on the SDK and cluster ports, after the door's handshake: every trainer's "
               "and node's connection; a node started with it joins only a controller that has it too");
  app.add_option("--tls-cert", f->tls_files.cert,
                 "with --tls: this dsecd's certificate (PEM); with --tls-key and --tls-ca, peers must show a "
                 "certificate of that CA (without the three: anonymous TLS, encrypted but not authenticated)");
  app.add_option("--tls-key", f->tls_files.key, "with --tls: the private key of --tls-cert (PEM)");
  app.add_option("--tls-ca", f->tls_files.ca, "with --tls: the CA file (PEM) peers' certificates must chain to");
  app.add_option("--data-dir", f->data_dir, "where state lives (RocksDB, admin token)")->capture_default_str();
  app.add_option("--listen", f->listen, "SDK entry host:port (port 0: any)")->capture_default_str();
  app.add_option("--admin", f->admin, "admin console host:port (port 0: any)")->capture_default_str();
  app.add_option("--http", f->http,
                 "metrics (/metrics, Prometheus text) and the status page (/) host:port (port 0: any; off: none)")
      ->capture_default_str();
  app.add_option("--e2b", f->e2b,
                 "the E2B-compatible API (E2B_API_URL for the unmodified e2b SDK; docs/e2b.md) host:port (port 0: "
                 "any; off: none)")
      ->capture_default_str();
  app.add_option("--e2b-max-connections", f->e2b_max_connections,
                 "connections the E2B door holds at once: each open command stream or watch is one (the SDK "
                 "speaks HTTP/1.1), and each may have 1 MiB of output waiting for its client; past it, 503")
      ->check(CLI::Range(size_t{16}, size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--log-level", f->log_level, "trace|debug|info|warn|error")->capture_default_str();
  app.add_option("--log-file", f->log_file, "also log to this file");
  app.add_option("--threads", f->threads, "actor scheduler threads")->capture_default_str();
  // Each kind's own flags (--fncall-..., --container-..., --sandbox-disk-...).
  kinds.AddFlags(app);
  app.add_option("--cgroup-parent", f->cgroup_parent, "cgroups go to <controller>/<parent>/sp<pid>/...")
      ->capture_default_str();
  app.add_option("--sandbox-uid", f->sandbox_uid, "uid programs run as")->capture_default_str();
  app.add_option("--sandbox-gid", f->sandbox_gid, "gid programs run as")->capture_default_str();
  app.add_option("--max-inflight-runs", f->max_inflight_runs, "one-shot runs in flight before refusing")
      ->capture_default_str();
  app.add_option("--max-restarts", f->max_restarts, "supervisor: restarts of one actor ...")->capture_default_str();
  app.add_option("--restart-window", f->restart_window_s, "... within this many seconds")->capture_default_str();
  app.add_option("--session-lease", f->session_lease_s,
                 "seconds a session and its sandboxes outlive their last trainer (a trainer may ask for "
                 "another lease when it opens the session)")
      ->check(CLI::Range(1u, 7u * 24 * 3600))
      ->capture_default_str();
  app.add_option("--sandbox-ttl", f->sandbox_ttl_s,
                 "seconds a plain sandbox lives unless its spec says otherwise (0: forever, if --sandbox-max-ttl is 0)")
      ->capture_default_str();
  app.add_option("--sandbox-max-ttl", f->sandbox_max_ttl_s, "the longest ttl a spec may ask for (0: no maximum)")
      ->capture_default_str();
  app.add_option("--sandbox-idle-timeout", f->sandbox_idle_timeout_s,
                 "seconds without exec or file call after which a plain sandbox is paused or destroyed "
                 "(--sandbox-on-idle) unless its spec says otherwise (0: never)")
      ->capture_default_str();
  app.add_option("--sandbox-on-idle", f->sandbox_on_idle, "pause | destroy")
      ->check(CLI::IsMember({"pause", "destroy"}))
      ->capture_default_str();
  app.add_option("--sandbox-lease", f->sandbox_lease_s,
                 "seconds a sandbox outlives its SDK client's last connection (unless made detached)")
      ->check(CLI::Range(1u, 7u * 24 * 3600))
      ->capture_default_str();
  app.add_option("--snapshot-gib", f->snapshot_gib,
                 "GiB the node's snapshots may take together (their own layers; 0: no bound)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--session-retention", f->session_retention_h,
                 "hours a closed session's log is kept for dsec-replay")
      ->check(CLI::Range(0.0, 24.0 * 3650))
      ->capture_default_str();
  app.add_option("--sdk-token-file", f->sdk_token_file,
                 "the SDK token clients must prove they hold (created when absent; default <data-dir>/sdk.token)");
  app.add_option("--door-max-pending", f->door_max_pending,
                 "SDK connections in their token handshake at once (a new one pushes out the oldest)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--door-timeout", f->door_timeout_s, "seconds an SDK connection has for its token handshake")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--sandbox-net", f->sandbox_net,
                 "the addresses of sandboxes with a network: a /30 each (the host end is its gateway); a range "
                 "nothing else on this host routes")
      ->capture_default_str();
  app.add_flag("--network-open", f->network_open,
               "allow network mode open (any public address) for sandboxes that ask; off: allow-lists only");
  app.add_option("--sandbox-dns-port", f->sandbox_dns_port,
                 "the port (udp and tcp, every address) dsecd answers sandboxes' DNS on; every query a sandbox "
                 "sends, to any address, is redirected there")
      ->capture_default_str();
  app.add_option("--sandbox-dns-upstream", f->sandbox_dns_upstream,
                 "ADDRESS[:PORT] of the resolvers dsecd asks for the names sandboxes' allow-lists name "
                 "(repeatable; default: the IPv4 nameservers of /etc/resolv.conf)");
  app.add_flag("--no-sandbox-network", f->no_sandbox_network,
               "no sandbox networking on this node (no nftables table, no forwarding): only mode none");
  app.add_flag("--test-hooks", f->test_hooks, "honour crash and driver fault injection (tests only)");
  app.add_option("--test-fault", f->test_faults,
                 "with --test-hooks: KIND:OP:fail:N or KIND:OP:hold, armed before the restore (tests only; "
                 "OP: create, exec, destroy, pause, readopt, files)");
}

}  // namespace dsec::daemon
