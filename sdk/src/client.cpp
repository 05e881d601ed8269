#include "dsec/client.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "wire/tls.hpp"
#include "wire/wire.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/door_auth.hpp"
#include "runtime/front_door.hpp"
#include "sdk/src/client_agent.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <mutex>
#include <unordered_map>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sys/random.h>

namespace dsec {

struct Client::Impl {
  ClientOptions options;
  std::string client_id;  // owner of the sandboxes this client makes
  std::string host;
  uint16_t port = 0;
  sdk::AgentShared shared;
  std::atomic<uint64_t> next_stream{1};
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor agent;
  // In a cluster: an agent per node address the controller named (the
  // SDK talks to the node that holds a sandbox or session directly).
  struct Route {
    caf::actor agent;
    std::unique_ptr<sdk::AgentShared> shared;
  };
  std::mutex routes_mu;
  std::unordered_map<std::string, Route> routes;

  ~Impl() {
    // The agents answer everything still pending (Unavailable) and quit;
    // the actor system's destructor waits for that.
    {
      std::lock_guard<std::mutex> lk(routes_mu);
      for (auto& [addr, r] : routes) caf::anon_send(r.agent, caf::close_atom::value);
    }
    if (agent) caf::anon_send(agent, caf::close_atom::value);
    agent = nullptr;
    sys.reset();
  }

  // The agent for calls routed to `route` (a node's SDK address): the
  // client's own for "" or the address it dialed.
  caf::actor AgentFor(const std::string& route) {
    if (route.empty() || route == options.address) return agent;
    std::lock_guard<std::mutex> lk(routes_mu);
    auto it = routes.find(route);
    if (it != routes.end()) return it->second.agent;
    std::string h;
    uint16_t p = 0;
    if (!SplitHostPort(route, &h, &p) || p == 0) return agent;  // not an address: the controller answers
    Route r;
    r.shared = std::make_unique<sdk::AgentShared>();
    r.agent = sdk::SpawnAgent(*sys, h, p, options.token, client_id, options.connect_timeout, r.shared.get(),
                              /*to_node=*/true);
    auto a = r.agent;
    routes.emplace(route, std::move(r));
    return a;
  }

  // Sends `call` to the agent for `route`; one a node's agent cannot send
  // goes to the client's own agent (the controller) instead.
  void Send(const std::string& route, sdk::CallMsg call) {
    caf::actor to = AgentFor(route);
    if (to != agent) call.reroute = [main = agent](sdk::CallMsg c) { caf::anon_send(main, std::move(c)); };
    caf::anon_send(to, std::move(call));
  }

  Status ToStatus(const caf::error& e, std::chrono::milliseconds timeout) const {
    std::string where = host + ":" + std::to_string(port);
    if (Status own; sdk::FromCafError(e, &own)) return own;
    if (e == caf::sec::request_timeout)
      return Status::DeadlineExceeded("no reply from dsecd at " + where + " within " +
                                      std::to_string(timeout.count()) + " ms");
    if (e.category() == caf::atom("system") &&
        static_cast<caf::sec>(e.code()) == caf::sec::request_receiver_down &&
        e.context().match_elements<std::string>())
      return Status::Unavailable(e.context().get_as<std::string>(0));
    if (e == caf::sec::unexpected_message)
      return Status::Internal("dsecd at " + where + " did not understand the request (version mismatch?)");
    return Status::Unavailable("dsecd at " + where + ": " + caf::to_string(e));
  }

  // A reply as the caller sees it: its status as an error, else the reply.
  template <class Reply>
  static void Deliver(const std::function<void(Result<Reply>)>& done, Reply& r) {
    if (r.status().code() != v1::Status::OK) return done(FromProto(r.status()));
    done(std::move(r));
  }

  // With `on_output`, v1::ExecOutput messages for req.stream_id() go there
  // until the reply arrives.
  template <class Reply, class Request>
  void Call(Request req, std::chrono::milliseconds timeout, std::function<void(Result<Reply>)> done,
            std::function<void(const v1::ExecOutput&)> on_output = nullptr) {
    CallVia<Reply>("", std::move(req), timeout, std::move(done), std::move(on_output));
  }

