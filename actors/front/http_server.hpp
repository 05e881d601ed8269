// dsecd's HTTP endpoint (--http, loopback by default): Prometheus metrics at
// /metrics, a status page at / (HTML, no external assets, refreshed live
// from /status.json) and that JSON at /status.json. The front door reads
// and judges each request (runtime/http_gate.hpp); one worker thread here
// asks the node for the figures (the admin commands `metrics` and
// `overview`, as the console would) and writes the response, at most
// kMaxQueued requests waiting (past that: 503 at once). See docs/running.md.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "actors/admin.hpp"
#include "runtime/http_gate.hpp"

namespace dsec {

class HttpServer {
 public:
  static constexpr size_t kMaxQueued = 64;
  HttpServer(caf::actor_system& sys, admin_actor node);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  // For the front door's HTTP listener.
  HandshakeProtocol* gate();
  // Answers what is queued with 503 and joins the worker. Call after the
  // door has stopped and before the actor system goes.
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The status page (one HTML document, its script and style inline).
const std::string& StatusPageHtml();

}  // namespace dsec
