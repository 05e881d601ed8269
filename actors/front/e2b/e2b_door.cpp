#include "actors/front/e2b/e2b_door.hpp"

#include "actors/front/e2b/door_internal.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "dsec/status_proto.hpp"
#include "runtime/metrics.hpp"
#include "runtime/clock.hpp"
#include "runtime/files.hpp"

namespace dsec::e2b {

std::string EnvdPath(const std::string& path, const std::string& user) {
  if (!path.empty() && path[0] == '/') return path;
  std::string home = user.empty() || user == "root" ? "/root" : "/home/" + user;
  return path.empty() ? home : home + "/" + path;
}

std::string Rfc3339(int64_t ms) {
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[40];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(((ms % 1000) + 1000) % 1000));
  return buf;
}

namespace {
using nlohmann::json;
// A metrics window that ended this long before now (its end is in whole
// seconds) still gets the sample of now.
constexpr int64_t kMetricsSlackS = 10;
// The most one upload may carry (POST /files), compressed or not.
constexpr size_t kMaxUpload = 64u << 20;

}  // namespace

void Error(const std::shared_ptr<HttpResponder>& reply, int code, const std::string& message) {
  reply->Send(code, kJson, json{{"code", code}, {"message", message}}.dump());
}

// dsec's status as E2B's HTTP status.
int HttpCode(const Status& s) {
  switch (s.code()) {
    case Status::Code::kNotFound: return 404;
    case Status::Code::kInvalidArgument: return 400;
    case Status::Code::kAlreadyExists:
    case Status::Code::kFailedPrecondition: return 409;
    case Status::Code::kResourceExhausted: return 429;
    case Status::Code::kUnavailable: return 503;
    case Status::Code::kUnimplemented: return 501;
    case Status::Code::kUnauthenticated: return 401;
    case Status::Code::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

void Error(const std::shared_ptr<HttpResponder>& reply, const Status& s) { Error(reply, HttpCode(s), s.message()); }


bool E2bId(const std::string& id) {
  return !id.empty() && id.size() <= 64 &&
         std::all_of(id.begin(), id.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

namespace {

std::string Decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> Query(const std::string& q) {
  std::map<std::string, std::string> out;
  size_t at = 0;
  while (at <= q.size() && !q.empty()) {
    size_t amp = q.find('&', at);
    std::string part = q.substr(at, amp == std::string::npos ? std::string::npos : amp - at);
    size_t eq = part.find('=');
    if (!part.empty()) out[Decode(part.substr(0, eq))] = eq == std::string::npos ? "" : Decode(part.substr(eq + 1));
    if (amp == std::string::npos) break;
    at = amp + 1;
  }
  return out;
}

// A record as E2B's SandboxInfo / ListedSandbox.
json Info(const v1::SandboxRecord& r) {
  json metadata = json::object();
  for (const auto& [k, v] : r.spec().labels()) metadata[k] = v;
  uint32_t millis = r.spec().limits().cpu_millis();
  json out = {{"sandboxID", r.id()},
              {"templateID", r.spec().image()},
              {"clientID", r.node_id()},
              {"startedAt", Rfc3339(r.created_ms())},
              {"endAt", Rfc3339(r.ttl_deadline_ms() ? r.ttl_deadline_ms() : r.created_ms())},
              {"state", r.phase() == v1::SANDBOX_PHASE_PAUSED ? "paused" : "running"},
              {"cpuCount", millis ? (millis + 999) / 1000 : 1},
              {"memoryMB", r.spec().limits().memory_bytes() >> 20},
              {"diskSizeMB", r.spec().limits().disk_bytes() >> 20},
              {"envdVersion", kEnvdVersion},
              {"metadata", metadata},
              {"lifecycle", {{"onTimeout", r.spec().on_ttl() == v1::IDLE_ACTION_PAUSE ? "pause" : "kill"},
                             {"autoResume", r.spec().resume_on_call()}}}};
  // Its network as E2B says it: the internet, or what it may reach.
  const auto& net = r.spec().network();
  out["allowInternetAccess"] = net.mode() == v1::NETWORK_MODE_OPEN;
  if (net.mode() != v1::NETWORK_MODE_OPEN)
    out["network"] = {{"allowOut", json(std::vector<std::string>(net.allow().begin(), net.allow().end()))},
                      {"denyOut", json::array({"0.0.0.0/0"})}};
  return out;
}

std::string Token(const std::string& secret, const std::string& id) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(id.data()),
       id.size(), md, &len);
  return HexOf(md, 16);
}

json Created(const v1::SandboxRecord& r, const std::string& secret) {
  return {{"sandboxID", r.id()},
          {"templateID", r.spec().image()},
          {"clientID", r.node_id()},
          {"envdVersion", kEnvdVersion},
          {"envdAccessToken", Token(secret, r.id())}};
}

namespace {

// The parts of a multipart/form-data body: (filename, data) each.
bool Multipart(const std::string& type, const std::string& body, std::vector<std::pair<std::string, std::string>>* out) {
  size_t b = type.find("boundary=");
  if (b == std::string::npos) return false;
  std::string boundary = type.substr(b + 9);
  if (size_t semi = boundary.find(';'); semi != std::string::npos) boundary.resize(semi);
  if (boundary.size() > 1 && boundary.front() == '"') boundary = boundary.substr(1, boundary.size() - 2);
  const std::string delim = "--" + boundary;
  size_t at = body.find(delim);
  while (at != std::string::npos) {
    at += delim.size();
    if (body.compare(at, 2, "--") == 0) return true;  // the closing delimiter
    if (body.compare(at, 2, "\r\n") != 0) return false;
    size_t head_end = body.find("\r\n\r\n", at);
    size_t next = body.find("\r\n" + delim, at);
    if (head_end == std::string::npos || next == std::string::npos || head_end > next) return false;
    std::string head = body.substr(at + 2, head_end - at - 2);
    size_t fn = head.find("filename=\"");
    std::string name;
    if (fn != std::string::npos) name = head.substr(fn + 10, head.find('"', fn + 10) - fn - 10);
    out->emplace_back(name, body.substr(head_end + 4, next - head_end - 4));
    at = next + 2;
  }
  return false;
}

}  // namespace

bool Gone(const v1::SandboxRecord& r) {
  return r.phase() == v1::SANDBOX_PHASE_STOPPED || r.phase() == v1::SANDBOX_PHASE_STOPPING;
}

bool Body(const Call& c, json* out) {
  if (c.req.body.empty()) {
    *out = json::object();
    return true;
  }
  *out = json::parse(c.req.body, nullptr, false);
  if (out->is_object()) return true;
  Error(c.reply, 400, "the request body is not a JSON object");
  return false;
}

bool Seconds(const Call& c, const json& body, const char* field, uint32_t dflt, uint32_t* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    *out = dflt;
    return true;
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 30 * 86400) {
    Error(c.reply, 400, std::string("'") + field + "' must be a whole number of seconds from 1 to 2592000");
    return false;
  }
  *out = static_cast<uint32_t>(it->get<int64_t>());
  return true;
}

namespace {

// A map of strings, or an answer of 400.
bool Strings(const Call& c, const json& body, const char* field,
             google::protobuf::Map<std::string, std::string>* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_object()) {
    Error(c.reply, 400, std::string("'") + field + "' must be an object of strings");
    return false;
  }
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string()) {
      Error(c.reply, 400, std::string("'") + field + "." + k + "' must be a string");
      return false;
    }
    (*out)[k] = v.get<std::string>();
  }
  return true;
}

