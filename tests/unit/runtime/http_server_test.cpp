// The HTTP server behind the front door (runtime/http_server.hpp), through
// a real door on loopback: bodies, keep-alive, streamed (chunked)
// responses, and the bounds on what a connection may cost (connections,
// head, body, idle time, bytes a slow reader leaves queued).
#include "runtime/http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gmock/gmock.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/http_gate.hpp"

namespace dsec {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// One client connection that reads responses one at a time (Content-Length
// or chunked), so several can go over one connection.
class Conn {
 public:
  explicit Conn(uint16_t port, int timeout_ms = 10'000) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Conn() { ::close(fd_); }
  bool ok() const { return ok_; }
  int fd() const { return fd_; }
  void Send(const std::string& s) { (void)!::send(fd_, s.data(), s.size(), MSG_NOSIGNAL); }

  struct Response {
    int code = 0;  // 0: none (closed or timed out first)
    std::string head, body;
    bool chunked = false;
  };
  // The next response; `head_only` for the answer to HEAD.
  Response Read(bool head_only = false) {
    Response r;
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!Fill()) return r;
    r.head = buf_.substr(0, end + 4);
    buf_.erase(0, end + 4);
    r.code = std::atoi(r.head.c_str() + 9);
    std::string lower = r.head;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (head_only || r.code == 100) return r;
    if (lower.find("transfer-encoding: chunked") != std::string::npos) {
      r.chunked = true;
      for (;;) {
        size_t eol;
        while ((eol = buf_.find("\r\n")) == std::string::npos)
          if (!Fill()) return Response{};
        size_t n = std::stoul(buf_.substr(0, eol), nullptr, 16);
        while (buf_.size() < eol + 2 + n + 2)
          if (!Fill()) return Response{};
        r.body += buf_.substr(eol + 2, n);
        buf_.erase(0, eol + 2 + n + 2);
        if (n == 0) return r;
      }
    }
    size_t at = lower.find("content-length: ");
    size_t n = at == std::string::npos ? 0 : std::stoul(lower.substr(at + 16));
    while (buf_.size() < n)
      if (!Fill()) return Response{};
    r.body = buf_.substr(0, n);
    buf_.erase(0, n);
    return r;
  }
  // True when the server closes the connection (within the receive timeout).
  bool Closed() {
    while (Fill()) {
    }
    return closed_;
  }

 private:
  bool Fill() {
    char b[65536];
    ssize_t n = ::recv(fd_, b, sizeof b, 0);
    if (n <= 0) {
      closed_ = n == 0 || errno == ECONNRESET;
      return false;
    }
    buf_.append(b, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  bool ok_ = false, closed_ = false;
  std::string buf_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions opt = {}) {
    server_ = std::make_unique<HttpServer>(opt);
    server_->Route("GET", "/hello", [](HttpRequest req, std::shared_ptr<HttpResponder> reply) {
      reply->Send(200, "text/plain", "hello " + req.query, {{"X-Peer", req.peer}});
    });
    server_->Route(
        "POST", "/echo",
        [](HttpRequest req, std::shared_ptr<HttpResponder> reply) {
          const std::string* type = req.Header("content-type");
          reply->Send(201, type ? *type : "none", req.body);
        },
        1 << 16);
    server_->Route("GET", "/files/", [](HttpRequest req, std::shared_ptr<HttpResponder> reply) {
      reply->Send(200, "text/plain", req.path);
    }, 0, true);
    server_->Route("GET", "/forgets", [](HttpRequest, std::shared_ptr<HttpResponder>) {});
    server_->Route("GET", "/stream", [this](HttpRequest, std::shared_ptr<HttpResponder> reply) {
      std::lock_guard<std::mutex> lk(mu_);
      stream_ = std::move(reply);
      cv_.notify_all();
    });
    server_->Start();
    FrontDoorListener l;
    l.name = "http";
    l.protocol = server_->gate();
    l.timeout_ms = 5000;
    l.max_input = HttpGate::kMaxHead;
    auto door = FrontDoor::Start({l});
    ASSERT_TRUE(door.ok()) << door.status().ToString();
    door_ = std::move(*door);
    port_ = door_->port("http");
  }
  void TearDown() override {
    if (door_) door_->Stop();
    {
      std::lock_guard<std::mutex> lk(mu_);
      stream_.reset();
    }
    if (server_) server_->Stop();
  }
  // The responder of the last GET /stream, once its request has arrived.
  std::shared_ptr<HttpResponder> WaitForStream() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::seconds(10), [&] { return stream_ != nullptr; });
    return std::exchange(stream_, nullptr);
  }
  // Polls the server's counters until `pred` holds (10 s at most).
  template <class Pred>
  bool WaitForStats(Pred pred) {
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!pred(server_->stats())) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a counter
    }
    return true;
  }

  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<FrontDoor> door_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<HttpResponder> stream_;
};

