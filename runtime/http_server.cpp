#include "runtime/http_server.hpp"

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "runtime/http_gate.hpp"

namespace dsec {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

const char* HttpReason(int code) {
  switch (code) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

const std::string* HttpRequest::Header(const std::string& name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

namespace {

struct RouteEntry {
  std::string method, path;
  HttpHandler handler;
  size_t max_body;
  bool prefix;
  HttpServer::HeadMatch when;  // RouteWhen's
  bool Matches(const std::string& p) const { return prefix ? p.rfind(path, 0) == 0 : p == path; }
};

// One item of a connection's output, written in order.
struct Out {
  enum Kind { kWhole, kHead, kChunk, kLast, kAbort } kind;
  std::shared_ptr<http::response<http::string_body>> whole;  // kWhole
  bool head_only = false;                                    // kWhole: HEAD, no body
  std::shared_ptr<http::response<http::empty_body>> head;    // kHead (chunked)
  std::shared_ptr<std::string> chunk;                        // kChunk
  bool ends_response = false;
};

}  // namespace

class HttpConn;

struct HttpServer::Impl {
  HttpServerOptions opt;
  LogFn log;
  std::vector<RouteEntry> routes;
  std::vector<RouteEntry> when_routes;  // RouteWhen's, asked first
  std::thread thread;
  std::unique_ptr<HttpGate> gate;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> open{0}, accepted{0}, refused{0}, requests{0}, bad{0};
  std::unordered_map<HttpConn*, std::weak_ptr<HttpConn>> live;  // the server's thread only
  // Last, so it goes first: handlers still queued in it (holding
  // connections) are destroyed while `live` is there.
  net::io_context ioc{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;

  void Log(int level, const std::string& text) const {
    if (log) log(level, text);
  }
  // The route for (method, path); else *allow (the methods the path has)
  // and whether the path is known at all.
  const RouteEntry* Find(const std::string& method, const std::string& path, std::string* allow) const {
    const std::string& m = method == "HEAD" ? std::string("GET") : method;
    for (const auto& r : routes)
      if (r.Matches(path) && r.method == m) return &r;
    for (const auto& r : routes)
      if (r.Matches(path)) *allow += (allow->empty() ? "" : ", ") + r.method + (r.method == "GET" ? ", HEAD" : "");
    return nullptr;
  }
  std::string Known() const {
    std::string known;
    for (const auto& r : routes) {
      std::string p = r.path + (r.prefix ? "..." : "");
      if (known.find(p) == std::string::npos) known += (known.empty() ? "" : ", ") + p;
    }
    return known;
  }
};

class HttpConn : public std::enable_shared_from_this<HttpConn> {
 public:
  HttpConn(HttpServer::Impl* s, tcp::socket sock, const std::string& leftover, std::string peer)
      : s_(s), stream_(std::move(sock)), buf_(s->opt.max_head + 8192), peer_(std::move(peer)) {
    auto b = buf_.prepare(leftover.size());
    net::buffer_copy(b, net::buffer(leftover));
    buf_.commit(leftover.size());
  }

  void Start() {
    s_->live[this] = weak_from_this();
    ++s_->open;
    ReadHead(true);
  }
  // On the server's thread: the last reference goes there (Responder).
  ~HttpConn() { Close(); }

  // Its socket closed; the object may live on while a responder holds it.
  void Close() {
    gone_ = true;
    if (closed_) return;
    closed_ = true;
    --s_->open;
    s_->live.erase(this);
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }
  bool gone() const { return gone_; }

  // What a responder queues (on the server's thread).
  void Queue(Out out) {
    if (gone_) return;
    outq_.push_back(std::move(out));
    Pump();
  }
  std::atomic<size_t> buffered{0};
  net::io_context& ioc() { return s_->ioc; }
  size_t max_buffered() const { return s_->opt.max_buffered; }

 private:
  void ReadHead(bool first) {
    if (gone_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(s_->opt.max_head));
    // Beast checks a Content-Length against the limit as the head ends,
    // before the route is known: none here (the largest value; 1.74
    // compares a Content-Length as greater than an empty limit), the
    // route's checked in OnHead.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(std::chrono::milliseconds(first ? s_->opt.request_timeout_ms : s_->opt.idle_timeout_ms));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHead(ec); });
  }

  void OnHead(beast::error_code ec) {
    if (ec) return Fail(ec);
    auto& h = parser_->get();
    method_ = std::string(h.method_string());
    target_ = std::string(h.target());
    path_ = target_.substr(0, target_.find('?'));
    keep_alive_ = h.keep_alive();
    version_ = h.version();
    std::string allow;
    route_ = nullptr;
    for (const auto& r : s_->when_routes) {
      auto header = [&h](const char* name) { return std::string(h[name]); };
      if (r.when(method_, target_, header)) {
        route_ = &r;
        break;
      }
    }
    if (!route_) route_ = s_->Find(method_, path_, &allow);
    if (!route_) {
      if (!allow.empty()) return Error(405, method_ + " is not allowed on " + path_ + "; it takes " + allow, allow);
      return Error(404, "no such path: " + path_ + "; this server has " + s_->Known());
    }
    if (auto length = parser_->content_length(); length && *length > route_->max_body)
      return Fail(http::error::body_limit);
    parser_->body_limit(route_->max_body);  // a chunked body, as it comes
    stream_.expires_after(std::chrono::milliseconds(s_->opt.request_timeout_ms));
    auto expect = h[http::field::expect];
    if (!parser_->is_done() && beast::iequals(expect, "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code e, size_t) {
        if (e) return self->Fail(e);
        self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
  }

  void OnRequest(beast::error_code ec) {
    if (ec) return Fail(ec);
    stream_.expires_never();
    ++s_->requests;
    auto& m = parser_->get();
    HttpRequest req;
    req.method = method_;
    req.target = target_;
    req.path = path_;
    if (size_t q = target_.find('?'); q != std::string::npos) req.query = target_.substr(q + 1);
    for (const auto& f : m) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    req.body = std::move(m.body());
    req.peer = peer_;
    parser_.reset();
    Watch();
    route_->handler(std::move(req), MakeResponder());
  }

  std::shared_ptr<HttpResponder> MakeResponder();

  // An error answered before the handler: the connection stays only when
  // nothing of the request is left unread.
  void Error(int code, const std::string& text, const std::string& allow = "") {
    ++s_->bad;
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(code), version_);
    res->set(http::field::content_type, "text/plain; charset=utf-8");
    res->set(http::field::cache_control, "no-store");
    if (!allow.empty()) res->set(http::field::allow, allow);
    res->body() = text + "\n";
    keep_alive_ = keep_alive_ && parser_->is_done();
    res->keep_alive(keep_alive_);
    res->prepare_payload();
    Queue(Out{Out::kWhole, res, method_ == "HEAD", nullptr, nullptr, true});
  }

  void Fail(beast::error_code ec) {
    if (gone_) return;
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset)
      return Close();
    // Too slow: the stream has closed the socket already (an idle
    // keep-alive connection, or a head or body that did not come in time).
    if (ec == beast::error::timeout) return Close();
    keep_alive_ = false;
    if (ec == http::error::header_limit)
      return Error(431, "the request's head is longer than " + std::to_string(s_->opt.max_head / 1024) + " KiB");
    if (ec == http::error::body_limit)
      return Error(413, "the request's body is longer than this path takes (" +
                            std::to_string(route_ ? route_->max_body : 0) + " bytes)");
    Error(400, "not a well-formed HTTP request: " + ec.message());
  }

  // While a response is under way: notice the peer resetting the
  // connection (a streamed response then stops), without reading what it
  // may have pipelined. A peer that only closed its sending side still
  // gets its answer (and the connection ends after it); one that closed
  // both is noticed at the next write.
  void Watch() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->gone_ || !self->responding_) return;
      char c;
      ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0) self->keep_alive_ = false;
      else if (n < 0 && errno != EAGAIN && errno != EINTR) self->Close();
    });
    responding_ = true;
  }

  void Pump() {
    if (writing_ || outq_.empty() || gone_) return;
    if (outq_.front().kind == Out::kAbort) {  // the response broken off: no last chunk
      outq_.clear();
      return Close();
    }
    writing_ = true;
    Out& o = outq_.front();
    stream_.expires_after(std::chrono::milliseconds(s_->opt.request_timeout_ms));
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->Wrote(ec); };
    switch (o.kind) {
      case Out::kWhole:
        if (o.head_only) {
          auto sr = std::make_shared<http::response_serializer<http::string_body>>(*o.whole);
          http::async_write_header(stream_, *sr, [sr, done](beast::error_code ec, size_t n) { done(ec, n); });
        } else {
          http::async_write(stream_, *o.whole, done);
        }
        break;
      case Out::kHead: {
        auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*o.head);
        http::async_write_header(stream_, *sr, [sr, done](beast::error_code ec, size_t n) { done(ec, n); });
        break;
      }
      case Out::kChunk: net::async_write(stream_, http::make_chunk(net::buffer(*o.chunk)), done); break;
      case Out::kLast: net::async_write(stream_, http::make_chunk_last(), done); break;
      case Out::kAbort: break;  // handled above
    }
  }

  void Wrote(beast::error_code ec) {
    writing_ = false;
    stream_.expires_never();
    if (ec) return Close();
    Out o = std::move(outq_.front());
    outq_.pop_front();
    if (o.kind == Out::kChunk) buffered -= o.chunk->size();
    if (!o.ends_response) return Pump();
    responding_ = false;
    if (!keep_alive_ || s_->stopping) return Linger();
    ReadHead(false);
  }

  // The last answer is sent: close our side, then read and drop what the
  // peer still sends (a body we refused) for a moment, so that closing with
  // unread bytes (a reset) does not destroy the answer before the peer has
  // read it. At most kLingerBytes or kLingerMs.
  void Linger() {
    beast::error_code e;
    stream_.socket().shutdown(tcp::socket::shutdown_send, e);
    if (s_->stopping || e) return Close();
    buf_.clear();
    stream_.expires_after(std::chrono::milliseconds(kLingerMs));
    Drain();
  }
  void Drain() {
    stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->lingered_ += n;
      if (ec || self->lingered_ > kLingerBytes) return self->Close();
      self->Drain();
    });
  }
  static constexpr size_t kLingerBytes = 256 * 1024;
  static constexpr int kLingerMs = 1000;

  HttpServer::Impl* s_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::string peer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const RouteEntry* route_ = nullptr;
  std::string method_, target_, path_;
  unsigned version_ = 11;
  bool keep_alive_ = false;
  bool writing_ = false;
  bool responding_ = false;
  size_t lingered_ = 0;
  bool closed_ = false;
  std::atomic<bool> gone_{false};
  std::deque<Out> outq_;

  friend class Responder;
};

