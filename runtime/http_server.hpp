// dsecd's HTTP server, behind the front door: the door judges a
// connection's first request head (runtime/http_gate.hpp) and hands the
// socket over; from there this server (Boost.Beast on one Asio thread; see
// docs/architecture.md for why Beast) reads requests with their bodies,
// keeps connections alive, answers with whole or streamed (chunked)
// responses, and bounds what each connection may cost:
//   - at most `max_connections` connections at once (past that: 503 and
//     close, at once);
//   - a request head of at most `max_head` bytes (431), a body of at most
//     the route's `max_body` (413); a connection is closed (no answer) when
//     the head of its next request is not complete within
//     `idle_timeout_ms` of the last answer (the first head: the door's
//     deadline), its body within `request_timeout_ms` of the head, or a
//     write to it within `request_timeout_ms`;
//   - a streamed response buffers at most `max_buffered` bytes the peer has
//     not taken yet (Write says false past that: the writer slows or stops).
// Handlers run on the server's thread and must not block: they answer
// through their HttpResponder, at once or later from any thread.
// Plain C++: no CAF, no Beast in this header.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/front_door.hpp"

namespace dsec {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // as sent (GET, POST, ...)
  std::string target;  // path and query as sent
  std::string path;    // the target up to '?'
  std::string query;   // after '?' ("" when none)
  HttpHeaders headers;  // names lowercased, in order
  std::string body;
  std::string peer;  // host:port
  // The first header of that (lowercase) name, or nullptr.
  const std::string* Header(const std::string& name) const;
};

// The answer to one request. Thread-safe; answer once: Send, or Begin then
// Write any number of times then End. Dropped unanswered, the request gets
// 500 (a handler that forgets is a bug, not a hung client).
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response (Content-Length; no body on HEAD).
  virtual void Send(int code, const std::string& content_type, std::string body, HttpHeaders extra = {}) = 0;
  // A streamed response: chunked until End.
  virtual void Begin(int code, const std::string& content_type, HttpHeaders extra = {}) = 0;
  // Queues one chunk; false when the connection is gone or more than
  // max_buffered bytes are waiting (the chunk is dropped then).
  virtual bool Write(std::string chunk) = 0;
  virtual void End() = 0;
  // Ends a streamed response broken: what was queued is written, then the
  // connection closes without the last chunk (the client sees its body cut,
  // as when a server behind a proxy dies).
  virtual void Abort() = 0;
  // The connection closed (or the server stops): stop producing.
  virtual bool gone() const = 0;
};

using HttpHandler = std::function<void(HttpRequest request, std::shared_ptr<HttpResponder> reply)>;

struct HttpServerOptions {
  size_t max_connections = 1024;
  size_t max_head = 8192;
  int request_timeout_ms = 10'000;
  int idle_timeout_ms = 60'000;
  size_t max_buffered = 1 << 20;
};

struct HttpServerStats {
  uint64_t connections = 0;  // open now
  uint64_t accepted = 0;     // handed over by the door
  uint64_t refused = 0;      // at max_connections: 503 and closed
  uint64_t requests = 0;     // read whole and routed
  uint64_t bad = 0;          // malformed, too large or too slow: answered 4xx and closed
};

class HttpServer {
 public:
  using LogFn = std::function<void(int level, const std::string& text)>;  // 0 debug .. 3 error
  explicit HttpServer(HttpServerOptions options = {}, LogFn log = nullptr);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before Start. `path` is matched whole, or as a prefix when it ends in
  // '/' and `prefix`; a GET route answers HEAD too. Other methods on a known
  // path: 405 with Allow; unknown paths: 404 naming the known ones.
  void Route(const std::string& method, const std::string& path, HttpHandler handler, size_t max_body = 0,
             bool prefix = false);
  // Before Start: a request whose head `match` takes (any method, any
  // path; `header` gives a lowercase-named header's value, "" when none)
  // goes to `handler`, before the path routes are looked at.
  using HeadMatch = std::function<bool(const std::string& method, const std::string& target,
                                       const std::function<std::string(const char*)>& header)>;
  void RouteWhen(HeadMatch match, HttpHandler handler, size_t max_body);
  // Starts the server's thread.
  void Start();
  // For the front door's listener: judges the first head, then Adopt.
  HandshakeProtocol* gate();
  // Takes over an admitted socket; `leftover` is what the door read of it
  // (its first request, or the start of it). Any thread.
  void Adopt(UniqueFd fd, std::string leftover, const std::string& peer);
  // Closes every connection (a streamed response ends), joins the thread.
  void Stop();
  HttpServerStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The reason phrase of a status code ("Not Found").
const char* HttpReason(int code);

}  // namespace dsec
