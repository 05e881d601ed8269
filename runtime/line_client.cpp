#include "runtime/line_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace dsec {

LineClient::~LineClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status LineClient::Connect(const std::string& host_port, const std::string& source) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument("'" + host_port + "' is not host:port");
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host_port.substr(0, colon).c_str(), host_port.substr(colon + 1).c_str(), &hints, &res) != 0)
    return Status::InvalidArgument("cannot resolve " + host_port);
  fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int rc = fd_ < 0 ? -1 : 0;
  if (rc == 0 && !source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    rc = ::inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1
             ? ::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from)
             : (errno = EINVAL, -1);
  }
  if (rc == 0) rc = ::connect(fd_, res->ai_addr, res->ai_addrlen);
  int err = errno;
  ::freeaddrinfo(res);
  if (rc < 0) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return Status::Unavailable("cannot connect to " + host_port + ": " + std::strerror(err));
  }
  return Status::Ok();
}

Status LineClient::Send(const std::string& bytes) {
  if (fd_ < 0) return Status::FailedPrecondition("not connected");
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      closed_ = true;
      return Status::Unavailable("the peer closed the connection");
    }
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::string> LineClient::ReadLine(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (fd_ < 0 || closed_) return Status::Unavailable("the peer closed the connection");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0)
      return Status::DeadlineExceeded("no reply within " + std::to_string(timeout_ms) + " ms");
    char tmp[65536];
    ssize_t n = ::read(fd_, tmp, sizeof tmp);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      closed_ = true;
      return Status::Unavailable("the peer closed the connection");
    }
    buf_.append(tmp, static_cast<size_t>(n));
  }
}

}  // namespace dsec