// The call a request is, as dsec_e2b_requests_total names it.
std::string CallName(const std::string& method, const std::string& path) {
  if (path == "/sandboxes") return method == "POST" ? "create" : "other";
  if (path == "/v2/sandboxes") return "list";
  if (path == "/snapshots") return "snapshots";
  if (path.rfind("/templates/", 0) == 0) return method == "DELETE" ? "delete_snapshot" : "other";
  if (path.rfind("/sandboxes/", 0) != 0) return "other";
  std::string rest = path.substr(11);
  size_t slash = rest.find('/');
  std::string sub = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (sub.empty()) return method == "GET" ? "get" : method == "DELETE" ? "kill" : "other";
  if (sub == "snapshots") return "snapshot";
  if (sub == "network") return "network";
  return sub == "timeout" || sub == "connect" || sub == "pause" || sub == "metrics" || sub == "fork" ? sub : "other";
}

// Counts each answer in dsec_e2b_requests_total, then passes it on.
class Counted final : public HttpResponder {
 public:
  Counted(std::shared_ptr<HttpResponder> inner, std::string call) : inner_(std::move(inner)), call_(std::move(call)) {}
  void Send(int code, const std::string& type, std::string body, HttpHeaders extra) override {
    Count(code);
    inner_->Send(code, type, std::move(body), std::move(extra));
  }
  void Begin(int code, const std::string& type, HttpHeaders extra) override {
    Count(code);
    inner_->Begin(code, type, std::move(extra));
  }
  bool Write(std::string chunk) override { return inner_->Write(std::move(chunk)); }
  void End() override { inner_->End(); }
  void Abort() override { inner_->Abort(); }
  bool gone() const override { return inner_->gone(); }

