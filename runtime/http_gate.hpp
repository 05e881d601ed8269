// The HTTP port's side of the front door: reads a connection's first
// request head (at most max_head bytes, before the door's deadline) through
// Beast's parser, answers what is wrong with it itself (400 with the
// parser's reason, 431 past max_head, 505 for a version other than 1.0 or
// 1.1: a short reply, then the connection is closed), and hands the socket
// of a well-formed head to `admitted` with every byte read so far (the head
// and whatever followed it), for the HTTP server to parse again as its
// first request. Routes, methods and bodies are the server's to judge
// (runtime/http_server.hpp). Plain C++, no CAF.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "runtime/front_door.hpp"

namespace dsec {

// A complete response that closes the connection: status line,
// Content-Type, Content-Length, Connection: close, and the body (left out
// for HEAD). For answers given before (or instead of) the server.
std::string HttpResponse(int code, const std::string& content_type, const std::string& body, bool head = false,
                         const std::string& extra_headers = "");

class HttpGate final : public HandshakeProtocol {
 public:
  static constexpr size_t kMaxHead = 8192;
  using Admitted = std::function<void(UniqueFd fd, std::string leftover, const std::string& peer)>;
  // `admitted` runs on the door's thread: hand the socket on, do not block.
  explicit HttpGate(Admitted admitted, size_t max_head = kMaxHead);

  const char* name() const override { return "http"; }
  // One connection's judge (tests feed it directly: OnInput with the
  // input so far).
  std::unique_ptr<Handshake> Begin(const std::string& peer, std::string* greeting) override;
  void Admit(UniqueFd fd, std::string leftover, const std::string& peer) override;

 private:
  class Conn;
  Admitted admitted_;
  size_t max_head_;
};

}  // namespace dsec
