// A plain HTTP/1.1 client for tests of dsecd's --http endpoint: one request
// per connection on loopback (the client's side half-closed after it), the
// whole response read until the server closes. No library: what goes over
// the wire is what the test wrote.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>

namespace dsec::testing {

struct HttpReply {
  int code = 0;  // 0: no response (connection failed or closed without one)
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
  std::string raw;
};

inline int HttpPort(const std::string& addr) { return std::stoi(addr.substr(addr.rfind(':') + 1)); }

// A TCP connection to 127.0.0.1:`port`, or -1.
inline int DialLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` as it is to 127.0.0.1:`port` and reads the reply.
inline HttpReply HttpExchange(int port, const std::string& request, int timeout_ms = 15000) {
  HttpReply r;
  int fd = DialLoopback(port);
  if (fd < 0) return r;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);  // one request: the server closes after answering it
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    r.raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t head_end = r.raw.find("\r\n\r\n");
  if (r.raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return r;
  r.code = std::atoi(r.raw.c_str() + 9);
  std::istringstream head(r.raw.substr(0, head_end));
  std::string line;
  std::getline(head, line);
  while (std::getline(head, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
  }
  r.body = r.raw.substr(head_end + 4);
  return r;
}

inline HttpReply HttpGet(const std::string& addr, const std::string& path, const std::string& method = "GET") {
  return HttpExchange(HttpPort(addr), method + " " + path + " HTTP/1.1\r\nHost: dsec\r\n\r\n");
}

// The samples of a Prometheus text exposition: "name{labels}" -> value;
// lines that are neither a sample nor a comment are listed in *bad.
inline std::map<std::string, double> ParseMetrics(const std::string& text, std::string* bad) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t sp = line.rfind(' ');
    char* end = nullptr;
    double v = sp == std::string::npos ? 0 : std::strtod(line.c_str() + sp + 1, &end);
    if (sp == std::string::npos || end == line.c_str() + sp + 1 || *end != '\0') {
      *bad += line + "\n";
      continue;
    }
    out[line.substr(0, sp)] = v;
  }
  return out;
}

}  // namespace dsec::testing
