#include "runtime/http_gate.hpp"

#include <algorithm>

namespace dsec {

namespace {

const char* Reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

Handshake::Step Error(int code, const std::string& why, const std::string& extra = "") {
  Handshake::Step s;
  s.kind = Handshake::Step::kReject;
  s.reply = HttpResponse(code, "text/plain; charset=utf-8", why + "\n", false, extra);
  return s;
}

}  // namespace

std::string HttpResponse(int code, const std::string& content_type, const std::string& body, bool head,
                         const std::string& extra_headers) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + Reason(code) + "\r\nContent-Type: " + content_type +
                  "\r\nContent-Length: " + std::to_string(body.size()) +
                  "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n" +
                  extra_headers + "\r\n";
  if (!head) r += body;
  return r;
}

class HttpGate::Conn final : public Handshake {
 public:
  explicit Conn(HttpGate* gate) : gate_(gate) {}
  size_t Wants(const std::string& input) const override { return kMaxHead - std::min(input.size(), kMaxHead); }
  Step OnInput(const std::string& input, bool eof) override {
    HttpRequest req;
    Step s = gate_->Judge(input, eof, &req);
    if (s.kind == Step::kAdmit) gate_->admitted_ = std::move(req);
    return s;
  }

 private:
  HttpGate* gate_;
};

HttpGate::HttpGate(std::vector<std::string> paths, Serve serve) : paths_(std::move(paths)), serve_(std::move(serve)) {}

std::unique_ptr<Handshake> HttpGate::Begin(const std::string&, std::string*) { return std::make_unique<Conn>(this); }

void HttpGate::Admit(UniqueFd fd, std::string, const std::string& peer) {
  HttpRequest req = std::move(admitted_);
  req.peer = peer;
  serve_(std::move(fd), std::move(req));
}

Handshake::Step HttpGate::Judge(const std::string& input, bool eof, HttpRequest* request) const {
  // The head ends at an empty line (CRLF CRLF; a bare LF LF is taken too).
  size_t end = input.find("\r\n\r\n");
  size_t end_len = 4;
  if (size_t lf = input.find("\n\n"); lf != std::string::npos && (end == std::string::npos || lf < end)) {
    end = lf;
    end_len = 2;
  }
  // The request line alone can be judged before the head is complete.
  size_t eol = input.find('\n');
  if (eol == std::string::npos) {
    if (input.size() >= kMaxHead) return Error(431, "the request line is longer than 8 KiB");
    if (eof) return Error(400, "the request ended before its request line did");
    return Handshake::Step{};
  }
  std::string line = input.substr(0, eol);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string::npos || sp2 == sp1) return Error(400, "not an HTTP request line: METHOD PATH HTTP/1.1");
  std::string method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
              version = line.substr(sp2 + 1);
  if (version.rfind("HTTP/", 0) != 0) return Error(400, "not an HTTP request line: METHOD PATH HTTP/1.1");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return Error(505, "HTTP/1.0 and HTTP/1.1 only");
  for (char c : method)
    if (c < 'A' || c > 'Z') return Error(400, "not an HTTP method");
  if (method != "GET" && method != "HEAD") return Error(405, "GET and HEAD only", "Allow: GET, HEAD\r\n");
  std::string path = target.substr(0, target.find('?'));
  if (std::find(paths_.begin(), paths_.end(), path) == paths_.end()) {
    std::string known;
    for (const auto& p : paths_) known += (known.empty() ? "" : ", ") + p;
    return Error(404, "no such page; this server has " + known);
  }
  if (end == std::string::npos) {
    if (input.size() >= kMaxHead) return Error(431, "the request's headers are longer than 8 KiB");
    if (eof) return Error(400, "the request ended before its headers did");
    return Handshake::Step{};
  }
  // Header lines: "Name: value", nothing else (no folding).
  size_t at = eol + 1;
  while (at < end) {
    size_t next = input.find('\n', at);
    std::string h = input.substr(at, next - at);
    if (!h.empty() && h.back() == '\r') h.pop_back();
    size_t colon = h.find(':');
    if (colon == std::string::npos || colon == 0 || h[0] == ' ' || h[0] == '\t')
      return Error(400, "a malformed header line");
    at = next + 1;
  }
  request->method = method;
  request->path = path;
  Handshake::Step s;
  s.kind = Handshake::Step::kAdmit;
  s.consumed = end + end_len;
  return s;
}

}  // namespace dsec
