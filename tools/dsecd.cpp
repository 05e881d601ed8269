// dsecd: the dsec daemon. Role `all` (the default) is the embedded
// single-node platform: node actor, drivers, store, SDK entry and admin
// console in one process. See docs/running.md.
//
// Exit codes: 0 clean stop (SIGINT/SIGTERM); 1 failed at run time;
// 2 bad usage; 3 the data dir is unusable or in use by another dsecd;
// 4 a port could not be opened.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <future>
#include <mutex>
#include <optional>
#include <string>

#include "actors/cluster.hpp"
#include "actors/console.hpp"
#include "actors/context.hpp"
#include "actors/http_server.hpp"
#include "actors/node.hpp"
#include "actors/node_host.hpp"
#include "actors/sdk_entry.hpp"
#include "wire/tls.hpp"
#include "wire/wire.hpp"
#include "drivers/images/image_store.hpp"
#include "drivers/registry.hpp"
#include "runtime/door_auth.hpp"
#include "runtime/files.hpp"
#include "runtime/front_door.hpp"
#include "runtime/http_gate.hpp"
#include "runtime/log.hpp"
#include "state/group_commit.hpp"
#include "state/store.hpp"
#include "state/table.hpp"

namespace {

struct Flags {
  std::string role = "all";
  std::string data_dir = "./dsec-data";
  std::string listen = "127.0.0.1:7400";
  std::string admin = "127.0.0.1:7401";
  std::string http = "127.0.0.1:7402";  // "off": none
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
  std::string sdk_token_file;  // default <data>/sdk.token
  size_t door_max_pending = 256;
  double door_timeout_s = 5;
  bool test_hooks = false;
  std::vector<std::string> test_faults;  // KIND:OP:fail:N | KIND:OP:hold
  // The cluster (docs/cluster.md).
  std::string cluster_listen = "127.0.0.1:7403";  // controller: where nodes join
  std::string join;                               // node: the controller's cluster address
  std::string cluster_secret_file;                // default <data-dir>/cluster.secret (controller)
  uint64_t slots = 0;                             // node: sandboxes it takes (0: memory / 64 MiB)
  int heartbeat_ms = 1000;
  int down_after_ms = 3000;
  // TLS on the SDK and cluster ports (wire/tls.hpp); files: certificates.
  bool tls = false;
  dsec::tls::Files tls_files;
};

// The node id survives restarts; the boot counter counts them.
dsec::Status LoadIdentity(dsec::state::Store* store, std::string* node_id, uint64_t* boot) {
  auto id = store->Get(dsec::state::Table::kMeta, "node_id");
  if (id.ok()) *node_id = *id;
  else if (id.status().code() == dsec::Status::Code::kNotFound) *node_id = "node-" + dsec::RandomHex(8);
  else return id.status();
  auto b = store->Get(dsec::state::Table::kMeta, "boot");
  *boot = b.ok() ? std::stoull(*b) + 1 : 1;
  dsec::state::WriteBatch batch;
  batch.Put(dsec::state::Table::kMeta, "node_id", *node_id);
  batch.Put(dsec::state::Table::kMeta, "boot", std::to_string(*boot));
  return store->Write(batch, true);
}

// A driver's log callback (levels 0 debug .. 3 error) into its own logger.
std::function<void(int, const std::string&)> DriverLog(const std::string& name) {
  auto logger = dsec::Logger(name);
  return [logger](int level, const std::string& text) {
    static const spdlog::level::level_enum kLevels[] = {spdlog::level::debug, spdlog::level::info,
                                                        spdlog::level::warn, spdlog::level::err};
    logger->log(kLevels[level < 0 ? 0 : level > 3 ? 3 : level], "{}", text);
  };
}

// Every container holds descriptors in dsecd (its agent connection):
// thousands of them need far more than the usual soft limit of 1024.
void RaiseOpenFilesLimit(const std::shared_ptr<spdlog::logger>& log) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) < 0) return;
  rlim_t want = 1 << 20;
  if (auto cap = dsec::ReadFileToString("/proc/sys/fs/nr_open"); cap.ok())
    want = std::min<rlim_t>(want, std::strtoull(cap->c_str(), nullptr, 10));
  if (rl.rlim_max < want) {
    rlimit more{want, want};
    if (::setrlimit(RLIMIT_NOFILE, &more) == 0) return;  // root may raise the hard limit
  }
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_max < 65536)
    log->warn("open files limit is {}: about {} containers fit (raise it with ulimit -n)",
              static_cast<unsigned long long>(rl.rlim_max), static_cast<unsigned long long>(rl.rlim_max / 4));
}