 private:
  void Count(int code) {
    metrics::E2bRequests().At(metrics::Labels({{"call", call_}, {"code", std::to_string(code)}})).Add();
  }
  std::shared_ptr<HttpResponder> inner_;
  std::string call_;
};

class Door {
 public:
  Door(caf::event_based_actor* self, entry_actor entry, std::string secret, bool internet_open)
      : self_(self), entry_(std::move(entry)), secret_(std::move(secret)), internet_open_(internet_open) {}

  void Handle(Call& c) {
    const std::string& m = c.req.method;
    const std::string& p = c.req.path;
    if (ServePort(self_, entry_, c)) return;  // a service in a sandbox, by its port
    if (p == "/health" || p == "/files") return Envd(c);
    if (p.rfind("/filesystem.Filesystem/", 0) == 0 || p.rfind("/process.Process/", 0) == 0)
      return ServeEnvdRpc(self_, entry_, c, *c.req.Header("e2b-sandbox-id"));
    if (ServeSnapshots(self_, entry_, c, secret_)) return;
    if (m == "POST" && p == "/sandboxes") return Create(c);
    if (m == "GET" && p == "/v2/sandboxes") return ListSandboxes(self_, entry_, c);
    if (p.rfind("/sandboxes/", 0) == 0) {
      std::string rest = p.substr(11);
      std::string id = rest.substr(0, rest.find('/'));
      std::string sub = rest.size() > id.size() ? rest.substr(id.size()) : "";
      if (!E2bId(id)) return Error(c.reply, 404, "sandbox '" + id.substr(0, 64) + "' not found");
      if (m == "GET" && sub.empty()) return Get(c, id);
      if (m == "DELETE" && sub.empty()) return Kill(c, id);
      if (m == "POST" && sub == "/timeout") return Timeout(c, id);
      if (m == "POST" && sub == "/connect") return Connect(c, id);
      if (m == "POST" && sub == "/pause") return Pause(c, id);
      if (m == "GET" && sub == "/metrics") return Metrics(c, id);
      if (m == "PUT" && sub == "/network") return UpdateNetwork(self_, entry_, c, id, internet_open_);
    }
    Error(c.reply, 404, m + " " + p + " is not an E2B call this door serves (docs/e2b.md lists them)");
  }

 private:
  template <class Reply, class Req>
  void Ask(const std::shared_ptr<HttpResponder>& reply, Req req, std::function<void(Reply&)> ok) {
    e2b::Ask<Reply>(self_, entry_, reply, std::move(req), std::move(ok));
  }

  // The sandbox's record, or 404 when it has ended.
  void Live(const std::shared_ptr<HttpResponder>& reply, const std::string& id,
            std::function<void(const v1::SandboxRecord&)> ok) {
    v1::GetSandboxRequest get;
    get.set_sandbox_id(id);
    Ask<v1::SandboxReply>(reply, std::move(get), [reply, id, ok](v1::SandboxReply& r) {
      if (Gone(r.sandbox())) return Error(reply, 404, "sandbox " + id + " ended");
      ok(r.sandbox());
    });
  }

