// A TCP client for line protocols (the admin console): connect, send bytes,
// read one line at a time with a timeout. Used by dsecctl and the tests.
#pragma once

#include <string>

#include "dsec/status.hpp"

namespace dsec {

class LineClient {
 public:
  LineClient() = default;
  ~LineClient();
  LineClient(const LineClient&) = delete;
  LineClient& operator=(const LineClient&) = delete;

  // host:port; Unavailable naming the address when it cannot connect.
  // From `source` (an IPv4 address to bind first, e.g. 127.0.0.2 on
  // loopback) when it is given.
  Status Connect(const std::string& host_port, const std::string& source = "");
  bool connected() const { return fd_ >= 0; }
  // Writes all of `bytes` (no newline added).
  Status Send(const std::string& bytes);
  // The next line without its '\n'. DeadlineExceeded after `timeout_ms`;
  // Unavailable once the peer closed (then closed() is true).
  Result<std::string> ReadLine(int timeout_ms);
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool closed_ = false;
  std::string buf_;
};

}  // namespace dsec