void ConfigureCafFor(const Flags& f, caf::actor_system_config& cfg) {
  dsec::CafOptions co;
  co.scheduler_threads = f.threads;
  dsec::ConfigureCaf(cfg, co);
  if (f.tls) dsec::tls::Configure(cfg, f.tls_files);
}

// What the ready line says of TLS.
std::string TlsNote(const Flags& f) {
  if (!f.tls) return "";
  return f.tls_files.empty() ? "; TLS on the SDK and cluster ports (anonymous: no certificates)"
                             : "; TLS on the SDK and cluster ports, certificates checked against " + f.tls_files.ca;
}

// Waits for SIGINT or SIGTERM; logs which.
void WaitForStop(const std::shared_ptr<spdlog::logger>& log) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  log->info("{}: stopping", strsignal(sig));
}

dsec::FrontDoorListener ConsoleListener(const std::string& host, uint16_t port, dsec::HandshakeProtocol* gate,
                                        size_t max_line) {
  dsec::FrontDoorListener l;
  l.host = host;
  l.port = port;
  l.protocol = gate;
  l.max_pending = 64;
  l.timeout_ms = 60'000;  // a person typing AUTH into nc
  l.max_input = max_line + 2;
  return l;
}

dsec::FrontDoorListener HttpListener(const std::string& host, uint16_t port, dsec::HandshakeProtocol* gate) {
  dsec::FrontDoorListener l;
  l.host = host;
  l.port = port;
  l.protocol = gate;
  l.max_pending = 64;
  l.timeout_ms = 10'000;
  l.max_input = dsec::HttpGate::kMaxHead;
  return l;
}

dsec::FrontDoorListener TokenListener(const std::string& host, uint16_t port, dsec::HandshakeProtocol* door,
                                      const Flags& f) {
  dsec::FrontDoorListener l;
  l.host = host;
  l.port = port;
  l.protocol = door;
  l.max_pending = f.door_max_pending;
  l.timeout_ms = static_cast<int>(f.door_timeout_s * 1000);
  l.max_input = dsec::door::kResponseSize;
  return l;
}

