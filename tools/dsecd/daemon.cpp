#include "tools/dsecd/daemon.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "actors/controller/controller.hpp"
#include "actors/front/console.hpp"
#include "actors/front/e2b/api_keys.hpp"
#include "actors/front/e2b/e2b_door.hpp"
#include "actors/front/status_http.hpp"
#include "actors/front/sdk_entry.hpp"
#include "actors/node/cluster_link.hpp"
#include "actors/node/context.hpp"
#include "actors/node/node.hpp"
#include "actors/node/node_host.hpp"
#include "runtime/door_auth.hpp"
#include "runtime/files.hpp"
#include "drivers/images/image_store.hpp"
#include "tools/dsecd/lazy_node.hpp"
#include "drivers/images/snapshot_store.hpp"
#include "drivers/net/node_network.hpp"
#include "runtime/front_door.hpp"
#include "runtime/http_gate.hpp"
#include "runtime/http_server.hpp"
#include "runtime/log.hpp"
#include "state/group_commit.hpp"
#include "state/store.hpp"
#include "state/table.hpp"
#include "wire/wire.hpp"

namespace dsec::daemon {

namespace {

// The node id survives restarts; the boot counter counts them.
Status LoadIdentity(state::Store* store, std::string* node_id, uint64_t* boot) {
  auto id = store->Get(state::Table::kMeta, "node_id");
  if (id.ok()) *node_id = *id;
  else if (id.status().code() == Status::Code::kNotFound) *node_id = "node-" + RandomHex(8);
  else return id.status();
  auto b = store->Get(state::Table::kMeta, "boot");
  *boot = b.ok() ? std::stoull(*b) + 1 : 1;
  state::WriteBatch batch;
  batch.Put(state::Table::kMeta, "node_id", *node_id);
  batch.Put(state::Table::kMeta, "boot", std::to_string(*boot));
  return store->Write(batch, true);
}

// A driver's log callback (levels 0 debug .. 3 error) into its own logger.
std::function<void(int, const std::string&)> DriverLog(const std::string& name) {
  auto logger = Logger(name);
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
  if (auto cap = ReadFileToString("/proc/sys/fs/nr_open"); cap.ok())
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

// Waits for SIGINT or SIGTERM (blocked by main); logs which.
void WaitForStop(const std::shared_ptr<spdlog::logger>& log) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  log->info("{}: stopping", strsignal(sig));
}

// A host:port flag, parsed before anything starts.
struct Address {
  std::string host;
  uint16_t port = 0;
};

// What a driver thread may reach once there is something to reach, and
// not after it has gone: the node (for sandboxes that end by themselves),
// the SDK door (for a token a controller hands out).
template <class T>
class Sink {
 public:
  void Set(std::optional<T> v) {
    std::lock_guard<std::mutex> lk(mu_);
    v_ = std::move(v);
  }
  template <class Fn>
  void With(Fn&& fn) {
    std::lock_guard<std::mutex> lk(mu_);
    if (v_) fn(*v_);
  }

 private:
  std::mutex mu_;
  std::optional<T> v_;
};

class Daemon {
 public:
  Daemon(const Flags& f, drivers::Registry& kinds) : f_(f), kinds_(kinds), log_(Logger("dsecd")) {}
  ~Daemon() { Stop(); }

  int Run() {
    RaiseOpenFilesLimit(log_);
    if (int rc = CheckFlags()) return rc;
    if (int rc = OpenDataDir()) return rc;
    if (f_.role == "controller") return RunController();
    if (f_.role == "node") return RunNode();
    return RunAll();
  }

 private:
  // ---- the roles ----------------------------------------------------------