namespace {

class Responder final : public HttpResponder {
 public:
  Responder(std::shared_ptr<HttpConn> conn, bool head, bool keep_alive, unsigned version)
      : conn_(std::move(conn)), head_(head), keep_alive_(keep_alive), version_(version) {}
  ~Responder() override {
    if (state_ == kNone) Send(500, "text/plain; charset=utf-8", "the handler gave no answer\n", {});
    if (state_ == kStreaming) End();
    // The connection is the server thread's: its last reference goes there.
    net::io_context& io = conn_->ioc();
    net::post(io, [c = std::move(conn_)] {});
  }

  void Send(int code, const std::string& content_type, std::string body, HttpHeaders extra) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != kNone) return;
    state_ = kDone;
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(code), version_);
    res->set(http::field::content_type, content_type);
    for (auto& [k, v] : extra) res->set(k, v);
    res->body() = std::move(body);
    res->keep_alive(keep_alive_);
    res->prepare_payload();
    Post(Out{Out::kWhole, res, head_, nullptr, nullptr, true});
  }
  void Begin(int code, const std::string& content_type, HttpHeaders extra) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != kNone) return;
    state_ = head_ ? kDone : kStreaming;
    auto res = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(code), version_);
    res->set(http::field::content_type, content_type);
    for (auto& [k, v] : extra) res->set(k, v);
    res->keep_alive(keep_alive_);
    res->chunked(!head_);
    Post(Out{Out::kHead, nullptr, false, res, nullptr, head_});
  }
  bool Write(std::string chunk) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != kStreaming || conn_->gone()) return false;
    if (chunk.empty()) return true;  // an empty chunk would end the stream
    if (conn_->buffered + chunk.size() > conn_->max_buffered()) return false;
    conn_->buffered += chunk.size();
    Post(Out{Out::kChunk, nullptr, false, nullptr, std::make_shared<std::string>(std::move(chunk)), false});
    return true;
  }
  void End() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != kStreaming) return;
    state_ = kDone;
    Post(Out{Out::kLast, nullptr, false, nullptr, nullptr, true});
  }
  void Abort() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != kStreaming) return;
    state_ = kDone;
    Post(Out{Out::kAbort, nullptr, false, nullptr, nullptr, true});
  }
  bool gone() const override { return conn_->gone(); }

 private:
  void Post(Out out) {
    net::post(conn_->ioc(), [c = conn_, o = std::move(out)]() mutable { c->Queue(std::move(o)); });
  }
  enum State { kNone, kStreaming, kDone };
  std::mutex mu_;
  State state_ = kNone;
  std::shared_ptr<HttpConn> conn_;
  bool head_, keep_alive_;
  unsigned version_;
};

}  // namespace

