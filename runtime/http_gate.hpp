// The HTTP port's side of the front door: reads one request head (request
// line and headers, at most kMaxHead bytes, before the door's deadline),
// answers what is wrong with it itself (400, 404, 405, 431, 505: a short
// reply, then the connection is closed), and hands a well-formed GET or
// HEAD of a known path to `serve` with its socket. One request per
// connection (`Connection: close`). Plain C++, no CAF.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/front_door.hpp"

namespace dsec {

struct HttpRequest {
  std::string method;  // GET or HEAD
  std::string path;    // one of the gate's paths; the query string dropped
  std::string peer;
};

// A complete response: status line, Content-Type, Content-Length,
// Connection: close, and the body (left out for HEAD).
std::string HttpResponse(int code, const std::string& content_type, const std::string& body, bool head = false,
                         const std::string& extra_headers = "");

class HttpGate final : public HandshakeProtocol {
 public:
  static constexpr size_t kMaxHead = 8192;
  using Serve = std::function<void(UniqueFd fd, HttpRequest request)>;
  // `paths`: what is served (anything else: 404). `serve` runs on the
  // door's thread: hand the socket on, do not block.
  HttpGate(std::vector<std::string> paths, Serve serve);

  const char* name() const override { return "http"; }
  std::unique_ptr<Handshake> Begin(const std::string& peer, std::string* greeting) override;
  void Admit(UniqueFd fd, std::string leftover, const std::string& peer) override;

  // The request head in `input` judged: kMore (not all there yet), kAdmit
  // (serve it: *request filled) or kReject (reply: the error response).
  // Exposed for tests.
  Handshake::Step Judge(const std::string& input, bool eof, HttpRequest* request) const;

 private:
  class Conn;
  std::vector<std::string> paths_;
  Serve serve_;
  HttpRequest admitted_;  // Admit follows the kAdmit of the same connection on the door's thread
};

}  // namespace dsec