TEST_F(HttpServerTest, ManyRequestsWithBodiesGoOverOneKeptAliveConnection) {
  Start();
  Conn c(port_);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 20; ++i) {
    std::string body(static_cast<size_t>(i) * 1000, static_cast<char>('a' + i));
    c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/x" + std::to_string(i) +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    auto r = c.Read();
    ASSERT_EQ(r.code, 201) << i << ": " << r.head;
    EXPECT_EQ(r.body, body) << i;
    EXPECT_THAT(r.head, HasSubstr("Content-Type: text/x" + std::to_string(i)));
  }
  // Pipelined: two requests sent at once are answered in order.
  c.Send("GET /hello?a HTTP/1.1\r\n\r\nGET /files/x/y HTTP/1.1\r\n\r\n");
  EXPECT_EQ(c.Read().body, "hello a");
  EXPECT_EQ(c.Read().body, "/files/x/y");
  // HEAD has the length and no body; HTTP/1.0 without keep-alive is closed.
  c.Send("HEAD /hello?abc HTTP/1.1\r\n\r\n");
  auto head = c.Read(true);
  EXPECT_EQ(head.code, 200);
  EXPECT_THAT(head.head, HasSubstr("Content-Length: 9"));
  c.Send("GET /hello?z HTTP/1.0\r\n\r\n");
  EXPECT_EQ(c.Read().body, "hello z");
  EXPECT_TRUE(c.Closed()) << "HTTP/1.0 without keep-alive: closed after its answer";
  EXPECT_EQ(server_->stats().accepted, 1u) << "one connection for all of them";
}