  // A controller with this one node in its process (the same placement,
  // directory and join as a cluster's): trainers reach the controller,
  // which delegates each call to its node. The console and the HTTP server
  // are the node's. The controller's store is its own: its tables (nodes,
  // placements, the steps of restartable sessions) share names and keys
  // with the node's.
  int RunAll() {
    if (int rc = OpenControllerStore()) return rc;
    if (int rc = StartKinds()) return rc;
    StartActorSystem();
    SpawnNode();
    auto cctx = ControllerCtx(controller_store_.get(), controller_committer_.get());
    // Its addresses stay empty: the console and the HTTP server are the
    // node's, and its SDK port is the one below. No image registry of its
    // own: the node's is the one.
    controller_ = SpawnController(*sys_, cctx);
    JoinInProcess();
    ListenSdk(caf::actor_cast<entry_actor>(controller_));
    ListenOperators(caf::actor_cast<admin_actor>(node_));
    if (int rc = OpenDoor("--listen / --admin / --http / --e2b")) return rc;
    NodeAddresses();
    return ServeUntilStopped("node " + node_id_);
  }

  // Runs sandboxes and joins a controller; once joined, its SDK port admits
  // the token trainers hold for the cluster.
  int RunNode() {
    if (int rc = LoadClusterSecret()) return rc;
    if (int rc = StartKinds()) return rc;
    StartActorSystem();
    SpawnNode();
    ListenSdk(caf::actor_cast<entry_actor>(node_));
    ListenOperators(caf::actor_cast<admin_actor>(node_));
    if (int rc = OpenDoor("--listen / --admin / --http / --e2b")) return rc;
    NodeAddresses();
    LinkOptions lo;
    lo.host = join_.host;
    lo.port = join_.port;
    lo.secret = cluster_secret_;
    lo.slots = f_.slots;
    lo.tls = f_.tls;
    lo.on_token = [sink = token_sink_](const std::string& t) { sink->With([&](SdkDoor* d) { d->AddToken(t); }); };
    StartChunkRelay(*sys_, controller_slot_);
    lo.on_controller = [slot = controller_slot_](const caf::actor& c) {
      std::lock_guard<std::mutex> lk(slot->mu);
      slot->controller = c;
    };
    link_ = SpawnClusterLink(*sys_, node_, node_ctx_, std::move(lo));
    return ServeUntilStopped("cluster node " + node_id_ + ", joining the controller at " + f_.join);
  }

  // The cluster's entry: no drivers and no sandboxes of its own, the node
  // registry, placement and the directory (docs/cluster.md), and its own
  // image registry (<data-dir>/images) nodes fetch from.
  int RunController() {
    if (int rc = LoadClusterSecret()) return rc;
    StartActorSystem();
    auto cctx = ControllerCtx(store_.get(), committer_.get());
    cctx->image_ctx = std::make_shared<NodeContext>();
    cctx->image_ctx->store = store_.get();
    cctx->image_ctx->log = cctx->log;
    cctx->image_ctx->options.image_root = data_ + "/images";
    cctx->image_ctx->options.image_service = true;
    cctx->lazy_images = f_.image_fetch == "lazy";
    cctx->image_ctx->options.node_id = node_id_;
    controller_ctx_ = cctx;  // its console's e2b-key, once the door has keys (ListenE2b)
    controller_ = SpawnController(*sys_, cctx);
    ListenSdk(caf::actor_cast<entry_actor>(controller_));
    ListenOperators(caf::actor_cast<admin_actor>(controller_));
    cluster_door_ = std::make_unique<SdkDoor>(
        *sys_, door::kCluster, caf::actor_cast<caf::strong_actor_ptr>(controller_),
        sys_->message_types(controller_), cluster_secret_,
        "start the node with --cluster-secret naming a copy of the controller's secret file", DriverLog("door"));
    cluster_door_->set_tls(f_.tls);
    Listen("cluster", cluster_at_, cluster_door_.get(), f_.door_max_pending, f_.door_timeout_s * 1000,
           door::kResponseSize);
    if (int rc = OpenDoor("--listen / --admin / --cluster-listen / --http / --e2b")) return rc;
    cluster_door_->set_port(door_->port("cluster"));
    cctx->sdk_address = door_->address("sdk");
    cctx->admin_address = door_->address("console");
    cctx->http_address = door_->address("http");
    cctx->cluster_address = door_->address("cluster");
    cctx->door = door_.get();
    return ServeUntilStopped("controller " + node_id_ + ", nodes join at " + cctx->cluster_address + " (secret " +
                             secret_path_ + ")");
  }