  void Create(Call& c) {
    json body;
    if (!Body(c, &body)) return;
    auto t = body.find("templateID");
    if (t == body.end() || !t->is_string() || t->get<std::string>().empty())
      return Error(c.reply, 400, "'templateID' (a dsec image's name) is required");
    v1::CreateRequest req;
    req.set_id("e" + RandomHex(19));
    req.set_detached(true);
    auto* spec = req.mutable_spec();
    spec->set_image(t->get<std::string>());
    uint32_t timeout = 0;
    if (!Seconds(c, body, "timeout", kDefaultTimeoutS, &timeout)) return;
    spec->set_ttl_s(timeout);
    if (!Strings(c, body, "metadata", spec->mutable_labels()) || !Strings(c, body, "envVars", spec->mutable_env()))
      return;
    auto allow = body.find("allow_internet_access");
    auto net = body.find("network");
    auto policy = E2bNetwork(allow == body.end() ? nullptr : &*allow, net == body.end() ? json() : *net, internet_open_);
    if (!policy.ok()) return Error(c.reply, 400, policy.status().message());
    *spec->mutable_network() = std::move(*policy);
    // lifecycle.onTimeout 'pause': paused (with memory) at its timeout's
    // end instead of killed; autoResume: a call to it while paused resumes it.
    if (auto ap = body.find("autoPause"); ap != body.end() && ap->is_boolean() && ap->get<bool>())
      spec->set_on_ttl(v1::IDLE_ACTION_PAUSE);
    if (auto ar = body.find("autoResume"); ar != body.end() && ar->is_object() && ar->value("enabled", false) == true)
      spec->set_resume_on_call(true);
    // The kind: the metadata key dsec.kind, else a container (else, from
    // a snapshot, its sandbox's).
    std::string kind = spec->labels().count("dsec.kind") ? spec->labels().at("dsec.kind") : "";
    if (kind == "container") spec->set_kind(v1::KIND_CONTAINER);
    else if (kind == "microvm") spec->set_kind(v1::KIND_MICROVM);
    else if (kind == "vm") spec->set_kind(v1::KIND_VM);
    else if (!kind.empty())
      return Error(c.reply, 400, "metadata dsec.kind '" + kind.substr(0, 32) + "': container, microvm or vm");
    // A template is an image, or a snapshot (E2B's createSnapshot) by its name.
    auto reply = c.reply;
    auto made = std::make_shared<v1::CreateRequest>(std::move(req));
    FindSnapshot(self_, entry_, t->get<std::string>(), [this, reply, made](Result<v1::SnapshotInfo> snap) {
      auto* spec = made->mutable_spec();
      if (snap.ok()) {
        spec->set_snapshot(spec->image());
        spec->clear_image();
      } else if (snap.status().code() != Status::Code::kNotFound) {
        return Error(reply, snap.status());
      } else if (spec->kind() == v1::KIND_UNSPECIFIED) {
        spec->set_kind(v1::KIND_CONTAINER);
      }
      Ask<v1::SandboxReply>(reply, std::move(*made), [reply, secret = secret_](v1::SandboxReply& r) {
        reply->Send(201, kJson, Created(r.sandbox(), secret).dump());
      });
    });
  }

  void Get(Call& c, const std::string& id) {
    auto reply = c.reply;
    Live(reply, id, [reply](const v1::SandboxRecord& r) { reply->Send(200, kJson, Info(r).dump()); });
  }

  // E2B's metrics: dsec keeps no history, so one sample, taken now
  // (UsageRequest): none when the window asked for ended before now, or the
  // sandbox is paused (nothing of it runs).
  void Metrics(Call& c, const std::string& id) {
    auto q = Query(c.req.query);
    int64_t end = q.count("end") ? std::strtoll(q["end"].c_str(), nullptr, 10) : 0;
    auto reply = c.reply;
    if (end > 0 && end < WallClockMs() / 1000 - kMetricsSlackS) return reply->Send(200, kJson, "[]");
    v1::UsageRequest req;
    req.set_sandbox_id(id);
    self_->request(entry_, kCallTimeout, std::move(req))
        .then(
            [reply](v1::UsageReply& r) {
              Status s = FromProto(r.status());
              if (s.code() == Status::Code::kFailedPrecondition) return reply->Send(200, kJson, "[]");
              if (!s.ok()) return Error(reply, s);
              const v1::SandboxUsage& u = r.usage();
              json m = {{"timestamp", Rfc3339(u.at_ms())},
                        {"timestampUnix", u.at_ms() / 1000},
                        {"cpuCount", u.cpu_count()},
                        {"cpuUsedPct", std::round(u.cpu_used_pct() * 100) / 100},
                        {"memUsed", u.mem_used_bytes()},
                        {"memTotal", u.mem_total_bytes()},
                        {"memCache", u.mem_cache_bytes()},
                        {"diskUsed", u.disk_used_bytes()},
                        {"diskTotal", u.disk_total_bytes()}};
              reply->Send(200, kJson, json::array({m}).dump());
            },
            [reply](caf::error& e) { Error(reply, 503, "dsec did not answer: " + caf::to_string(e)); });
  }

