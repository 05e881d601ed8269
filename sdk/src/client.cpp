#include "dsec/client.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "wire/tls.hpp"
#include "wire/wire.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/door_auth.hpp"
#include "runtime/front_door.hpp"
#include "sdk/src/client_agent.hpp"
#include "sdk/src/client_impl.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <mutex>
#include <unordered_map>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sys/random.h>

namespace dsec {


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
  if (options.grade.command_size()) *req.mutable_grade() = options.grade;
  if (!options.fork_of.session().empty()) *req.mutable_fork_of() = options.fork_of;
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

void Client::ListSandboxesAsync(const v1::ListSandboxesRequest& filter, Done<v1::ListSandboxesReply> done) {
  // A controller asks every node: allow for each of them to answer.
  impl_->Call<v1::ListSandboxesReply>(filter, impl_->options.rpc_timeout * 2, std::move(done));
}

Result<v1::ListSandboxesReply> Client::ListSandboxes(const v1::ListSandboxesRequest& filter) {
  return Wait<v1::ListSandboxesReply>([&](Done<v1::ListSandboxesReply> d) { ListSandboxesAsync(filter, std::move(d)); });
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