  // ---- the parts, in the order a start takes them ---------------------------

  // Usage errors: exit 2 before anything is touched.
  int CheckFlags() {
    if (f_.role != "all" && f_.role != "node" && f_.role != "controller") return Usage("--role '" + f_.role + "' is not one of all, controller, node");
    if (f_.role == "node") {
      if (f_.join.empty() || !SplitHostPort(f_.join, &join_.host, &join_.port) || join_.port == 0)
        return Usage("--role node needs --join HOST:PORT (the controller's --cluster-listen address)");
      if (f_.cluster_secret_file.empty())
        return Usage("--role node needs --cluster-secret FILE (a copy of the controller's <data-dir>/cluster.secret)");
    } else if (!f_.join.empty()) {
      return Usage("--join is for --role node");
    }
    if (!f_.tls && !f_.tls_files.empty()) return Usage("--tls-cert, --tls-key and --tls-ca are for --tls");
    if (auto st = tls::Check(f_.tls_files); !st.ok()) return Usage(st.message());
    if (!SplitHostPort(f_.listen, &sdk_at_.host, &sdk_at_.port)) return Usage("--listen '" + f_.listen + "' is not host:port");
    if (!SplitHostPort(f_.admin, &admin_at_.host, &admin_at_.port)) return Usage("--admin '" + f_.admin + "' is not host:port");
    if (f_.http != "off" && !SplitHostPort(f_.http, &http_at_.host, &http_at_.port))
      return Usage("--http '" + f_.http + "' is not host:port (or off)");
    if (f_.e2b != "off" && !SplitHostPort(f_.e2b, &e2b_at_.host, &e2b_at_.port))
      return Usage("--e2b '" + f_.e2b + "' is not host:port (or off)");
    if (f_.role == "controller" && !SplitHostPort(f_.cluster_listen, &cluster_at_.host, &cluster_at_.port))
      return Usage("--cluster-listen '" + f_.cluster_listen + "' is not host:port");
    if (f_.sandbox_max_ttl_s && (f_.sandbox_ttl_s == 0 || f_.sandbox_ttl_s > f_.sandbox_max_ttl_s))
      return Usage("--sandbox-ttl " + std::to_string(f_.sandbox_ttl_s) + " is above --sandbox-max-ttl " +
                   std::to_string(f_.sandbox_max_ttl_s) + " (0 means none, which a maximum rules out)");
    if (!f_.test_hooks && !f_.test_faults.empty()) return Usage("--test-fault needs --test-hooks (tests only)");
    return 0;
  }

  // The data dir, its store (format brought up to date), the node's
  // identity and the tokens: exit 3 when any is unusable.
  int OpenDataDir() {
    data_ = AbsolutePath(f_.data_dir);
    if (auto st = MakeDirs(data_, 0700); !st.ok()) return Fatal(3, "data dir " + data_ + ": " + st.message());
    auto store = state::OpenRocksStore(data_ + "/db");
    if (!store.ok()) return Fatal(3, store.status().message());
    store_ = std::move(*store);
    if (auto st = LoadIdentity(store_.get(), &node_id_, &boot_); !st.ok())
      return Fatal(3, "data dir " + data_ + ": " + st.message());
    auto admin = LoadOrCreateToken(data_ + "/admin.token");
    if (!admin.ok()) return Fatal(3, admin.status().message());
    admin_token_ = *admin;
    std::string sdk_path = f_.sdk_token_file.empty() ? data_ + "/sdk.token" : AbsolutePath(f_.sdk_token_file);
    auto sdk = LoadOrCreateToken(sdk_path);
    if (!sdk.ok()) return Fatal(3, sdk.status().message());
    sdk_token_ = *sdk;
    committer_ = std::make_unique<state::GroupCommitter>(store_.get());
    return 0;
  }