  void Kill(Call& c, const std::string& id) {
    v1::DestroyRequest req;
    req.set_sandbox_id(id);
    req.set_reason("killed through the E2B API");
    auto reply = c.reply;
    Ask<v1::SandboxReply>(reply, std::move(req), [reply](v1::SandboxReply&) { reply->Send(204, kJson, ""); });
  }

  void Timeout(Call& c, const std::string& id) {
    json body;
    uint32_t timeout = 0;
    if (!Body(c, &body) || !Seconds(c, body, "timeout", 0, &timeout)) return;
    if (timeout == 0) return Error(c.reply, 400, "'timeout' (seconds from now) is required");
    v1::SetTimeoutRequest req;
    req.set_sandbox_id(id);
    req.set_timeout_s(timeout);
    auto reply = c.reply;
    Ask<v1::SandboxReply>(reply, std::move(req), [reply](v1::SandboxReply&) { reply->Send(204, kJson, ""); });
  }

  // E2B's connect: resumes a paused sandbox (201) or finds it running
  // (200); its timeout only ever moves later.
  void Connect(Call& c, const std::string& id) {
    json body;
    uint32_t timeout = 0;
    if (!Body(c, &body) || !Seconds(c, body, "timeout", kDefaultTimeoutS, &timeout)) return;
    auto reply = c.reply;
    Live(reply, id, [this, reply, id, timeout](const v1::SandboxRecord& r) {
      bool paused = r.phase() == v1::SANDBOX_PHASE_PAUSED;
      auto answer = [reply, paused, created = Created(r, secret_)](v1::SandboxReply&) {
        reply->Send(paused ? 201 : 200, kJson, created.dump());
      };
      auto extend = [this, reply, id, timeout, deadline = r.ttl_deadline_ms(), answer](v1::SandboxReply& after) {
        if (deadline >= WallClockMs() + int64_t{timeout} * 1000) return answer(after);
        v1::SetTimeoutRequest t;
        t.set_sandbox_id(id);
        t.set_timeout_s(timeout);
        Ask<v1::SandboxReply>(reply, std::move(t), answer);
      };
      if (!paused) {
        v1::SandboxReply none;
        return extend(none);
      }
      v1::ResumeRequest resume;
      resume.set_sandbox_id(id);
      Ask<v1::SandboxReply>(reply, std::move(resume), extend);
    });
  }

  void Pause(Call& c, const std::string& id) {
    auto reply = c.reply;
    Live(reply, id, [this, reply, id](const v1::SandboxRecord& r) {
      if (r.phase() == v1::SANDBOX_PHASE_PAUSED) return Error(reply, 409, "sandbox " + id + " is already paused");
      v1::PauseRequest p;
      p.set_sandbox_id(id);
      p.set_memory(true);  // E2B's pause keeps the memory and gives the host its RAM back
      // A pause dsec refuses (a networked VM's memory): 400 saying why, not
      // E2B's 409, which the SDK takes for "already paused" (and says nothing).
      self_->request(entry_, kCallTimeout, std::move(p))
          .then(
              [reply](v1::SandboxReply& r) {
                Status s = FromProto(r.status());
                if (s.code() == Status::Code::kFailedPrecondition) return Error(reply, 400, s.message());
                if (!s.ok()) return Error(reply, s);
                reply->Send(204, kJson, "");
              },
              [reply](caf::error& e) { Error(reply, 503, "dsec did not answer: " + caf::to_string(e)); });
    });
  }