  // The same, to the node at `route` (see AgentFor).
  template <class Reply, class Request>
  void CallVia(const std::string& route, Request req, std::chrono::milliseconds timeout,
               std::function<void(Result<Reply>)> done, std::function<void(const v1::ExecOutput&)> on_output = nullptr) {
    auto shared_done = std::make_shared<std::function<void(Result<Reply>)>>(std::move(done));
    sdk::CallMsg call;
    call.timeout = timeout;
    if constexpr (std::is_same<Request, v1::ExecRequest>::value) call.stream_id = req.stream_id();
    call.on_output = std::move(on_output);
    call.fail = [this, timeout, shared_done](const caf::error& e) { (*shared_done)(ToStatus(e, timeout)); };
    // Called once: the request moves into the message.
    call.send = [this, timeout, shared_done, req = std::move(req)](
                    caf::event_based_actor* self, const caf::actor& entry, std::function<bool()> claim) mutable {
      auto handle = self->request(entry, caf::infinite, std::move(req));
      handle.then(
              [shared_done, claim](Reply& r) {
                if (claim()) Deliver(*shared_done, r);
              },
              [this, timeout, shared_done, claim](caf::error& e) {
                if (claim()) (*shared_done)(ToStatus(e, timeout));
              });
      return handle.id();
    };
    Send(route, std::move(call));
  }

  // An annotation: batched with the others issued at the same time (see
  // CallMsg::annotate).
  void Annotate(const std::string& route, v1::AnnotateStepRequest req,
                std::function<void(Result<v1::StepReply>)> done) {
    auto timeout = options.rpc_timeout;
    auto shared_done = std::make_shared<std::function<void(Result<v1::StepReply>)>>(std::move(done));
    sdk::CallMsg call;
    call.timeout = timeout;
    call.fail = [this, timeout, shared_done](const caf::error& e) { (*shared_done)(ToStatus(e, timeout)); };
    call.annotate = std::make_shared<v1::AnnotateStepRequest>(std::move(req));
    call.annotated = [shared_done](v1::StepReply& r) { Deliver(*shared_done, r); };
    Send(route, std::move(call));
  }

  template <class Reply, class Request>
  Result<Reply> CallSync(Request req, std::chrono::milliseconds timeout) {
    std::promise<Result<Reply>> p;
    auto f = p.get_future();
    Call<Reply>(std::move(req), timeout, [&p](Result<Reply> r) { p.set_value(std::move(r)); });
    return f.get();
  }

  // Runs wait for their own time limit, plus the RPC margin.
  std::chrono::milliseconds ExecTimeout(const v1::SandboxSpec& spec, const v1::ExecRequest& exec) const {
    uint32_t limit = exec.limits().timeout_ms() ? exec.limits().timeout_ms()
                     : spec.limits().timeout_ms() ? spec.limits().timeout_ms()
                                                  : 30'000;
    return std::chrono::milliseconds(limit) + options.rpc_timeout;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

Result<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": " + std::strerror(errno));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > 4096) return Status::InvalidArgument(path + " is not a dsec file (too large)");
  return s;
}

}  // namespace

// 128 random bits in hex: this client's id as the owner of its sandboxes.
static std::string RandomClientId() {
  unsigned char b[16] = {};
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    else if (errno != EINTR) break;
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s.push_back(hex[c >> 4]);
    s.push_back(hex[c & 15]);
  }
  return s;
}

// The data dir and the address, as ResolveClientOptions finds them.
static ClientOptions ResolveAddress(ClientOptions o) {
  if (o.data_dir.empty()) o.data_dir = Env("DSEC_DATA_DIR");
  if (o.data_dir.empty()) o.data_dir = "./dsec-data";
  if (o.address.empty()) o.address = Env("DSEC_ADDR");
  if (o.address.empty()) {
    // A running dsecd says where it listens.
    if (auto ep = ReadSmallFile(o.data_dir + "/dsecd.json"); ep.ok()) {
      auto j = nlohmann::json::parse(*ep, nullptr, false);
      if (j.is_object() && j.contains("sdk") && j["sdk"].is_string()) o.address = j["sdk"].get<std::string>();
    }
  }
  if (o.address.empty()) o.address = "127.0.0.1:7400";
  return o;
}

