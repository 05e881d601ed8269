// A service in a sandbox, reached through the door by its port (docs/e2b.md
// "Ports"), as E2B's proxy routes them: a request with E2b-Sandbox-Id and
// an E2b-Sandbox-Port other than envd's, or whose Host is
// <port>-<id>.<domain> (getHost's). Each request is relayed whole by an
// exec of the sandbox's agent (`dsec-agent --relay PORT`: a connection to
// the port on the sandbox's loopback, so a sandbox without a network link
// serves too), as HTTP/1.0 with `Connection: close`: the answer ends with
// its connection, so it streams back as it comes with no framing to undo.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>

#include "actors/front/e2b/door_internal.hpp"

namespace dsec::e2b {

namespace {

using nlohmann::json;

constexpr uint32_t kEnvdPort = 49983;
constexpr size_t kMaxHead = 64 << 10;  // of the service's answer
constexpr uint64_t kRelayMs = 3600'000;  // a request's longest (a stream of events, say)

bool Hop(const std::string& name) {  // lowercase; not passed on, either way
  for (const char* h : {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                        "upgrade", "content-length", "e2b-sandbox-id", "e2b-sandbox-port", "x-access-token",
                        "e2b-traffic-access-token"})
    if (name == h) return true;
  return false;
}

uint32_t PortOf(const std::string& s) {
  if (s.empty() || s.size() > 5 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return 0;
  long p = std::strtol(s.c_str(), nullptr, 10);
  return p >= 1 && p <= 65535 ? static_cast<uint32_t>(p) : 0;
}

// The service's answer, passed on as it comes: its head parsed once whole.
struct Answer {
  std::shared_ptr<HttpResponder> reply;
  std::string id;
  uint32_t port;
  std::string head;
  bool begun = false, done = false;

  // False: stop (answered, or the client cannot take more).
  bool Feed(const std::string& bytes) {
    if (done) return false;
    if (begun) return Write(bytes);
    head += bytes;
    size_t end = head.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (head.size() <= kMaxHead) return true;
      return Fail(502, "the service at port " + std::to_string(port) + " answered a head over 64 KiB");
    }
    std::string rest = head.substr(end + 4);
    // "HTTP/1.x CODE reason", then its headers.
    size_t sp = head.find(' ');
    int code = sp == std::string::npos ? 0 : std::atoi(head.c_str() + sp + 1);
    if (head.rfind("HTTP/1.", 0) != 0 || code < 100 || code > 599)
      return Fail(502, "the service at port " + std::to_string(port) + " did not answer in HTTP");
    std::string type = "application/octet-stream";
    HttpHeaders extra;
    for (size_t at = head.find("\r\n") + 2; at < end;) {
      size_t eol = head.find("\r\n", at);
      std::string line = head.substr(at, eol - at);
      at = eol + 2;
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      if (name == "content-type") type = value;
      else if (!Hop(name)) extra.emplace_back(name, value);
    }
    begun = true;
    reply->Begin(code, type, extra);
    head.clear();
    return rest.empty() || Write(rest);
  }
  bool Write(const std::string& bytes) {
    if (reply->Write(bytes)) return true;
    done = true;  // gone, or not reading: its answer stops here
    reply->Abort();
    return false;
  }
  bool Fail(int code, const std::string& message, json more = json::object()) {
    done = true;
    more["message"] = message;
    more["code"] = code;
    more["sandboxId"] = id;
    reply->Send(code, kJson, more.dump());
    return false;
  }
  void End(const v1::ExecReply& r) {
    if (done) return;
    Status s = FromProto(r.status());
    if (begun) {
      done = true;
      return s.ok() ? reply->End() : reply->Abort();
    }
    if (s.code() == Status::Code::kNotFound) return (void)Fail(502, "The sandbox was not found");
    if (!s.ok()) return (void)Fail(HttpCode(s), s.message());
    if (r.result().exit_code() == 3)
      return (void)Fail(502, "The sandbox is running but port is not open", json{{"port", port}});
    Fail(502, "the service at port " + std::to_string(port) + " closed without an HTTP answer" +
                  (r.result().stderr().empty() ? "" : ": " + r.result().stderr().substr(0, 300)));
  }
};

}  // namespace

bool PortTarget(const std::function<std::string(const char*)>& header, std::string* id, uint32_t* port) {
  std::string sid = header("e2b-sandbox-id"), sport = header("e2b-sandbox-port");
  if (!sid.empty() && !sport.empty()) {
    *port = PortOf(sport);
    *id = sid;
    return *port != 0 && *port != kEnvdPort && E2bId(sid);
  }
  std::string host = header("host");
  size_t dash = host.find('-'), dot = host.find('.');
  if (dash == std::string::npos || dot == std::string::npos || dash > dot) return false;
  *port = PortOf(host.substr(0, dash));
  *id = host.substr(dash + 1, dot - dash - 1);
  return *port != 0 && *port != kEnvdPort && E2bId(*id);
}

bool ServePort(caf::event_based_actor* self, const entry_actor& entry, Call& c) {
  std::string id;
  uint32_t port;
  auto header = [&c](const char* n) {
    const std::string* v = c.req.Header(n);
    return v ? *v : std::string();
  };
  if (!PortTarget(header, &id, &port)) return false;
  std::string raw = c.req.method + " " + c.req.target + " HTTP/1.0\r\n";
  for (const auto& [k, v] : c.req.headers)
    if (!Hop(k)) raw += k + ": " + v + "\r\n";
  if (!c.req.body.empty()) raw += "content-length: " + std::to_string(c.req.body.size()) + "\r\n";
  raw += "connection: close\r\n\r\n";
  raw += c.req.body;
  v1::ExecRequest req;
  req.set_sandbox_id(id);
  req.add_argv("/run/dsec/agent");
  req.add_argv("--relay");
  req.add_argv(std::to_string(port));
  req.set_stdin(std::move(raw));
  req.set_stream(true);
  req.set_stream_id(1);  // its actor's only one
  req.mutable_limits()->set_timeout_ms(kRelayMs);
  auto answer = std::make_shared<Answer>();
  answer->reply = c.reply;
  answer->id = id;
  answer->port = port;
  self->spawn([entry, req, answer](caf::event_based_actor* me) mutable -> caf::behavior {
    me->request(entry, caf::infinite, std::move(req))
        .then(
            [answer, me](v1::ExecReply& r) {
              answer->End(r);
              me->quit();
            },
            [answer, me](caf::error& e) {
              if (!answer->done) answer->Fail(503, "dsec did not answer: " + caf::to_string(e));
              me->quit();
            });
    return {
        [answer, me](v1::ExecOutput& piece) {
          if (!piece.stdout().empty() && !answer->Feed(piece.stdout())) me->quit();
        },
    };
  });
  return true;
}

}  // namespace dsec::e2b
