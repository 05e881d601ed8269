// dsecd's status endpoints on its HTTP server (runtime/http_server.hpp;
// --http, loopback by default): Prometheus metrics at /metrics, a status
// page at / (HTML, no external assets, refreshed live from /status.json)
// and that JSON at /status.json, each for GET and HEAD. One worker thread
// here asks the node for the figures (the admin commands `metrics` and
// `overview`, as the console would) and answers, at most kMaxQueued
// requests waiting (past that: 503 at once). /metrics adds the HTTP
// server's own figures. See docs/running.md.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "actors/admin.hpp"
#include "runtime/http_server.hpp"

namespace dsec {

class StatusHttp {
 public:
  static constexpr size_t kMaxQueued = 64;
  // Adds the routes to `server` (before its Start); `server` outlives this.
  StatusHttp(caf::actor_system& sys, admin_actor node, HttpServer& server);
  ~StatusHttp();  // Stop()
  StatusHttp(const StatusHttp&) = delete;
  StatusHttp& operator=(const StatusHttp&) = delete;
  // Answers what is queued with 503 and joins the worker. Call after the
  // server has stopped and before the actor system goes.
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The status page (one HTML document, its script and style inline).
const std::string& StatusPageHtml();

}  // namespace dsec