Result<ClientOptions> ResolveClientOptions(ClientOptions given) {
  ClientOptions o = ResolveAddress(std::move(given));
  if (o.token.empty()) o.token = Env("DSEC_SDK_TOKEN");
  if (o.token.empty()) {
    std::string path = !o.token_file.empty() ? o.token_file : o.data_dir + "/sdk.token";
    auto t = ReadSmallFile(path);
    if (!t.ok())
      return Status::Unauthenticated(
          "no SDK token: " + t.status().message() +
          " (dsecd creates <data-dir>/sdk.token; point $DSEC_DATA_DIR or --data-dir at dsecd's data dir, or set "
          "$DSEC_SDK_TOKEN, ClientOptions::token or token_file)");
    o.token = Trimmed(*t);
  }
  if (o.token.empty()) return Status::Unauthenticated("the SDK token is empty");
  if (o.tls_cert.empty()) o.tls_cert = Env("DSEC_TLS_CERT");
  if (o.tls_key.empty()) o.tls_key = Env("DSEC_TLS_KEY");
  if (o.tls_ca.empty()) o.tls_ca = Env("DSEC_TLS_CA");
  tls::Files files{o.tls_cert, o.tls_key, o.tls_ca};
  if (auto st = tls::Check(files); !st.ok())
    return Status::InvalidArgument(st.message() + " (ClientOptions::tls_cert/tls_key/tls_ca or $DSEC_TLS_CERT/"
                                   "$DSEC_TLS_KEY/$DSEC_TLS_CA)");
  return o;
}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions given) {
  auto resolved = ResolveClientOptions(given);
  // Without a token, still where it would have gone (for a useful error).
  ClientOptions options = resolved.ok() ? std::move(*resolved) : ResolveAddress(std::move(given));
  auto impl = std::make_unique<Impl>();
  if (!SplitHostPort(options.address, &impl->host, &impl->port) || impl->host.empty() || impl->port == 0)
    return Status::InvalidArgument("address '" + options.address + "' is not host:port");
  if (!resolved.ok()) {
    // No token to show: say so, unless nothing listens there at all (the
    // more useful news). The door's challenge is read and left unanswered.
    bool refused = false;
    auto probe = door::Dial(impl->host, impl->port, "", door::kSdk, options.connect_timeout, &refused);
    if (refused)
      return Status::Unavailable("cannot reach dsecd at " + options.address +
                                 ": connection refused (is dsecd running there? start it with `dsecd`, or point "
                                 "--addr / $DSEC_ADDR at it)");
    return resolved.status();
  }
  impl->options = options;
  impl->cfg = std::make_unique<caf::actor_system_config>();
  CafOptions caf_opts;
  caf_opts.scheduler_threads = options.threads;
  ConfigureCaf(*impl->cfg, caf_opts);
  // Ready for TLS: dsecd's door says whether the connection turns into it.
  tls::Configure(*impl->cfg, tls::Files{options.tls_cert, options.tls_key, options.tls_ca});
  impl->sys = std::make_unique<caf::actor_system>(*impl->cfg);
  impl->client_id = RandomClientId();
  impl->agent = sdk::SpawnAgent(*impl->sys, impl->host, impl->port, options.token, impl->client_id,
                                options.connect_timeout, &impl->shared);
  // Wait for the first connection: a cheap GetSandboxRequest for an id that
  // cannot exist tells us the node answers.
  v1::GetSandboxRequest probe;
  probe.set_sandbox_id("");
  auto r = impl->CallSync<v1::SandboxReply>(probe, options.connect_timeout);
  if (!r.ok() && r.status().code() != Status::Code::kNotFound) return r.status();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

bool Client::connected() const { return impl_->shared.connected; }
const std::string& Client::client_id() const { return impl_->client_id; }
uint64_t Client::connections() const { return impl_->shared.connections; }
const ClientOptions& Client::options() const { return impl_->options; }

void Client::RunAsync(const v1::SandboxSpec& spec, v1::ExecRequest exec,
                      std::function<void(Result<v1::ExecResult>)> done) {
  auto timeout = impl_->ExecTimeout(spec, exec);
  v1::RunRequest req;
  *req.mutable_spec() = spec;
  *req.mutable_exec() = std::move(exec);
  impl_->Call<v1::RunReply>(std::move(req), timeout, [done = std::move(done)](Result<v1::RunReply> r) {
    if (!r.ok()) return done(r.status());
    done(std::move(*r->mutable_result()));
  });
}

std::future<Result<v1::ExecResult>> Client::RunAsync(const v1::SandboxSpec& spec, v1::ExecRequest exec) {
  auto p = std::make_shared<std::promise<Result<v1::ExecResult>>>();
  auto f = p->get_future();
  RunAsync(spec, std::move(exec), [p](Result<v1::ExecResult> r) { p->set_value(std::move(r)); });
  return f;
}

Result<v1::ExecResult> Client::Run(const v1::SandboxSpec& spec, v1::ExecRequest exec) {
  std::promise<Result<v1::ExecResult>> p;
  auto f = p.get_future();
  RunAsync(spec, std::move(exec), [&p](Result<v1::ExecResult> r) { p.set_value(std::move(r)); });
  return f.get();
}

Result<Sandbox> Client::Create(const v1::SandboxSpec& spec, const std::string& id) {
  CreateOptions o;
  o.id = id;
  return Create(spec, o);
}

namespace {

// The synchronous form of a callback form: `start(done)`, waited for.
template <class T, class Start>
Result<T> Wait(Start&& start) {
  std::promise<Result<T>> p;
  auto f = p.get_future();
  start([&p](Result<T> r) { p.set_value(std::move(r)); });
  return f.get();
}

template <class Start>
Status WaitStatus(Start&& start) {
  std::promise<Status> p;
  auto f = p.get_future();
  start([&p](Status s) { p.set_value(std::move(s)); });
  return f.get();
}

// A reply's `pick(reply)` to `done`, or its error.
template <class Reply, class T, class Pick>
Done<Reply> Then(Done<T> done, Pick pick) {
  return [done = std::move(done), pick = std::move(pick)](Result<Reply> r) {
    if (!r.ok()) return done(r.status());
    done(pick(*r));
  };
}

template <class Reply>
Done<Reply> StatusOnly(DoneStatus done) {
  return [done = std::move(done)](Result<Reply> r) { done(r.status()); };
}

}  // namespace

Result<Sandbox> Client::Create(const v1::SandboxSpec& spec, const CreateOptions& options) {
  return Wait<Sandbox>([&](Done<Sandbox> d) { CreateAsync(spec, options, std::move(d)); });
}

void Client::CreateAsync(const v1::SandboxSpec& spec, const CreateOptions& options, Done<Sandbox> done) {
  v1::CreateRequest req;
  *req.mutable_spec() = spec;
  req.set_id(options.id);
  req.set_owner(impl_->client_id);
  req.set_detached(options.detached);
  req.set_lease_s(options.lease_s);
  impl_->Call<v1::SandboxReply>(std::move(req), impl_->options.rpc_timeout,
                                Then<v1::SandboxReply>(std::move(done), [this](v1::SandboxReply& r) {
                                  // Connected to its node now: the node learns its owner is there
                                  // (an owner's sandboxes outlive it only by the lease).
                                  impl_->AgentFor(r.sandbox().node_address());
                                  return Sandbox(this, r.sandbox().id(), r.sandbox().spec(),
                                                 r.sandbox().node_address());
                                }));
}

Result<Sandbox> Client::Attach(const std::string& sandbox_id) {
  return Wait<Sandbox>([&](Done<Sandbox> d) { AttachAsync(sandbox_id, std::move(d)); });
}

void Client::AttachAsync(const std::string& sandbox_id, Done<Sandbox> done) {
  AttachVia(this, "", sandbox_id, std::move(done));
}

// Attach through `route`; the sandbox's calls go where the answer says it
// is (a controller names its node), else where it was asked.
void Client::AttachVia(Client* c, const std::string& route, const std::string& sandbox_id, Done<Sandbox> done) {
  v1::GetSandboxRequest req;
  req.set_sandbox_id(sandbox_id);
  c->impl_->CallVia<v1::SandboxReply>(
      route, std::move(req), c->impl_->options.rpc_timeout,
      Then<v1::SandboxReply>(std::move(done), [c, sandbox_id, route](v1::SandboxReply& r) {
        std::string at = r.sandbox().node_address().empty() ? route : r.sandbox().node_address();
        c->impl_->AgentFor(at);  // connected to its node now (see CreateAsync)
        return Sandbox(c, sandbox_id, r.sandbox().spec(), at);
      }));
}

Result<Session> Client::OpenSession(const std::string& name, const v1::SandboxSpec& spec,
                                    const SessionOptions& options) {
  return Wait<Session>([&](Done<Session> d) { OpenSessionAsync(name, spec, options, std::move(d)); });
}

void Client::OpenSessionAsync(const std::string& name, const v1::SandboxSpec& spec, const SessionOptions& options,
                              Done<Session> done) {
  v1::OpenSessionRequest req;
  req.set_name(name);
  *req.mutable_spec() = spec;
  for (const auto& [role, more] : options.more_sandboxes) {
    auto* sb = req.add_more_sandboxes();
    sb->set_role(role);
    *sb->mutable_spec() = more;
  }
  req.set_lease_s(options.lease_s);
  req.set_restartable(options.restartable);
  // Opening creates the session's sandboxes: allow for a busy node.
  impl_->Call<v1::SessionReply>(std::move(req), impl_->options.rpc_timeout * 2,
                                Then<v1::SessionReply>(std::move(done), [this, name](v1::SessionReply& r) {
                                  return Session(this, name, std::move(*r.mutable_session()));
                                }));
}

Result<Session> Client::AttachSession(const std::string& name) {
  return Wait<Session>([&](Done<Session> d) { AttachSessionAsync(name, std::move(d)); });
}

void Client::AttachSessionAsync(const std::string& name, Done<Session> done) {
  v1::GetSessionRequest req;
  req.set_name(name);
  impl_->Call<v1::SessionReply>(std::move(req), impl_->options.rpc_timeout,
                                Then<v1::SessionReply>(std::move(done), [this, name](v1::SessionReply& r) {
                                  return Session(this, name, std::move(*r.mutable_session()));
                                }));
}

void Sandbox::ExecAsync(v1::ExecRequest req, Done<v1::ExecResult> done) const {
  req.set_sandbox_id(id_);
  auto timeout = client_->impl_->ExecTimeout(spec_, req);
  client_->impl_->CallVia<v1::ExecReply>(
      route_, std::move(req), timeout,
      Then<v1::ExecReply>(std::move(done), [](v1::ExecReply& r) { return std::move(*r.mutable_result()); }));
}

std::future<Result<v1::ExecResult>> Sandbox::ExecAsync(v1::ExecRequest req) const {
  auto p = std::make_shared<std::promise<Result<v1::ExecResult>>>();
  auto f = p->get_future();
  ExecAsync(std::move(req), [p](Result<v1::ExecResult> r) { p->set_value(std::move(r)); });
  return f;
}

Result<v1::ExecResult> Sandbox::Exec(v1::ExecRequest req) const {
  return Wait<v1::ExecResult>([&](Done<v1::ExecResult> d) { ExecAsync(std::move(req), std::move(d)); });
}

void Sandbox::ExecStreamAsync(v1::ExecRequest req, OnOutput on_output, Done<v1::ExecResult> done) const {
  req.set_sandbox_id(id_);
  req.set_stream(true);
  req.set_stream_id(client_->impl_->next_stream++);
  auto timeout = client_->impl_->ExecTimeout(spec_, req);
  client_->impl_->CallVia<v1::ExecReply>(
      route_, std::move(req), timeout,
      Then<v1::ExecReply>(std::move(done), [](v1::ExecReply& r) { return std::move(*r.mutable_result()); }),
      std::move(on_output));
}

Result<v1::ExecResult> Sandbox::ExecStream(v1::ExecRequest req, OnOutput on_output) const {
  return Wait<v1::ExecResult>(
      [&](Done<v1::ExecResult> d) { ExecStreamAsync(std::move(req), std::move(on_output), std::move(d)); });
}

template <class Reply, class Request>
void Sandbox::Call(Request req, Done<Reply> done) const {
  req.set_sandbox_id(id_);
  client_->impl_->CallVia<Reply>(route_, std::move(req), client_->impl_->options.rpc_timeout, std::move(done));
}

void Sandbox::GetAsync(Done<v1::SandboxRecord> done) const {
  // A node answers without its own address: the route it was asked through.
  Call<v1::SandboxReply>(v1::GetSandboxRequest(),
                         Then<v1::SandboxReply>(std::move(done), [route = route_](v1::SandboxReply& r) {
                           if (r.sandbox().node_address().empty()) r.mutable_sandbox()->set_node_address(route);
                           return std::move(*r.mutable_sandbox());
                         }));
}
void Sandbox::DestroyAsync(DoneStatus done) const {
  Call<v1::SandboxReply>(v1::DestroyRequest(), StatusOnly<v1::SandboxReply>(std::move(done)));
}
void Sandbox::PauseAsync(DoneStatus done) const {
  Call<v1::SandboxReply>(v1::PauseRequest(), StatusOnly<v1::SandboxReply>(std::move(done)));
}
void Sandbox::ResumeAsync(DoneStatus done) const {
  Call<v1::SandboxReply>(v1::ResumeRequest(), StatusOnly<v1::SandboxReply>(std::move(done)));
}

void Sandbox::ReadFileAsync(const std::string& path, uint64_t max_bytes, Done<std::string> done) const {
  v1::ReadFileRequest req;
  req.set_path(path);
  req.set_max_bytes(max_bytes);
  Call<v1::FileReply>(std::move(req), Then<v1::FileReply>(std::move(done), [](v1::FileReply& r) {
                        return std::move(*r.mutable_content());
                      }));
}

void Sandbox::WriteFileAsync(const std::string& path, const std::string& content, uint32_t mode, bool make_parents,
                             DoneStatus done) const {
  v1::WriteFileRequest req;
  req.set_path(path);
  req.set_content(content);
  req.set_mode(mode);
  req.set_make_parents(make_parents);
  Call<v1::FileReply>(std::move(req), StatusOnly<v1::FileReply>(std::move(done)));
}

void Sandbox::ListFilesAsync(const std::string& path, Done<v1::FileReply> done) const {
  v1::ListFilesRequest req;
  req.set_path(path);
  Call<v1::FileReply>(std::move(req), std::move(done));
}

Result<v1::SandboxRecord> Sandbox::Get() const {
  return Wait<v1::SandboxRecord>([&](Done<v1::SandboxRecord> d) { GetAsync(std::move(d)); });
}
Status Sandbox::Destroy() const {
  return WaitStatus([&](DoneStatus d) { DestroyAsync(std::move(d)); });
}
Status Sandbox::Pause() const {
  return WaitStatus([&](DoneStatus d) { PauseAsync(std::move(d)); });
}
Status Sandbox::Resume() const {
  return WaitStatus([&](DoneStatus d) { ResumeAsync(std::move(d)); });
}
Result<std::string> Sandbox::ReadFile(const std::string& path, uint64_t max_bytes) const {
  return Wait<std::string>([&](Done<std::string> d) { ReadFileAsync(path, max_bytes, std::move(d)); });
}
Status Sandbox::WriteFile(const std::string& path, const std::string& content, uint32_t mode,
                          bool make_parents) const {
  return WaitStatus([&](DoneStatus d) { WriteFileAsync(path, content, mode, make_parents, std::move(d)); });
}
Result<v1::FileReply> Sandbox::ListFiles(const std::string& path) const {
  return Wait<v1::FileReply>([&](Done<v1::FileReply> d) { ListFilesAsync(path, std::move(d)); });
}

void Session::StepAsync(uint64_t index, v1::ExecRequest req, const StepOptions& options,
                        std::function<void(Result<v1::StepReply>)> done) const {
  v1::StepRequest step;
  step.set_session(name_);
  step.set_index(index);
  step.set_sandbox(options.sandbox);
  *step.mutable_meta() = options.meta;
  step.set_not_replayable(options.not_replayable);
  const std::string& role = options.sandbox.empty() ? std::string("agent") : options.sandbox;
  v1::SandboxSpec spec = rec_->spec();
  for (const auto& sb : rec_->sandboxes())
    if (sb.role() == role) spec = sb.spec();
  auto timeout = client_->impl_->ExecTimeout(spec, req);
  *step.mutable_exec() = std::move(req);
  client_->impl_->CallVia<v1::StepReply>(rec_->node_address(), std::move(step), timeout, std::move(done));
}

std::future<Result<v1::StepReply>> Session::StepAsync(uint64_t index, v1::ExecRequest req,
                                                     const StepOptions& options) const {
  auto p = std::make_shared<std::promise<Result<v1::StepReply>>>();
  auto f = p->get_future();
  StepAsync(index, std::move(req), options, [p](Result<v1::StepReply> r) { p->set_value(std::move(r)); });
  return f;
}

Result<v1::StepReply> Session::Step(uint64_t index, v1::ExecRequest req, const StepOptions& options) const {
  return Wait<v1::StepReply>(
      [&](Done<v1::StepReply> d) { StepAsync(index, std::move(req), options, std::move(d)); });
}

void Session::AnnotateAsync(uint64_t index, const v1::StepMeta& meta,
                            std::function<void(Result<v1::StepMeta>)> done) const {
  v1::AnnotateStepRequest req;
  req.set_session(name_);
  req.set_index(index);
  *req.mutable_meta() = meta;
  client_->impl_->Annotate(rec_->node_address(), std::move(req), Then<v1::StepReply>(std::move(done), [](v1::StepReply& r) {
                             return std::move(*r.mutable_step()->mutable_meta());
                           }));
}

std::future<Result<v1::StepMeta>> Session::AnnotateAsync(uint64_t index, const v1::StepMeta& meta) const {
  auto p = std::make_shared<std::promise<Result<v1::StepMeta>>>();
  auto f = p->get_future();
  AnnotateAsync(index, meta, [p](Result<v1::StepMeta> r) { p->set_value(std::move(r)); });
  return f;
}

Result<v1::StepMeta> Session::Annotate(uint64_t index, const v1::StepMeta& meta) const {
  return Wait<v1::StepMeta>([&](Done<v1::StepMeta> d) { AnnotateAsync(index, meta, std::move(d)); });
}

void Session::StepsAsync(uint64_t from, uint32_t limit, Done<v1::StepsReply> done) const {
  v1::ListStepsRequest req;
  req.set_session(name_);
  req.set_from(from);
  req.set_limit(limit);
  client_->impl_->CallVia<v1::StepsReply>(rec_->node_address(), std::move(req), client_->impl_->options.rpc_timeout,
                                          std::move(done));
}

Result<v1::StepsReply> Session::Steps(uint64_t from, uint32_t limit) const {
  return Wait<v1::StepsReply>([&](Done<v1::StepsReply> d) { StepsAsync(from, limit, std::move(d)); });
}

void Session::SandboxAsync(const std::string& role, Done<Sandbox> done) const {
  for (const auto& sb : rec_->sandboxes()) {
    if (sb.role() != role) continue;
    if (sb.id().empty())
      return done(Status::FailedPrecondition("session " + name_ + ": sandbox '" + role +
                                             "' is fncall (a fresh run per step); there is no sandbox to attach to"));
    return Client::AttachVia(client_, rec_->node_address(), sb.id(), std::move(done));
  }
  done(Status::NotFound("session " + name_ + " has no sandbox '" + role + "'"));
}

Result<Sandbox> Session::sandbox(const std::string& role) const {
  return Wait<Sandbox>([&](Done<Sandbox> d) { SandboxAsync(role, std::move(d)); });
}

void Session::GetAsync(Done<v1::SessionRecord> done) const {
  v1::GetSessionRequest req;
  req.set_name(name_);
  client_->impl_->CallVia<v1::SessionReply>(
      rec_->node_address(), std::move(req), client_->impl_->options.rpc_timeout,
      Then<v1::SessionReply>(std::move(done), [](v1::SessionReply& r) { return std::move(*r.mutable_session()); }));
}

Result<v1::SessionRecord> Session::Get() const {
  return Wait<v1::SessionRecord>([&](Done<v1::SessionRecord> d) { GetAsync(std::move(d)); });
}

void Session::CloseAsync(DoneStatus done) const {
  v1::CloseSessionRequest req;
  req.set_name(name_);
  client_->impl_->CallVia<v1::SessionReply>(rec_->node_address(), std::move(req), client_->impl_->options.rpc_timeout,
                                            StatusOnly<v1::SessionReply>(std::move(done)));
}

Status Session::Close() const {
  return WaitStatus([&](DoneStatus d) { CloseAsync(std::move(d)); });
}

void Client::RegisterImageAsync(const v1::ImageManifest& manifest, bool replace, Done<v1::ImageManifest> done) {
  v1::RegisterImageRequest req;
  *req.mutable_manifest() = manifest;
  req.set_replace(replace);
  // Registering hashes the whole file on the node: allow for big images.
  impl_->Call<v1::ImageReply>(
      std::move(req), impl_->options.rpc_timeout * 10,
      Then<v1::ImageReply>(std::move(done), [](v1::ImageReply& r) { return std::move(*r.mutable_image()); }));
}

Result<v1::ImageManifest> Client::RegisterImage(const v1::ImageManifest& manifest, bool replace) {
  return Wait<v1::ImageManifest>(
      [&](Done<v1::ImageManifest> d) { RegisterImageAsync(manifest, replace, std::move(d)); });
}

void Client::GetImageAsync(const std::string& name, Done<v1::ImageManifest> done) {
  v1::GetImageRequest req;
  req.set_name(name);
  impl_->Call<v1::ImageReply>(
      std::move(req), impl_->options.rpc_timeout,
      Then<v1::ImageReply>(std::move(done), [](v1::ImageReply& r) { return std::move(*r.mutable_image()); }));
}

Result<v1::ImageManifest> Client::GetImage(const std::string& name) {
  return Wait<v1::ImageManifest>([&](Done<v1::ImageManifest> d) { GetImageAsync(name, std::move(d)); });
}

void Client::ListImagesAsync(Done<std::vector<v1::ImageManifest>> done) {
  impl_->Call<v1::ImagesReply>(v1::ListImagesRequest(), impl_->options.rpc_timeout,
                               Then<v1::ImagesReply>(std::move(done), [](v1::ImagesReply& r) {
                                 return std::vector<v1::ImageManifest>(r.images().begin(), r.images().end());
                               }));
}

Result<std::vector<v1::ImageManifest>> Client::ListImages() {
  return Wait<std::vector<v1::ImageManifest>>(
      [&](Done<std::vector<v1::ImageManifest>> d) { ListImagesAsync(std::move(d)); });
}

void Client::RemoveImageAsync(const std::string& name, DoneStatus done) {
  v1::RemoveImageRequest req;
  req.set_name(name);
  impl_->Call<v1::ImageReply>(std::move(req), impl_->options.rpc_timeout,
                              StatusOnly<v1::ImageReply>(std::move(done)));
}

Status Client::RemoveImage(const std::string& name) {
  return WaitStatus([&](DoneStatus d) { RemoveImageAsync(name, std::move(d)); });
}

v1::ExecRequest Command(std::vector<std::string> argv) {
  v1::ExecRequest r;
  for (auto& a : argv) r.add_argv(std::move(a));
  return r;
}

v1::SandboxSpec FncallSpec() {
  v1::SandboxSpec s;
  s.set_kind(v1::KIND_FNCALL);
  return s;
}

v1::SandboxSpec ContainerSpec(const std::string& image) {
  v1::SandboxSpec s;
  s.set_kind(v1::KIND_CONTAINER);
  s.set_image(image);
  return s;
}

}  // namespace dsec