  int OpenControllerStore() {
    auto cs = state::OpenRocksStore(data_ + "/controller");
    if (!cs.ok()) return Fatal(3, cs.status().message());
    controller_store_ = std::move(*cs);
    controller_committer_ = std::make_unique<state::GroupCommitter>(controller_store_.get());
    return 0;
  }

  // A controller makes its secret when it has none; a node reads its copy.
  int LoadClusterSecret() {
    if (f_.role == "controller") {
      secret_path_ = f_.cluster_secret_file.empty() ? data_ + "/cluster.secret" : AbsolutePath(f_.cluster_secret_file);
      auto secret = LoadOrCreateToken(secret_path_);
      if (!secret.ok()) return Fatal(3, secret.status().message());
      cluster_secret_ = *secret;
      return 0;
    }
    auto secret = ReadFileToString(AbsolutePath(f_.cluster_secret_file));
    while (secret.ok() && !secret->empty() && (secret->back() == '\n' || secret->back() == ' ')) secret->pop_back();
    if (!secret.ok() || secret->empty())
      return Usage("--cluster-secret " + f_.cluster_secret_file + ": " +
                   (secret.ok() ? std::string("empty") : secret.status().message()));
    cluster_secret_ = *secret;
    return 0;
  }

  // The node's context and every kind's driver (a kind this host cannot
  // run says why, in the log and in `status`).
  // Sandbox networking for the kinds, or why this node has none (then only
  // mode none is taken, and a spec asking for more is told why).
  void StartNetwork(drivers::DriverEnv* env) {
    env->network_open = f_.network_open;
    if (f_.no_sandbox_network) {
      env->network_unavailable = "off (dsecd --no-sandbox-network)";
      return;
    }
    auto pool = net::ParseRule(f_.sandbox_net);
    net::NodeNetworkOptions no;
    no.log = DriverLog("network");
    no.rules.resolver_port = f_.sandbox_dns_port;
    no.rules.log_group = f_.sandbox_dns_port;  // the refusals' NFLOG group: one per networking dsecd
    for (const auto& u : f_.sandbox_dns_upstream) {
      auto rule = net::ParseRule(u);
      if (!rule.ok() || rule->is_name() || rule->prefix != 32 || rule->ports.size() > 1 ||
          (rule->ports.size() == 1 && rule->ports[0].first != rule->ports[0].last)) {
        env->network_unavailable = "--sandbox-dns-upstream '" + u + "' is not ADDRESS[:PORT] (e.g. 192.0.2.53:53)";
        log_->error("sandbox networking unavailable: {}", env->network_unavailable);
        return;
      }
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(rule->addr);
      a.sin_port = htons(rule->ports.empty() ? 53 : rule->ports[0].first);
      no.upstream.push_back(a);
    }
    Result<std::unique_ptr<net::NodeNetwork>> nn = Status::InvalidArgument(
        "--sandbox-net '" + f_.sandbox_net + "' is not an address range (e.g. 100.96.0.0/12)");
    if (pool.ok() && !pool->is_name() && pool->ports.empty()) {
      no.pool = pool->addr;
      no.pool_prefix = pool->prefix;
      nn = net::NodeNetwork::Start(no);
    }
    if (!nn.ok()) {
      env->network_unavailable = nn.status().message();
      log_->warn("sandbox networking unavailable: {} (sandboxes get network mode none only)", nn.status().message());
      return;
    }
    network_ = std::move(*nn);
    env->network = network_.get();
    log_->info("sandbox networking: table inet {} with sandboxes in {}{}", no.rules.table, f_.sandbox_net,
               f_.network_open ? "; mode open allowed" : "");
  }