// Role controller: the cluster's entry. No drivers and no sandboxes of its
// own: the node registry, placement and the directory (docs/cluster.md).
int RunController(const Flags& f, dsec::state::Store* store, dsec::state::GroupCommitter* committer,
                  const std::string& data, const std::string& id, uint64_t boot, const std::string& admin_token,
                  const std::string& sdk_token) {
  auto log = dsec::Logger("dsecd");
  std::string sdk_host, admin_host, http_host, cluster_host;
  uint16_t sdk_port = 0, admin_port = 0, http_port = 0, cluster_port = 0;
  const bool http_on = f.http != "off";
  dsec::SplitHostPort(f.listen, &sdk_host, &sdk_port);
  dsec::SplitHostPort(f.admin, &admin_host, &admin_port);
  if (http_on) dsec::SplitHostPort(f.http, &http_host, &http_port);
  if (!dsec::SplitHostPort(f.cluster_listen, &cluster_host, &cluster_port)) {
    log->error("--cluster-listen '{}' is not host:port", f.cluster_listen);
    return 2;
  }
  std::string secret_path =
      f.cluster_secret_file.empty() ? data + "/cluster.secret" : dsec::AbsolutePath(f.cluster_secret_file);
  auto secret = dsec::LoadOrCreateToken(secret_path);
  if (!secret.ok()) {
    log->error("{}", secret.status().message());
    return 3;
  }
  auto ctx = std::make_shared<dsec::ControllerContext>();
  ctx->id = id;
  ctx->boot = boot;
  ctx->sdk_token = sdk_token;
  ctx->heartbeat_ms = f.heartbeat_ms;
  ctx->down_after_ms = f.down_after_ms;
  ctx->store = store;
  ctx->committer = committer;
  ctx->log = dsec::Logger("controller");
  ctx->image_ctx = std::make_shared<dsec::NodeContext>();
  ctx->image_ctx->store = store;
  ctx->image_ctx->log = ctx->log;
  ctx->image_ctx->options.image_root = data + "/images";
  ctx->image_ctx->options.node_id = id;
  int rc = 0;
  std::unique_ptr<dsec::FrontDoor> door;
  {
    caf::actor_system_config cfg;
    ConfigureCafFor(f, cfg);
    caf::actor_system sys{cfg};
    auto controller = dsec::SpawnController(sys, ctx);
    auto as_admin = caf::actor_cast<dsec::admin_actor>(controller);
    dsec::SdkDoor sdk_door(sys, caf::actor_cast<dsec::entry_actor>(controller), sdk_token,
                           "the controller's token is in <data-dir>/sdk.token or its --sdk-token-file",
                           DriverLog("door"));
    dsec::SdkDoor cluster_door(sys, dsec::door::kCluster, caf::actor_cast<caf::strong_actor_ptr>(controller),
                               sys.message_types(controller), *secret,
                               "start the node with --cluster-secret naming a copy of the controller's secret file",
                               DriverLog("door"));
    sdk_door.set_tls(f.tls);
    cluster_door.set_tls(f.tls);
    dsec::ConsoleOptions copts;
    copts.token = admin_token;
    auto console = dsec::SpawnConsole(sys, as_admin, copts);
    dsec::HttpServer http(sys, as_admin);
    std::vector<dsec::FrontDoorListener> doors;
    doors.push_back(TokenListener(sdk_host, sdk_port, &sdk_door, f));
    doors.push_back(ConsoleListener(admin_host, admin_port, console.gate.get(), copts.max_line));
    doors.push_back(TokenListener(cluster_host, cluster_port, &cluster_door, f));
    if (http_on) doors.push_back(HttpListener(http_host, http_port, http.gate()));
    auto opened = dsec::FrontDoor::Start(doors, DriverLog("door"));
    if (!opened.ok()) {
      log->error("{} (is another dsecd running? pick other ports with --listen / --admin / --cluster-listen / --http)",
                 opened.status().message());
      rc = 4;
    } else {
      door = std::move(*opened);
      sdk_door.set_port(door->port(0));
      cluster_door.set_port(door->port(2));
      ctx->sdk_address = sdk_host + ":" + std::to_string(door->port(0));
      ctx->admin_address = admin_host + ":" + std::to_string(door->port(1));
      ctx->cluster_address = cluster_host + ":" + std::to_string(door->port(2));
      if (http_on) ctx->http_address = http_host + ":" + std::to_string(door->port(3));
      ctx->door = door.get();
      nlohmann::json ep{{"pid", ::getpid()},          {"node_id", id},
                        {"role", "controller"},       {"sdk", ctx->sdk_address},
                        {"admin", ctx->admin_address}, {"http", ctx->http_address},
                        {"cluster", ctx->cluster_address}};
      (void)dsec::WriteFileAtomic(data + "/dsecd.json", ep.dump() + "\n", 0644);
      log->info("dsecd {} ready: controller {} (boot {}), SDK on {}, nodes join at {} (secret {}), admin console on "
                "{}, metrics and status page on {}, data in {}{}",
                DSEC_VERSION, id, boot, ctx->sdk_address, ctx->cluster_address, secret_path, ctx->admin_address,
                http_on ? "http://" + ctx->http_address + "/" : std::string("nothing (--http off)"), data, TlsNote(f));
      WaitForStop(log);
      ::unlink((data + "/dsecd.json").c_str());
    }
    if (door) door->Stop();
    http.Stop();
    caf::anon_send_exit(console.broker, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(controller, caf::exit_reason::user_shutdown);
  }
  committer->Stop();
  log->info("stopped");
  return rc;
}

int Run(const Flags& f, dsec::drivers::Registry& kinds) {
  auto log = dsec::Logger("dsecd");
  RaiseOpenFilesLimit(log);
  if (f.role != "all" && f.role != "node" && f.role != "controller") {
    log->error("--role '{}' is not one of all, controller, node", f.role);
    return 2;
  }
  std::string join_host;
  uint16_t join_port = 0;
  if (f.role == "node") {
    if (f.join.empty() || !dsec::SplitHostPort(f.join, &join_host, &join_port) || join_port == 0) {
      log->error("--role node needs --join HOST:PORT (the controller's --cluster-listen address)");
      return 2;
    }
    if (f.cluster_secret_file.empty()) {
      log->error("--role node needs --cluster-secret FILE (a copy of the controller's <data-dir>/cluster.secret)");
      return 2;
    }
  } else if (!f.join.empty()) {
    log->error("--join is for --role node");
    return 2;
  }
  if (!f.tls && !f.tls_files.empty()) {
    log->error("--tls-cert, --tls-key and --tls-ca are for --tls");
    return 2;
  }
  if (auto st = dsec::tls::Check(f.tls_files); !st.ok()) {
    log->error("{}", st.message());
    return 2;
  }
  std::string sdk_host, admin_host;
  uint16_t sdk_port = 0, admin_port = 0;
  if (!dsec::SplitHostPort(f.listen, &sdk_host, &sdk_port)) {
    log->error("--listen '{}' is not host:port", f.listen);
    return 2;
  }
  if (!dsec::SplitHostPort(f.admin, &admin_host, &admin_port)) {
    log->error("--admin '{}' is not host:port", f.admin);
    return 2;
  }
  std::string http_host;
  uint16_t http_port = 0;
  const bool http_on = f.http != "off";
  if (http_on && !dsec::SplitHostPort(f.http, &http_host, &http_port)) {
    log->error("--http '{}' is not host:port (or off)", f.http);
    return 2;
  }
  std::string data = dsec::AbsolutePath(f.data_dir);
  if (auto st = dsec::MakeDirs(data, 0700); !st.ok()) {
    log->error("data dir {}: {}", data, st.message());
    return 3;
  }
  auto store = dsec::state::OpenRocksStore(data + "/db");
  if (!store.ok()) {
    log->error("{}", store.status().message());
    return 3;
  }
  std::string node_id;
  uint64_t boot = 0;
  if (auto st = LoadIdentity(store->get(), &node_id, &boot); !st.ok()) {
    log->error("data dir {}: {}", data, st.message());
    return 3;
  }
  auto token = dsec::LoadOrCreateToken(data + "/admin.token");
  if (!token.ok()) {
    log->error("{}", token.status().message());
    return 3;
  }
  std::string sdk_token_path = f.sdk_token_file.empty() ? data + "/sdk.token" : dsec::AbsolutePath(f.sdk_token_file);
  auto sdk_token = dsec::LoadOrCreateToken(sdk_token_path);
  if (!sdk_token.ok()) {
    log->error("{}", sdk_token.status().message());
    return 3;
  }
  dsec::state::GroupCommitter committer(store->get());
  if (f.role == "controller")
    return RunController(f, store->get(), &committer, data, node_id, boot, *token, *sdk_token);
  // Role all: a controller with this one node in its process (the same
  // placement, directory and join as a cluster's). Its store is its own:
  // its tables (nodes, placements, the steps of restartable sessions)
  // share names and keys with the node's.
  std::unique_ptr<dsec::state::Store> controller_store;
  std::unique_ptr<dsec::state::GroupCommitter> controller_committer;
  if (f.role == "all") {
    auto cs = dsec::state::OpenRocksStore(data + "/controller");
    if (!cs.ok()) {
      log->error("{}", cs.status().message());
      return 3;
    }
    controller_store = std::move(*cs);
    controller_committer = std::make_unique<dsec::state::GroupCommitter>(controller_store.get());
  }
  std::string cluster_secret;
  if (f.role == "node") {
    auto secret = dsec::ReadFileToString(dsec::AbsolutePath(f.cluster_secret_file));
    while (secret.ok() && !secret->empty() && (secret->back() == '\n' || secret->back() == ' ')) secret->pop_back();
    if (!secret.ok() || secret->empty()) {
      log->error("--cluster-secret {}: {}", f.cluster_secret_file,
                 secret.ok() ? std::string("empty") : secret.status().message());
      return 2;
    }
    cluster_secret = *secret;
  }

  auto ctx = std::make_shared<dsec::NodeContext>();
  ctx->options.node_id = node_id;
  ctx->options.boot = boot;
  ctx->options.max_inflight_runs = f.max_inflight_runs;
  ctx->options.max_restarts = f.max_restarts;
  ctx->options.restart_window_s = f.restart_window_s;
  ctx->options.session_lease_s = f.session_lease_s;
  ctx->options.sandbox_ttl_s = f.sandbox_ttl_s;
  ctx->options.sandbox_max_ttl_s = f.sandbox_max_ttl_s;
  ctx->options.sandbox_idle_timeout_s = f.sandbox_idle_timeout_s;
  ctx->options.sandbox_on_idle = f.sandbox_on_idle == "destroy" ? dsec::v1::IDLE_ACTION_DESTROY : dsec::v1::IDLE_ACTION_PAUSE;
  ctx->options.sandbox_lease_s = f.sandbox_lease_s;
  if (f.sandbox_max_ttl_s && (f.sandbox_ttl_s == 0 || f.sandbox_ttl_s > f.sandbox_max_ttl_s)) {
    log->error("--sandbox-ttl {} is above --sandbox-max-ttl {} (0 means none, which a maximum rules out)",
               f.sandbox_ttl_s, f.sandbox_max_ttl_s);
    return 2;
  }
  ctx->options.session_retention_s = static_cast<uint32_t>(f.session_retention_h * 3600);
  ctx->options.test_hooks = f.test_hooks;
  ctx->options.image_root = data + "/images";
  ctx->store = store->get();
  ctx->committer = &committer;
  ctx->log = dsec::Logger("node");

  dsec::images::ImageStore image_store(store->get(), ctx->options.image_root);
  dsec::drivers::DriverEnv env;
  env.data_dir = data;
  env.cgroup_parent = f.cgroup_parent;
  env.sandbox_uid = f.sandbox_uid;
  env.sandbox_gid = f.sandbox_gid;
  env.find_image = [&image_store](const std::string& name) { return image_store.Get(name); };
  env.log = DriverLog;
  // A sandbox that ended by itself goes to the node, once there is one.
  struct LostSink {
    std::mutex mu;
    std::optional<dsec::node_actor> node;
  };
  auto lost_sink = std::make_shared<LostSink>();
  env.lost = [lost_sink](const std::string& id, const std::string& why) {
    std::lock_guard<std::mutex> lk(lost_sink->mu);
    if (lost_sink->node) caf::anon_send(*lost_sink->node, dsec::lost_atom::value, id, why);
  };
  kinds.StartAll(env, [&log](const std::string& why) { log->warn("{}", why); });
  ctx->kinds = &kinds;
  if (f.test_hooks) {
    // Driver faults for tests: armed here for what happens at start (re-adoption),
    // later through the console's `fault` command.
    kinds.WrapForFaults();
    for (const auto& spec : f.test_faults) {
      std::vector<std::string> parts;
      for (size_t at = 0;;) {
        size_t colon = spec.find(':', at);
        parts.push_back(spec.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
        if (colon == std::string::npos) break;
        at = colon + 1;
      }
      auto faults = kinds.Faults(parts[0]);
      auto done = faults.ok() ? (*faults)->Command({parts.begin() + 1, parts.end()})
                              : dsec::Result<std::string>(faults.status());
      if (!done.ok()) {
        log->error("--test-fault {}: {}", spec, done.status().message());
        return 2;
      }
      log->warn("test hook: {}", *done);
    }
  } else if (!f.test_faults.empty()) {
    log->error("--test-fault needs --test-hooks (tests only)");
    return 2;
  }

  int rc = 0;
  // Outlives the actor system: the node reads its counters until it quits.
  std::unique_ptr<dsec::FrontDoor> door;
  {
    caf::actor_system_config cfg;
    ConfigureCafFor(f, cfg);
    caf::actor_system sys{cfg};
    auto node = dsec::SpawnNode(sys, ctx);
    {
      std::lock_guard<std::mutex> lk(lost_sink->mu);
      lost_sink->node = node;
    }
    {
      // The node restores sandboxes and sessions (and drivers sweep what no
      // record claims) before its first message: "ready" means all of that.
      caf::scoped_actor self{sys};
      self->request(node, caf::infinite, dsec::admin_atom::value, std::string("status"), std::vector<std::string>{})
          .receive([](const std::string&) {},
                   [&](caf::error& e) { log->warn("node did not answer its first status: {}", sys.render(e)); });
    }
    auto entry = caf::actor_cast<dsec::entry_actor>(node);
    caf::actor link;  // to the controller (role node), or to the one in this process (role all)
    dsec::controller_actor controller;  // role all
    std::shared_ptr<dsec::ControllerContext> cctx;
    if (f.role == "all") {
      cctx = std::make_shared<dsec::ControllerContext>();
      cctx->id = node_id;
      cctx->boot = boot;
      cctx->sdk_token = *sdk_token;
      cctx->heartbeat_ms = f.heartbeat_ms;
      cctx->down_after_ms = f.down_after_ms;
      cctx->store = controller_store.get();
      cctx->committer = controller_committer.get();
      cctx->log = dsec::Logger("controller");
      // Its addresses stay empty: the console and the HTTP server are the
      // node's, and its SDK port is the one below.
      // No image registry of its own: the node's is the one (no second copy).
      controller = dsec::SpawnController(sys, cctx);
      entry = caf::actor_cast<dsec::entry_actor>(controller);  // trainers reach the controller
      // The node joins the controller before any port opens: a trainer's
      // first call (or its Hello after a restart) finds it there.
      auto joined = std::make_shared<std::promise<void>>();
      auto once = std::make_shared<std::once_flag>();
      dsec::LinkOptions lo;
      lo.in_process = caf::actor_cast<caf::actor>(controller);
      lo.slots = f.slots;
      lo.on_joined = [joined, once] { std::call_once(*once, [&] { joined->set_value(); }); };
      link = dsec::SpawnClusterLink(sys, node, ctx, std::move(lo));
      if (joined->get_future().wait_for(std::chrono::seconds(60)) != std::future_status::ready)
        log->error("the node did not join the controller in this process within 60 s (its log says why)");
    }
    // Both ports are behind the front door: nothing of a peer reaches BASP
    // or the console's command loop before it has shown its token.
    // The hint goes to strangers too: no paths in it.
    dsec::SdkDoor sdk_door(sys, entry, *sdk_token,
                           "dsecd's token is in <data-dir>/sdk.token or its --sdk-token-file; clients read it "
                           "from there, from $DSEC_SDK_TOKEN or from ClientOptions::token",
                           DriverLog("door"));
    sdk_door.set_tls(f.tls);
    struct TokenSink {
      std::mutex mu;
      dsec::SdkDoor* door = nullptr;
    };
    auto token_sink = std::make_shared<TokenSink>();
    token_sink->door = &sdk_door;
    dsec::ConsoleOptions copts;
    copts.token = *token;
    auto console = dsec::SpawnConsole(sys, node, copts);
    // Metrics and the status page: asked of the node by the server's own
    // thread, behind the door like the other ports.
    dsec::HttpServer http(sys, node);
    std::vector<dsec::FrontDoorListener> doors;
    doors.push_back(TokenListener(sdk_host, sdk_port, &sdk_door, f));
    doors.push_back(ConsoleListener(admin_host, admin_port, console.gate.get(), copts.max_line));
    if (http_on) doors.push_back(HttpListener(http_host, http_port, http.gate()));
    auto opened = dsec::FrontDoor::Start(doors, DriverLog("door"));
    if (!opened.ok()) {
      log->error("{} (is another dsecd running? pick other ports with --listen / --admin / --http)",
                 opened.status().message());
      rc = 4;
    } else {
      door = std::move(*opened);
      sdk_door.set_port(door->port(0));
      ctx->options.sdk_address = sdk_host + ":" + std::to_string(door->port(0));
      ctx->options.admin_address = admin_host + ":" + std::to_string(door->port(1));
      if (http_on) ctx->options.http_address = http_host + ":" + std::to_string(door->port(2));
      ctx->door = door.get();
    }
    if (rc == 0) {
      nlohmann::json ep{{"pid", ::getpid()},
                        {"node_id", node_id},
                        {"role", f.role},
                        {"sdk", ctx->options.sdk_address},
                        {"admin", ctx->options.admin_address},
                        {"http", ctx->options.http_address}};
      if (auto st = dsec::WriteNodeRecord(*ctx); !st.ok()) log->error("write the node record: {}", st.message());
      if (f.role == "node") {
        // Joins the controller (and rejoins after a loss); from the join
        // on, the SDK port admits the token trainers hold for the cluster.
        dsec::LinkOptions lo;
        lo.host = join_host;
        lo.port = join_port;
        lo.secret = cluster_secret;
        lo.slots = f.slots;
        lo.tls = f.tls;
        lo.on_token = [token_sink](const std::string& t) {
          std::lock_guard<std::mutex> lk(token_sink->mu);
          if (token_sink->door) token_sink->door->AddToken(t);
        };
        link = dsec::SpawnClusterLink(sys, node, ctx, std::move(lo));
      }
      (void)dsec::WriteFileAtomic(data + "/dsecd.json", ep.dump() + "\n", 0644);
      log->info("dsecd {} ready: {} {} (boot {}), SDK on {}, admin console on {}, metrics and status page on {}, "
                "data in {}{}",
                DSEC_VERSION, f.role == "node" ? "cluster node" : "node", node_id, boot, ctx->options.sdk_address,
                ctx->options.admin_address,
                http_on ? "http://" + ctx->options.http_address + "/" : std::string("nothing (--http off)"), data,
                (f.role == "node" ? ", joining the controller at " + f.join : std::string()) + TlsNote(f));
      WaitForStop(log);
      ::unlink((data + "/dsecd.json").c_str());
    }
    // No new connection from here; the door's protocols (which use the
    // actor system) are done once Stop returns.
    if (door) door->Stop();
    http.Stop();
    {
      std::lock_guard<std::mutex> lk(lost_sink->mu);
      lost_sink->node.reset();  // the actor system goes with this block
    }
    {
      std::lock_guard<std::mutex> lk(token_sink->mu);
      token_sink->door = nullptr;  // goes before the actor system
    }
    if (link) caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(console.broker, caf::exit_reason::user_shutdown);
    if (controller) caf::anon_send_exit(controller, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    // The spawner kills its runners and removes its cgroups; runs still in
    // flight end with a platform error the trainer sees (or never sees, if
    // it has gone too).
    // Containers keep running: the next start re-adopts them.
    kinds.StopAll();
  }  // ~actor_system: waits for every actor
  kinds.Release();  // before the image store they use
  if (controller_committer) controller_committer->Stop();
  committer.Stop();
  log->info("stopped");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"dsecd: the dsec sandbox daemon (role all = the embedded single-node platform)"};
  app.set_version_flag("--version", DSEC_VERSION);
  app.add_option("--role", f.role,
                 "all (one node, embedded) | controller (the cluster's entry: placement and the directory) | node "
                 "(runs sandboxes, joins a controller)")
      ->capture_default_str();
  app.add_option("--cluster-listen", f.cluster_listen, "controller: where nodes join, host:port (port 0: any)")
      ->capture_default_str();
  app.add_option("--join", f.join, "node: the controller's --cluster-listen address, HOST:PORT");
  app.add_option("--cluster-secret", f.cluster_secret_file,
                 "the secret nodes prove they share with the controller (controller: created when absent, default "
                 "<data-dir>/cluster.secret; node: required, a copy of the controller's)");
  app.add_option("--slots", f.slots, "node: sandboxes it takes, for placement (0: its memory / 64 MiB; role all: no limit)")
      ->capture_default_str();
  app.add_option("--heartbeat-ms", f.heartbeat_ms, "controller: how often nodes send their heartbeat")
      ->check(CLI::Range(50, 60000))
      ->capture_default_str();
  app.add_option("--node-down-after-ms", f.down_after_ms,
                 "controller: a node without a heartbeat this long is down (its sandboxes are reported lost)")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_flag("--tls", f.tls,
               "TLS (CAF's OpenSSL module) on the SDK and cluster ports, after the door's handshake: every trainer's "
               "and node's connection; a node started with it joins only a controller that has it too");
  app.add_option("--tls-cert", f.tls_files.cert,
                 "with --tls: this dsecd's certificate (PEM); with --tls-key and --tls-ca, peers must show a "
                 "certificate of that CA (without the three: anonymous TLS, encrypted but not authenticated)");
  app.add_option("--tls-key", f.tls_files.key, "with --tls: the private key of --tls-cert (PEM)");
  app.add_option("--tls-ca", f.tls_files.ca, "with --tls: the CA file (PEM) peers' certificates must chain to");
  app.add_option("--data-dir", f.data_dir, "where state lives (RocksDB, admin token)")->capture_default_str();
  app.add_option("--listen", f.listen, "SDK entry host:port (port 0: any)")->capture_default_str();
  app.add_option("--admin", f.admin, "admin console host:port (port 0: any)")->capture_default_str();
  app.add_option("--http", f.http,
                 "metrics (/metrics, Prometheus text) and the status page (/) host:port (port 0: any; off: none)")
      ->capture_default_str();
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error")->capture_default_str();
  app.add_option("--log-file", f.log_file, "also log to this file");
  app.add_option("--threads", f.threads, "actor scheduler threads")->capture_default_str();
  // Each kind's own flags (--fncall-..., --container-..., --sandbox-disk-...).
  dsec::drivers::Registry kinds;
  kinds.AddFlags(app);
  app.add_option("--cgroup-parent", f.cgroup_parent, "cgroups go to <controller>/<parent>/sp<pid>/...")
      ->capture_default_str();
  app.add_option("--sandbox-uid", f.sandbox_uid, "uid programs run as")->capture_default_str();
  app.add_option("--sandbox-gid", f.sandbox_gid, "gid programs run as")->capture_default_str();
  app.add_option("--max-inflight-runs", f.max_inflight_runs, "one-shot runs in flight before refusing")
      ->capture_default_str();
  app.add_option("--max-restarts", f.max_restarts, "supervisor: restarts of one actor ...")->capture_default_str();
  app.add_option("--restart-window", f.restart_window_s, "... within this many seconds")->capture_default_str();
  app.add_option("--session-lease", f.session_lease_s,
                 "seconds a session and its sandboxes outlive their last trainer (a trainer may ask for "
                 "another lease when it opens the session)")
      ->check(CLI::Range(1u, 7u * 24 * 3600))
      ->capture_default_str();
  app.add_option("--sandbox-ttl", f.sandbox_ttl_s,
                 "seconds a plain sandbox lives unless its spec says otherwise (0: forever, if --sandbox-max-ttl is 0)")
      ->capture_default_str();
  app.add_option("--sandbox-max-ttl", f.sandbox_max_ttl_s, "the longest ttl a spec may ask for (0: no maximum)")
      ->capture_default_str();
  app.add_option("--sandbox-idle-timeout", f.sandbox_idle_timeout_s,
                 "seconds without exec or file call after which a plain sandbox is paused or destroyed "
                 "(--sandbox-on-idle) unless its spec says otherwise (0: never)")
      ->capture_default_str();
  app.add_option("--sandbox-on-idle", f.sandbox_on_idle, "pause | destroy")
      ->check(CLI::IsMember({"pause", "destroy"}))
      ->capture_default_str();
  app.add_option("--sandbox-lease", f.sandbox_lease_s,
                 "seconds a sandbox outlives its SDK client's last connection (unless made detached)")
      ->check(CLI::Range(1u, 7u * 24 * 3600))
      ->capture_default_str();
  app.add_option("--session-retention", f.session_retention_h,
                 "hours a closed session's log is kept for dsec-replay")
      ->check(CLI::Range(0.0, 24.0 * 3650))
      ->capture_default_str();
  app.add_option("--sdk-token-file", f.sdk_token_file,
                 "the SDK token clients must prove they hold (created when absent; default <data-dir>/sdk.token)");
  app.add_option("--door-max-pending", f.door_max_pending,
                 "SDK connections in their token handshake at once (a new one pushes out the oldest)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--door-timeout", f.door_timeout_s, "seconds an SDK connection has for its token handshake")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_flag("--test-hooks", f.test_hooks, "honour crash and driver fault injection (tests only)");
  app.add_option("--test-fault", f.test_faults,
                 "with --test-hooks: KIND:OP:fail:N or KIND:OP:hold, armed before the restore (tests only; "
                 "OP: create, exec, destroy, pause, readopt, files)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Signals are waited for in main; block them before any thread starts so
  // no other thread takes them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  dsec::LogOptions lo;
  lo.level = f.log_level;
  lo.file = f.log_file;
  if (auto err = dsec::InitLogging(lo); !err.empty()) {
    std::fprintf(stderr, "dsecd: %s\n", err.c_str());
    return 2;
  }
  int rc = Run(f, kinds);
  dsec::ShutdownLogging();
  return rc;
}
