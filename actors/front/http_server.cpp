#include "actors/front/http_server.hpp"

#include <sys/socket.h>
#include <sys/time.h>
#include <fcntl.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "actors/admin.hpp"

namespace dsec {

namespace {

// Writes all of `s` (the socket made blocking, with a send timeout: a peer
// that stops reading costs the worker at most that long).
void WriteResponse(int fd, const std::string& s) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
}

}  // namespace

struct HttpServer::Impl {
  struct Job {
    UniqueFd fd;
    HttpRequest req;
  };
  caf::actor_system& sys;
  admin_actor node;
  std::unique_ptr<HttpGate> gate;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  bool stopping = false;
  std::thread worker;

  Impl(caf::actor_system& s, admin_actor n) : sys(s), node(std::move(n)) {
    gate = std::make_unique<HttpGate>(std::vector<std::string>{"/", "/metrics", "/status.json"},
                                      [this](UniqueFd fd, HttpRequest req) { Enqueue(std::move(fd), std::move(req)); });
    worker = std::thread([this] { Loop(); });
  }

  // On the door's thread: queue it, or answer 503 at once.
  void Enqueue(UniqueFd fd, HttpRequest req) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!stopping && queue.size() < kMaxQueued) {
        queue.push_back(Job{std::move(fd), std::move(req)});
        cv.notify_one();
        return;
      }
    }
    std::string busy = HttpResponse(503, "text/plain; charset=utf-8", "busy: too many requests waiting\n",
                                     req.method == "HEAD", "Retry-After: 1\r\n");
    (void)!::send(fd.get(), busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Asks the node an admin command; false (and *out the error) when it does not answer.
  bool Ask(caf::scoped_actor& self, const std::string& cmd, std::string* out) {
    bool ok = false;
    self->request(node, std::chrono::seconds(10), admin_atom::value, cmd, std::vector<std::string>{})
        .receive(
            [&](const std::string& reply) {
              *out = reply;
              ok = true;
            },
            [&](caf::error& e) { *out = "the node did not answer: " + sys.render(e) + "\n"; });
    return ok;
  }

  std::string Respond(caf::scoped_actor& self, const HttpRequest& req) {
    bool head = req.method == "HEAD";
    if (req.path == "/") return HttpResponse(200, "text/html; charset=utf-8", StatusPageHtml(), head);
    std::string body;
    bool ok = Ask(self, req.path == "/metrics" ? "metrics" : "overview", &body);
    if (!ok) return HttpResponse(504, "text/plain; charset=utf-8", body, head);
    if (req.path == "/metrics") return HttpResponse(200, "text/plain; version=0.0.4; charset=utf-8", body, head);
    return HttpResponse(200, "application/json", body, head);
  }

  void Loop() {
    caf::scoped_actor self{sys};
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
        if (stopping) {
          lk.unlock();
          WriteResponse(job.fd.get(), HttpResponse(503, "text/plain; charset=utf-8", "dsecd is stopping\n"));
          continue;
        }
      }
      WriteResponse(job.fd.get(), Respond(self, job.req));
    }
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (stopping && !worker.joinable()) return;
      stopping = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }
};

HttpServer::HttpServer(caf::actor_system& sys, admin_actor node) : impl_(std::make_unique<Impl>(sys, std::move(node))) {}
HttpServer::~HttpServer() { Stop(); }
HandshakeProtocol* HttpServer::gate() { return impl_->gate.get(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace dsec