std::shared_ptr<HttpResponder> HttpConn::MakeResponder() {
  return std::make_shared<Responder>(shared_from_this(), method_ == "HEAD", keep_alive_, version_);
}

HttpServer::HttpServer(HttpServerOptions options, LogFn log) : impl_(std::make_unique<Impl>()) {
  impl_->opt = options;
  impl_->log = std::move(log);
  impl_->gate = std::make_unique<HttpGate>(
      [this](UniqueFd fd, std::string leftover, const std::string& peer) {
        Adopt(std::move(fd), std::move(leftover), peer);
      },
      options.max_head);
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(const std::string& method, const std::string& path, HttpHandler handler, size_t max_body,
                       bool prefix) {
  impl_->routes.push_back(RouteEntry{method, path, std::move(handler), max_body, prefix, nullptr});
}

void HttpServer::RouteWhen(HeadMatch match, HttpHandler handler, size_t max_body) {
  impl_->when_routes.push_back(RouteEntry{"", "", std::move(handler), max_body, false, std::move(match)});
}

void HttpServer::Start() {
  if (impl_->thread.joinable()) return;
  impl_->work.emplace(impl_->ioc.get_executor());
  // Asio makes its reactor (an epoll, an eventfd and a timerfd) with the
  // first socket: made now, the server's descriptors are the same before
  // its first connection and after its last.
  {
    tcp::socket probe(impl_->ioc);
    beast::error_code ec;
    probe.open(tcp::v4(), ec);
  }
  impl_->thread = std::thread([im = impl_.get()] { im->ioc.run(); });
}

HandshakeProtocol* HttpServer::gate() { return impl_->gate.get(); }

void HttpServer::Adopt(UniqueFd fd, std::string leftover, const std::string& peer) {
  Impl* im = impl_.get();
  ++im->accepted;
  auto owned = std::make_shared<UniqueFd>(std::move(fd));
  net::post(im->ioc, [im, owned, leftover = std::move(leftover), peer]() {
    int raw = owned->get();
    if (im->stopping || im->open >= im->opt.max_connections) {
      ++im->refused;
      if (!im->stopping)
        im->Log(2, "http: " + peer + " refused: " + std::to_string(im->opt.max_connections) + " connections open");
      std::string busy = HttpResponse(503, "text/plain; charset=utf-8",
                                      "busy: " + std::to_string(im->opt.max_connections) +
                                          " connections are open; try again\n",
                                      false, "Retry-After: 1\r\n");
      (void)!::send(raw, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      return;  // owned closes it
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(raw, reinterpret_cast<sockaddr*>(&ss), &len);
    tcp::socket sock(im->ioc);
    beast::error_code ec;
    sock.assign(ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), raw, ec);
    if (ec) return im->Log(2, "http: " + peer + ": " + ec.message());
    (void)owned->Release();  // the socket owns it now
    std::make_shared<HttpConn>(im, std::move(sock), leftover, peer)->Start();
  });
}

void HttpServer::Stop() {
  Impl* im = impl_.get();
  if (!im->thread.joinable()) return;
  net::post(im->ioc, [im] {
    im->stopping = true;
    std::vector<std::shared_ptr<HttpConn>> conns;
    for (auto& [p, w] : im->live)
      if (auto c = w.lock()) conns.push_back(std::move(c));
    for (auto& c : conns) c->Close();
    im->work.reset();
  });
  im->thread.join();
}

HttpServerStats HttpServer::stats() const {
  const Impl* im = impl_.get();
  return HttpServerStats{im->open, im->accepted, im->refused, im->requests, im->bad};
}

}  // namespace dsec