  // envd's REST calls (the sandbox by E2b-Sandbox-Id, its token checked
  // by the handler): /health, and /files to read and write files.
  void Envd(Call& c) {
    if (!c.req.Header("e2b-sandbox-id")) {  // a signed URL's: its signer's (the handler checked the rest)
      auto call = std::make_shared<Call>(std::move(c));
      return FindSigner(self_, entry_, secret_, call->req, [this, call](Result<std::string> id) {
        if (!id.ok()) return Error(call->reply, id.status());
        call->req.headers.emplace_back("e2b-sandbox-id", *id);
        Envd(*call);
      });
    }
    const std::string id = *c.req.Header("e2b-sandbox-id");
    auto reply = c.reply;
    if (c.req.path == "/health") {  // 204 running; 502 (as E2B's proxy says of a gone one) otherwise
      v1::GetSandboxRequest get;
      get.set_sandbox_id(id);
      self_->request(entry_, kCallTimeout, std::move(get))
          .then(
              [reply, id](v1::SandboxReply& r) {
                if (FromProto(r.status()).ok() && r.sandbox().phase() == v1::SANDBOX_PHASE_RUNNING)
                  return reply->Send(204, kJson, "");
                Error(reply, 502, "sandbox " + id + " is not running");
              },
              [reply](caf::error& e) { Error(reply, 503, "dsec did not answer: " + caf::to_string(e)); });
      return;
    }
    auto q = Query(c.req.query);
    const std::string user = EnvdUser(q.count("username") ? q["username"] : "");
    if (c.req.method == "GET") {
      if (!q.count("path")) return Error(reply, 400, "path is required");
      v1::ReadFileRequest req;
      req.set_sandbox_id(id);
      req.set_path(EnvdPath(q["path"], user));
      return Ask<v1::FileReply>(reply, std::move(req), [reply](v1::FileReply& r) {
        reply->Send(200, "application/octet-stream", std::move(*r.mutable_content()));
      });
    }
    std::vector<std::pair<std::string, std::string>> files;
    // envd 0.5.7: a raw body may come gzip-compressed (the SDK's gzip: true).
    if (const std::string* enc = c.req.Header("content-encoding"); enc && *enc != "identity") {
      if (*enc != "gzip") return Error(reply, 400, "Content-Encoding '" + enc->substr(0, 64) + "' is not taken (gzip is)");
      auto plain = Gunzip(c.req.body, kMaxUpload);
      if (!plain.ok()) return Error(reply, plain.status());
      c.req.body = std::move(*plain);
    }
    const std::string* type = c.req.Header("content-type");
    if (type && type->rfind("multipart/form-data", 0) == 0) {
      if (!Multipart(*type, c.req.body, &files) || files.empty())
        return Error(reply, 400, "the body is not multipart/form-data with a file part");
    } else {
      files.emplace_back("", std::move(c.req.body));
    }
    for (const auto& f : files)  // all checked before any is written
      if (!q.count("path") && f.first.empty())
        return Error(reply, 400, "each file needs a path (the query's path or its part's filename)");
    // envd 0.6.2: X-Metadata-<key> headers are every file's metadata, kept
    // as its user.e2b.<key> extended attributes (a rewrite drops others).
    json metadata = json::object();
    for (const auto& [name, value] : c.req.headers)
      if (name.rfind("x-metadata-", 0) == 0 && name.size() > 11) metadata[name.substr(11)] = value;
    auto written = std::make_shared<json>(json::array());
    auto left = std::make_shared<size_t>(files.size());
    auto failed = std::make_shared<bool>(false);
    for (auto& [name, data] : files) {
      std::string path = q.count("path") ? q["path"] : name;
      v1::WriteFileRequest req;
      req.set_sandbox_id(id);
      req.set_path(EnvdPath(path, user));
      req.set_content(std::move(data));
      req.set_make_parents(true);
      req.set_user(user);
      for (const auto& [k, v] : metadata.items()) (*req.mutable_xattrs())["e2b." + k] = v.get<std::string>();
      req.set_xattrs_replace("e2b.");
      std::string full = req.path();
      written->push_back({{"name", full.substr(full.rfind('/') + 1)}, {"type", "file"}, {"path", full}});
      if (!metadata.empty()) written->back()["metadata"] = metadata;
      self_->request(entry_, kCallTimeout, std::move(req))
          .then(
              [reply, written, left, failed](v1::FileReply& r) {
                Status s = FromProto(r.status());
                if (*failed) return;
                if (!s.ok()) {
                  *failed = true;
                  return Error(reply, s);
                }
                if (--*left == 0) reply->Send(200, kJson, written->dump());
              },
              [reply, failed](caf::error& e) {
                if (*failed) return;
                *failed = true;
                Error(reply, 503, "dsec did not answer: " + caf::to_string(e));
              });
    }
  }

  caf::event_based_actor* self_;
  entry_actor entry_;
  std::string secret_;
  bool internet_open_;
};

}  // namespace