TEST_F(HttpServerTest, UnknownPathsAndMethodsAreNamedAndTheConnectionStays) {
  Start();
  Conn c(port_);
  c.Send("GET /nope HTTP/1.1\r\n\r\n");
  auto r = c.Read();
  EXPECT_EQ(r.code, 404);
  EXPECT_THAT(r.body, HasSubstr("/hello"));
  EXPECT_THAT(r.body, HasSubstr("/files/..."));
  c.Send("DELETE /hello HTTP/1.1\r\n\r\n");
  r = c.Read();
  EXPECT_EQ(r.code, 405);
  EXPECT_THAT(r.head, HasSubstr("Allow: GET, HEAD"));
  c.Send("GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(c.Read().code, 200) << "an error with nothing left unread keeps the connection";
}

TEST_F(HttpServerTest, BodiesPastTheRouteLimitAndHeadsPastEightKiBAreRefusedAndClosed) {
  Start();
  {
    Conn c(port_);
    c.Send("POST /echo HTTP/1.1\r\nContent-Length: " + std::to_string((1 << 16) + 1) + "\r\n\r\n");
    auto r = c.Read();
    EXPECT_EQ(r.code, 413);
    EXPECT_THAT(r.body, HasSubstr("65536 bytes"));
    EXPECT_TRUE(c.Closed());
  }
  {
    // A chunked body that grows past the limit is cut off the same way.
    Conn c(port_);
    c.Send("POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string chunk(8192, 'z');
    for (int i = 0; i < 9; ++i) c.Send("2000\r\n" + chunk + "\r\n");
    EXPECT_EQ(c.Read().code, 413);
    EXPECT_TRUE(c.Closed());
  }
  {
    // GET takes no body.
    Conn c(port_);
    c.Send("GET /hello HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd");
    EXPECT_EQ(c.Read().code, 413);
  }
  {
    // The second request's head is the server's to bound (the door saw the first).
    Conn c(port_);
    c.Send("GET /hello HTTP/1.1\r\n\r\n");
    EXPECT_EQ(c.Read().code, 200);
    c.Send("GET /hello HTTP/1.1\r\nX: " + std::string(10000, 'h') + "\r\n\r\n");
    EXPECT_EQ(c.Read().code, 431);
    EXPECT_TRUE(c.Closed());
  }
  {
    Conn c(port_);
    c.Send("GET /hello HTTP/1.1\r\n\r\n\x16\x03\x01 garbage\r\n\r\n");
    EXPECT_EQ(c.Read().code, 200);
    EXPECT_EQ(c.Read().code, 400);
    EXPECT_TRUE(c.Closed());
  }
}

TEST_F(HttpServerTest, ExpectContinueGetsContinueBeforeTheBody) {
  Start();
  Conn c(port_);
  c.Send("POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  EXPECT_EQ(c.Read().code, 100);
  c.Send("hello");
  auto r = c.Read();
  EXPECT_EQ(r.code, 201);
  EXPECT_EQ(r.body, "hello");
}

TEST_F(HttpServerTest, AHandlerThatGivesNoAnswerIsA500NotAHungClient) {
  Start();
  Conn c(port_);
  c.Send("GET /forgets HTTP/1.1\r\n\r\n");
  auto r = c.Read();
  EXPECT_EQ(r.code, 500);
  c.Send("GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(c.Read().code, 200);
}

TEST_F(HttpServerTest, AStreamedResponseArrivesInChunksFromAnotherThreadAndTheConnectionGoesOn) {
  Start();
  Conn c(port_);
  c.Send("GET /stream HTTP/1.1\r\n\r\n");
  auto reply = WaitForStream();
  ASSERT_TRUE(reply);
  std::thread writer([reply] {
    reply->Begin(200, "text/event-stream");
    for (int i = 0; i < 100; ++i) EXPECT_TRUE(reply->Write("line " + std::to_string(i) + "\n"));
    reply->End();
  });
  auto r = c.Read();
  writer.join();
  EXPECT_EQ(r.code, 200);
  EXPECT_TRUE(r.chunked);
  EXPECT_THAT(r.body, HasSubstr("line 0\nline 1\n"));
  EXPECT_THAT(r.body, HasSubstr("line 99\n"));
  c.Send("GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(c.Read().code, 200) << "kept alive after the stream";
}

// Abort: the stream is broken off (the connection closes without the
// last chunk), so the client sees a cut body, not a complete one.
TEST_F(HttpServerTest, AnAbortedStreamEndsWithoutItsLastChunk) {
  Start();
  Conn c(port_);
  c.Send("GET /stream HTTP/1.1\r\n\r\n");
  auto reply = WaitForStream();
  ASSERT_TRUE(reply);
  reply->Begin(200, "application/octet-stream");
  EXPECT_TRUE(reply->Write("partial"));
  reply->Abort();
  reply->End();  // nothing after an abort
  EXPECT_FALSE(reply->Write("more"));
  EXPECT_EQ(c.Read().code, 0) << "a chunked body without its end is no complete response";
  EXPECT_TRUE(c.Closed());
}

TEST_F(HttpServerTest, AReaderThatStopsReadingCostsAtMostTheBufferAndItsCloseIsSeen) {
  HttpServerOptions opt;
  opt.max_buffered = 256 * 1024;
  Start(opt);
  auto c = std::make_unique<Conn>(port_);
  int small = 4096;
  ::setsockopt(c->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  c->Send("GET /stream HTTP/1.1\r\n\r\n");
  auto reply = WaitForStream();
  ASSERT_TRUE(reply);
  reply->Begin(200, "application/octet-stream");
  // The client reads nothing: writes are refused once the buffer (and the
  // kernel's socket buffers) are full, instead of growing without bound.
  std::string chunk(16 * 1024, 'x');
  size_t accepted = 0;
  for (int i = 0; i < 100'000 && reply->Write(chunk); ++i) accepted += chunk.size();
  EXPECT_LT(accepted, 64u << 20) << "a reader that reads nothing made the server queue " << accepted << " bytes";
  EXPECT_GE(accepted, opt.max_buffered) << "the buffer should take at least max_buffered";
  // The reader goes: the responder says so (and stops taking chunks).
  c.reset();
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!reply->gone() && Clock::now() < deadline) {
    (void)reply->Write("y");  // a write to a closed peer fails, as the close watch does
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling the responder
  }
  EXPECT_TRUE(reply->gone());
  EXPECT_FALSE(reply->Write("more"));
  EXPECT_TRUE(WaitForStats([](const HttpServerStats& s) { return s.connections == 0; }))
      << "the connection is still open";
}

TEST_F(HttpServerTest, PastTheConnectionLimitANewOneGets503AndTheOthersAreUntouched) {
  HttpServerOptions opt;
  opt.max_connections = 4;
  Start(opt);
  std::vector<std::unique_ptr<Conn>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Conn>(port_));
    held.back()->Send("GET /hello HTTP/1.1\r\n\r\n");
    ASSERT_EQ(held.back()->Read().code, 200);
  }
  Conn extra(port_);
  extra.Send("GET /hello HTTP/1.1\r\n\r\n");
  auto r = extra.Read();
  EXPECT_EQ(r.code, 503);
  EXPECT_THAT(r.body, HasSubstr("4 connections"));
  EXPECT_TRUE(extra.Closed());
  EXPECT_EQ(server_->stats().refused, 1u);
  for (auto& h : held) {
    h->Send("GET /hello HTTP/1.1\r\n\r\n");
    EXPECT_EQ(h->Read().code, 200);
  }
  held.pop_back();
  ASSERT_TRUE(WaitForStats([](const HttpServerStats& s) { return s.connections == 3; }));
  Conn again(port_);
  again.Send("GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(again.Read().code, 200) << "a freed place is taken again";
}

TEST_F(HttpServerTest, IdleAndSlowConnectionsAreClosedOnTheirTimers) {
  HttpServerOptions opt;
  opt.idle_timeout_ms = 300;
  opt.request_timeout_ms = 300;
  Start(opt);
  {
    Conn c(port_);
    c.Send("GET /hello HTTP/1.1\r\n\r\n");
    EXPECT_EQ(c.Read().code, 200);
    auto t0 = Clock::now();
    EXPECT_TRUE(c.Closed()) << "an idle kept-alive connection stays open";
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  }
  {
    // A body that never comes: closed (as nginx does, without an answer).
    Conn c(port_);
    c.Send("POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc");
    auto t0 = Clock::now();
    EXPECT_TRUE(c.Closed());
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  }
  EXPECT_TRUE(WaitForStats([](const HttpServerStats& s) { return s.connections == 0; }));
}

TEST_F(HttpServerTest, StopEndsStreamsAndClosesEveryConnection) {
  Start();
  Conn idle(port_);
  idle.Send("GET /hello HTTP/1.1\r\n\r\n");
  ASSERT_EQ(idle.Read().code, 200);
  Conn streaming(port_);
  streaming.Send("GET /stream HTTP/1.1\r\n\r\n");
  auto reply = WaitForStream();
  ASSERT_TRUE(reply);
  reply->Begin(200, "text/plain");
  door_->Stop();
  server_->Stop();
  EXPECT_TRUE(reply->gone());
  EXPECT_FALSE(reply->Write("after the stop"));
  EXPECT_TRUE(idle.Closed());
  EXPECT_TRUE(streaming.Closed());
}

}  // namespace
}  // namespace dsec
