#include "actors/front/status_http.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "actors/admin.hpp"

namespace dsec {

namespace {

constexpr const char* kText = "text/plain; charset=utf-8";

// The HTTP server's own figures, in the metrics' format.
std::string ServerMetrics(const HttpServerStats& s) {
  return "# HELP dsec_http_connections HTTP connections open now.\n# TYPE dsec_http_connections gauge\n"
         "dsec_http_connections " + std::to_string(s.connections) +
         "\n# HELP dsec_http_requests_total HTTP requests read whole and routed.\n"
         "# TYPE dsec_http_requests_total counter\ndsec_http_requests_total " + std::to_string(s.requests) +
         "\n# HELP dsec_http_refused_total HTTP connections refused at the connection limit.\n"
         "# TYPE dsec_http_refused_total counter\ndsec_http_refused_total " + std::to_string(s.refused) +
         "\n# HELP dsec_http_bad_requests_total HTTP requests answered 4xx before a handler (malformed, too "
         "large, too slow, unknown path).\n# TYPE dsec_http_bad_requests_total counter\n"
         "dsec_http_bad_requests_total " + std::to_string(s.bad) + "\n";
}

}  // namespace

struct StatusHttp::Impl {
  struct Job {
    std::string path;
    std::shared_ptr<HttpResponder> reply;
  };
  caf::actor_system& sys;
  admin_actor node;
  HttpServer& server;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  bool stopping = false;
  std::thread worker;

  Impl(caf::actor_system& s, admin_actor n, HttpServer& srv) : sys(s), node(std::move(n)), server(srv) {
    server.Route("GET", "/", [](HttpRequest, std::shared_ptr<HttpResponder> reply) {
      reply->Send(200, "text/html; charset=utf-8", StatusPageHtml());
    });
    for (const char* path : {"/metrics", "/status.json"})
      server.Route("GET", path, [this](HttpRequest req, std::shared_ptr<HttpResponder> reply) {
        Enqueue(Job{req.path, std::move(reply)});
      });
    worker = std::thread([this] { Loop(); });
  }

  // On the server's thread: queue it, or answer 503 at once.
  void Enqueue(Job job) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!stopping && queue.size() < kMaxQueued) {
        queue.push_back(std::move(job));
        cv.notify_one();
        return;
      }
    }
    job.reply->Send(503, kText, "busy: too many requests waiting\n", {{"Retry-After", "1"}});
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

  void Answer(caf::scoped_actor& self, const Job& job) {
    bool metrics = job.path == "/metrics";
    std::string body;
    if (!Ask(self, metrics ? "metrics" : "overview", &body)) return job.reply->Send(504, kText, body);
    if (metrics) return job.reply->Send(200, "text/plain; version=0.0.4; charset=utf-8", body + ServerMetrics(server.stats()));
    job.reply->Send(200, "application/json", body);
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
          job.reply->Send(503, kText, "dsecd is stopping\n");
          continue;
        }
      }
      if (!job.reply->gone()) Answer(self, job);
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

StatusHttp::StatusHttp(caf::actor_system& sys, admin_actor node, HttpServer& server)
    : impl_(std::make_unique<Impl>(sys, std::move(node), server)) {}
StatusHttp::~StatusHttp() { Stop(); }
void StatusHttp::Stop() { impl_->Stop(); }

}  // namespace dsec