E2bDoor::E2bDoor(caf::actor_system& sys, entry_actor entry, const ApiKeys& keys, std::string secret,
                 HttpServer& server, bool internet_open) {
  actor_ = sys.spawn([entry, secret, internet_open](caf::event_based_actor* self) -> caf::behavior {
    auto door = std::make_shared<Door>(self, entry, secret, internet_open);
    return {[door](Call& c) { door->Handle(c); }};
  });
  HttpHandler handler = [this, &keys](HttpRequest req, std::shared_ptr<HttpResponder> raw) {
    auto reply = std::make_shared<Counted>(std::move(raw), CallName(req.method, req.path));
    const std::string* key = req.Header("x-api-key");
    if (!key || !keys.Check(*key))
      return Error(reply, 401,
                   key ? "the API key is not one dsec issued (see docs/e2b.md: <data-dir>/e2b.key, e2b-key issue)"
                       : "no X-API-KEY: set E2B_API_KEY to a key dsec issued (<data-dir>/e2b.key)");
    caf::anon_send(actor_, Call{std::move(req), std::move(reply)});
  };
  constexpr size_t kMaxBody = 1 << 20;
  server.Route("POST", "/sandboxes", handler, kMaxBody);
  server.Route("GET", "/v2/sandboxes", handler);
  server.Route("GET", "/sandboxes/", handler, 0, true);
  server.Route("DELETE", "/sandboxes/", handler, 0, true);
  server.Route("POST", "/sandboxes/", handler, kMaxBody, true);
  server.Route("PUT", "/sandboxes/", handler, kMaxBody, true);
  server.Route("GET", "/snapshots", handler);
  server.Route("DELETE", "/templates/", handler, 0, true);
  // envd's REST calls: no API key, the sandbox's access token instead.
  HttpHandler envd = [this, secret](HttpRequest req, std::shared_ptr<HttpResponder> raw) {
    auto reply = std::make_shared<Counted>(std::move(raw), "envd" + req.path);
    const std::string* id = req.Header("e2b-sandbox-id");
    const std::string* token = req.Header("x-access-token");
    // A signed /files URL (downloadUrl, uploadUrl) stands for the token;
    // without E2b-Sandbox-Id the door finds the sandbox that signed it.
    const bool is_signed = req.path == "/files" && Query(req.query).count("signature");
    if (!actor_) return Error(reply, 503, "the E2B door is stopping");
    if (is_signed && !id) return caf::anon_send(actor_, Call{std::move(req), std::move(reply)});
    if (!id || !E2bId(*id)) return Error(reply, 400, "no E2b-Sandbox-Id naming a sandbox (set E2B_SANDBOX_URL)");
    if (is_signed && !token) {
      Status s = CheckSignature(req.method, req.query, Token(secret, *id));
      if (!s.ok()) return Error(reply, s);
    } else if (!token || *token != Token(secret, *id)) {
      return Error(reply, 401, "no X-Access-Token of sandbox " + *id + " (its create or connect reply has it)");
    }
    caf::anon_send(actor_, Call{std::move(req), std::move(reply)});
  };
  // A service in a sandbox, by its port: no key (as E2B's, a sandbox's
  // ports are open to whoever reaches the door), any method and path.
  server.RouteWhen(
      [](const std::string&, const std::string&, const std::function<std::string(const char*)>& header) {
        std::string id;
        uint32_t port;
        return PortTarget(header, &id, &port);
      },
      [this](HttpRequest req, std::shared_ptr<HttpResponder> raw) {
        auto reply = std::make_shared<Counted>(std::move(raw), "port");
        if (!actor_) return Error(reply, 503, "the E2B door is stopping");
        caf::anon_send(actor_, Call{std::move(req), std::move(reply)});
      },
      kMaxUpload);
  server.Route("GET", "/health", envd);
  server.Route("GET", "/files", envd);
  server.Route("POST", "/files", envd, kMaxUpload);
  server.Route("POST", "/filesystem.Filesystem/", envd, 1 << 20, true);
  server.Route("POST", "/process.Process/", envd, 16u << 20, true);
}

E2bDoor::~E2bDoor() { Stop(); }

void E2bDoor::Stop() {
  if (actor_) caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
  actor_ = nullptr;
}

}  // namespace dsec::e2b