  int StartKinds() {
    node_ctx_ = std::make_shared<NodeContext>();
    auto& o = node_ctx_->options;
    o.node_id = node_id_;
    o.boot = boot_;
    o.max_inflight_runs = f_.max_inflight_runs;
    o.slots = f_.slots;
    o.max_restarts = f_.max_restarts;
    o.restart_window_s = f_.restart_window_s;
    o.session_lease_s = f_.session_lease_s;
    o.sandbox_ttl_s = f_.sandbox_ttl_s;
    o.sandbox_max_ttl_s = f_.sandbox_max_ttl_s;
    o.sandbox_idle_timeout_s = f_.sandbox_idle_timeout_s;
    o.sandbox_on_idle = f_.sandbox_on_idle == "destroy" ? v1::IDLE_ACTION_DESTROY : v1::IDLE_ACTION_PAUSE;
    o.sandbox_lease_s = f_.sandbox_lease_s;
    o.session_retention_s = static_cast<uint32_t>(f_.session_retention_h * 3600);
    o.test_hooks = f_.test_hooks;
    o.image_root = data_ + "/images";
    node_ctx_->store = store_.get();
    node_ctx_->committer = committer_.get();
    node_ctx_->log = Logger("node");
    image_store_ = std::make_unique<images::ImageStore>(store_.get(), o.image_root);
    if (f_.role == "node") {
      lazy_ = StartLazyImages(
          f_, data_, controller_slot_, image_store_.get(),
          [sink = lost_sink_](const std::string& id, const std::string& why) {
            sink->With([&](const node_actor& node) { caf::anon_send(node, lost_atom::value, id, why); });
          },
          Logger("images"));
      node_ctx_->lazy = lazy_;
      image_store_->set_lazy(lazy_.get());
    }
    node_ctx_->snapshots = std::make_shared<images::SnapshotStore>(
        store_.get(), data_ + "/snapshots", node_id_, static_cast<uint64_t>(f_.snapshot_gib * double(1ull << 30)));
    for (const auto& line : node_ctx_->snapshots->Load()) log_->warn("{}", line);
    drivers::DriverEnv env;
    env.data_dir = data_;
    env.cgroup_parent = f_.cgroup_parent;
    env.sandbox_uid = f_.sandbox_uid;
    env.sandbox_gid = f_.sandbox_gid;
    env.images = image_store_.get();
    env.log = DriverLog;
    StartNetwork(&env);
    o.network = env.network ? "on: " + f_.sandbox_net + (f_.network_open ? ", mode open allowed" : "")
                            : "off: " + env.network_unavailable;
    // A sandbox that ended by itself goes to the node, once there is one.
    env.lost = [sink = lost_sink_](const std::string& id, const std::string& why) {
      sink->With([&](const node_actor& node) { caf::anon_send(node, lost_atom::value, id, why); });
    };
    kinds_.StartAll(env, [this](const std::string& why) { log_->warn("{}", why); });
    kinds_started_ = true;
    node_ctx_->kinds = &kinds_;
    if (!f_.test_hooks) return 0;
    // Driver faults for tests: armed here for what happens at start
    // (re-adoption), later through the console's `fault` command.
    kinds_.WrapForFaults();
    for (const auto& spec : f_.test_faults) {
      std::vector<std::string> parts;
      for (size_t at = 0;;) {
        size_t colon = spec.find(':', at);
        parts.push_back(spec.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
        if (colon == std::string::npos) break;
        at = colon + 1;
      }
      auto faults = kinds_.Faults(parts[0]);
      auto done = faults.ok() ? (*faults)->Command({parts.begin() + 1, parts.end()}) : Result<std::string>(faults.status());
      if (!done.ok()) return Usage("--test-fault " + spec + ": " + done.status().message());
      log_->warn("test hook: {}", *done);
    }
    return 0;
  }

  void StartActorSystem() {
    cfg_ = std::make_unique<caf::actor_system_config>();
    CafOptions co;
    co.scheduler_threads = f_.threads;
    ConfigureCaf(*cfg_, co);
    if (f_.tls) tls::Configure(*cfg_, f_.tls_files);
    sys_ = std::make_unique<caf::actor_system>(*cfg_);
  }

  // The node restores its sandboxes and sessions (and drivers sweep what no
  // record claims) before its first message: "ready" means all of that.
  void SpawnNode() {
    node_ = dsec::SpawnNode(*sys_, node_ctx_);
    lost_sink_->Set(node_);
    caf::scoped_actor self{*sys_};
    self->request(node_, caf::infinite, admin_atom::value, std::string("status"), std::vector<std::string>{})
        .receive([](const std::string&) {},
                 [&](caf::error& e) { log_->warn("node did not answer its first status: {}", sys_->render(e)); });
  }

  std::shared_ptr<ControllerContext> ControllerCtx(state::Store* store, state::GroupCommitter* committer) {
    auto c = std::make_shared<ControllerContext>();
    c->id = node_id_;
    c->test_hooks = f_.test_hooks;
    c->boot = boot_;
    c->sdk_token = sdk_token_;
    c->heartbeat_ms = f_.heartbeat_ms;
    c->down_after_ms = f_.down_after_ms;
    c->store = store;
    c->committer = committer;
    c->log = Logger("controller");
    return c;
  }

  // Role all: the node joins the controller before any port opens, so a
  // trainer's first call (or its Hello after a restart) finds it there.
  void JoinInProcess() {
    auto joined = std::make_shared<std::promise<void>>();
    auto once = std::make_shared<std::once_flag>();
    LinkOptions lo;
    lo.in_process = caf::actor_cast<caf::actor>(controller_);
    lo.slots = f_.slots;
    lo.on_joined = [joined, once] { std::call_once(*once, [&] { joined->set_value(); }); };
    link_ = SpawnClusterLink(*sys_, node_, node_ctx_, std::move(lo));
    if (joined->get_future().wait_for(std::chrono::seconds(60)) != std::future_status::ready)
      log_->error("the node did not join the controller in this process within 60 s (its log says why)");
  }

  // ---- listeners: every public port behind the front door, by name -------

  void Listen(const std::string& name, const Address& at, HandshakeProtocol* protocol, size_t max_pending,
              double timeout_ms, size_t max_input) {
    FrontDoorListener l;
    l.name = name;
    l.host = at.host;
    l.port = at.port;
    l.protocol = protocol;
    l.max_pending = max_pending;
    l.timeout_ms = static_cast<int>(timeout_ms);
    l.max_input = max_input;
    listeners_.push_back(l);
  }

  // The SDK port: nothing of a peer reaches BASP before it has shown the
  // token. The hint goes to strangers too: no paths in it.
  void ListenSdk(entry_actor entry) {
    sdk_door_ = std::make_unique<SdkDoor>(
        *sys_, entry, sdk_token_,
        "dsecd's token is in <data-dir>/sdk.token or its --sdk-token-file; clients read it from there, from "
        "$DSEC_SDK_TOKEN or from ClientOptions::token",
        DriverLog("door"));
    sdk_door_->set_tls(f_.tls);
    token_sink_->Set(sdk_door_.get());
    Listen("sdk", sdk_at_, sdk_door_.get(), f_.door_max_pending, f_.door_timeout_s * 1000, door::kResponseSize);
    ListenE2b(entry);
  }

  // The E2B door (unless --e2b off): its own HTTP server, asking `entry`
  // as the SDK's calls do; its keys in this dsecd's store.
  void ListenE2b(entry_actor entry) {
    if (f_.e2b == "off") return;
    e2b_keys_ = std::make_shared<e2b::ApiKeys>(store_.get());
    auto said = e2b_keys_->Load(data_ + "/e2b.key");
    if (!said.ok()) {
      log_->error("the E2B door stays closed: its keys: {}", said.status().message());
      return;
    }
    if (!said->empty()) log_->info("{}", *said);
    auto admin = [keys = e2b_keys_](const std::vector<std::string>& args) { return keys->Admin(args); };
    if (node_ctx_) node_ctx_->e2b_keys = admin;
    if (controller_ctx_) controller_ctx_->e2b_keys = admin;
    HttpServerOptions e2b_opts;
    e2b_opts.max_connections = f_.e2b_max_connections;
    e2b_http_ = std::make_unique<HttpServer>(e2b_opts, DriverLog("e2b"));
    auto secret = LoadOrCreateToken(data_ + "/e2b.secret");
    if (!secret.ok()) {
      log_->error("the E2B door stays closed: {}", secret.status().message());
      return;
    }
    e2b_door_ = std::make_unique<e2b::E2bDoor>(*sys_, entry, *e2b_keys_, *secret, *e2b_http_, f_.network_open);
    if (!f_.network_open)
      log_->info("E2B sandboxes that ask for the internet (allowInternetAccess, E2B's default) get none here: "
                 "only what their network.allowOut lists (dsecd --network-open gives them the internet)");
    e2b_http_->Start();
    Listen("e2b", e2b_at_, e2b_http_->gate(), 64, 10'000, HttpGate::kMaxHead);
  }

  // The console (a person typing AUTH into a line client) and, unless
  // --http off, metrics and the status page: both ask `admin`.
  void ListenOperators(admin_actor admin) {
    ConsoleOptions copts;
    copts.token = admin_token_;
    console_ = SpawnConsole(*sys_, admin, copts);
    Listen("console", admin_at_, console_.gate.get(), 64, 60'000, copts.max_line + 2);
    if (f_.http == "off") return;
    http_ = std::make_unique<HttpServer>(HttpServerOptions{}, DriverLog("http"));
    status_http_ = std::make_unique<StatusHttp>(*sys_, admin, *http_);
    http_->Start();
    Listen("http", http_at_, http_->gate(), 64, 10'000, HttpGate::kMaxHead);
  }

  int OpenDoor(const char* flags) {
    auto opened = FrontDoor::Start(listeners_, DriverLog("door"));
    if (!opened.ok())
      return Fatal(4, opened.status().message() + " (is another dsecd running? pick other ports with " + flags + ")");
    door_ = std::move(*opened);
    sdk_door_->set_port(door_->port("sdk"));
    return 0;
  }

  // What the node's status, records and joins say of its ports.
  void NodeAddresses() {
    auto& o = node_ctx_->options;
    o.sdk_address = door_->address("sdk");
    o.admin_address = door_->address("console");
    o.http_address = door_->address("http");
    node_ctx_->door = door_.get();
    if (auto st = WriteNodeRecord(*node_ctx_); !st.ok()) log_->error("write the node record: {}", st.message());
  }

  // <data-dir>/dsecd.json (where tools find the ports) and the ready line;
  // then waits for SIGINT or SIGTERM.
  int ServeUntilStopped(const std::string& who) {
    nlohmann::json ep{{"pid", ::getpid()},
                      {"node_id", node_id_},
                      {"role", f_.role},
                      {"sdk", door_->address("sdk")},
                      {"admin", door_->address("console")},
                      {"http", door_->address("http")},
                      {"e2b", door_->has("e2b") ? door_->address("e2b") : std::string()}};
    if (door_->has("cluster")) ep["cluster"] = door_->address("cluster");
    if (auto st = WriteFileAtomic(data_ + "/dsecd.json", ep.dump() + "\n", 0644); !st.ok())
      log_->warn("{}: tools will not find this dsecd's ports there ({})", data_ + "/dsecd.json", st.message());
    std::string tls;
    if (f_.tls)
      tls = f_.tls_files.empty() ? "; TLS on the SDK and cluster ports (anonymous: no certificates)"
                                 : "; TLS on the SDK and cluster ports, certificates checked against " + f_.tls_files.ca;
    log_->info("dsecd {} ready: {} (boot {}), SDK on {}, admin console on {}, metrics and status page on {}, data in {}{}",
               DSEC_VERSION, who, boot_, door_->address("sdk"), door_->address("console"),
               door_->has("http") ? "http://" + door_->address("http") + "/" : std::string("nothing (--http off)"),
               data_, tls);
    if (door_->has("e2b")) log_->info("E2B API (E2B_API_URL) on http://{}", door_->address("e2b"));
    WaitForStop(log_);
    ::unlink((data_ + "/dsecd.json").c_str());
    return 0;
  }

  // The reverse of the start: no new connection; nothing reaches the node or
  // the SDK door from a driver thread; the actors end (containers keep
  // running: the next start re-adopts them; the spawner kills its runs); the
  // actor system waits for every actor; then the drivers and the stores go.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    if (door_) door_->Stop();
    if (http_) http_->Stop();
    if (status_http_) status_http_->Stop();
    if (e2b_http_) e2b_http_->Stop();
    if (e2b_door_) e2b_door_->Stop();
    lost_sink_->Set(std::nullopt);
    token_sink_->Set(std::nullopt);
    if (sys_) {
      if (link_) caf::anon_send_exit(link_, caf::exit_reason::user_shutdown);
      if (console_.broker) caf::anon_send_exit(console_.broker, caf::exit_reason::user_shutdown);
      if (controller_) caf::anon_send_exit(controller_, caf::exit_reason::user_shutdown);
      if (node_) caf::anon_send_exit(node_, caf::exit_reason::user_shutdown);
    }
    if (kinds_started_) kinds_.StopAll();
    status_http_.reset();
    http_.reset();
    e2b_door_.reset();
    e2b_http_.reset();
    e2b_keys_.reset();
    sdk_door_.reset();
    cluster_door_.reset();
    console_ = Console{};
    link_ = nullptr;
    controller_ = nullptr;
    node_ = nullptr;
    StopChunkRelay(controller_slot_);
    sys_.reset();  // waits for every actor
    if (kinds_started_) kinds_.Release();  // before the image store they use
    if (node_ctx_) node_ctx_->lazy.reset();
    lazy_.reset();
    image_store_.reset();
    if (controller_committer_) controller_committer_->Stop();
    if (committer_) committer_->Stop();
    if (store_) log_->info("stopped");
  }

  int Usage(const std::string& why) { return Fatal(2, why); }
  int Fatal(int code, const std::string& why) {
    log_->error("{}", why);
    return code;
  }

  const Flags& f_;
  drivers::Registry& kinds_;
  std::shared_ptr<spdlog::logger> log_;
  Address sdk_at_, admin_at_, http_at_, e2b_at_, cluster_at_, join_;
  std::string data_, node_id_, admin_token_, sdk_token_, cluster_secret_, secret_path_;
  uint64_t boot_ = 0;
  std::unique_ptr<state::Store> store_, controller_store_;
  std::unique_ptr<state::GroupCommitter> committer_, controller_committer_;
  std::unique_ptr<images::ImageStore> image_store_;
  std::shared_ptr<images::LazyImages> lazy_;  // role node
  std::shared_ptr<ControllerSlot> controller_slot_ = std::make_shared<ControllerSlot>();
  std::unique_ptr<net::NodeNetwork> network_;  // the kinds' (stopped before it goes)
  std::shared_ptr<NodeContext> node_ctx_;
  std::shared_ptr<ControllerContext> controller_ctx_;  // role controller
  bool kinds_started_ = false;
  std::shared_ptr<Sink<node_actor>> lost_sink_ = std::make_shared<Sink<node_actor>>();
  std::shared_ptr<Sink<SdkDoor*>> token_sink_ = std::make_shared<Sink<SdkDoor*>>();
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  node_actor node_;
  controller_actor controller_;
  caf::actor link_;
  Console console_;
  std::unique_ptr<SdkDoor> sdk_door_, cluster_door_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<StatusHttp> status_http_;
  std::shared_ptr<e2b::ApiKeys> e2b_keys_;
  std::unique_ptr<HttpServer> e2b_http_;
  std::unique_ptr<e2b::E2bDoor> e2b_door_;
  std::vector<FrontDoorListener> listeners_;
  // Outlives the actor system: the node reads its counters until it quits.
  std::unique_ptr<FrontDoor> door_;
  bool stopped_ = false;
};

}  // namespace

int Run(const Flags& f, drivers::Registry& kinds) { return Daemon(f, kinds).Run(); }

}  // namespace dsec::daemon
