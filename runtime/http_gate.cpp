#include "runtime/http_gate.hpp"

#include <boost/beast/http.hpp>

#include "runtime/http_server.hpp"

namespace dsec {

namespace http = boost::beast::http;

namespace {

Handshake::Step Error(int code, const std::string& why) {
  Handshake::Step s;
  s.kind = Handshake::Step::kReject;
  s.reply = HttpResponse(code, "text/plain; charset=utf-8", why + "\n");
  return s;
}

}  // namespace

std::string HttpResponse(int code, const std::string& content_type, const std::string& body, bool head,
                         const std::string& extra_headers) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + HttpReason(code) + "\r\nContent-Type: " + content_type +
                  "\r\nContent-Length: " + std::to_string(body.size()) +
                  "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n" +
                  extra_headers + "\r\n";
  if (!head) r += body;
  return r;
}

// Feeds the parser only what it has not taken yet: a peer that sends one
// byte at a time costs O(bytes), not O(bytes^2).
class HttpGate::Conn final : public Handshake {
 public:
  explicit Conn(size_t max_head) : max_head_(max_head) {
    parser_.header_limit(static_cast<std::uint32_t>(max_head));
    parser_.eager(false);
  }
  size_t Wants(const std::string& input) const override { return max_head_ - std::min(input.size(), max_head_); }
  Step OnInput(const std::string& input, bool eof) override {
    boost::beast::error_code ec;
    while (!parser_.is_header_done() && taken_ < input.size()) {
      size_t n = parser_.put(boost::asio::buffer(input.data() + taken_, input.size() - taken_), ec);
      taken_ += n;
      if (ec == http::error::need_more) {
        ec = {};
        break;
      }
      if (ec == http::error::header_limit)
        return Error(431, "the request's head is longer than " + std::to_string(max_head_ / 1024) + " KiB");
      if (ec == http::error::bad_version && input.substr(0, input.find('\n')).find(" HTTP/") != std::string::npos)
        return Error(505, "HTTP/1.0 and HTTP/1.1 only");
      if (ec) return Error(400, "not a well-formed HTTP request: " + ec.message());
      if (n == 0) break;
    }
    if (!parser_.is_header_done()) {
      if (input.size() >= max_head_)
        return Error(431, "the request's head is longer than " + std::to_string(max_head_ / 1024) + " KiB");
      if (eof) return Error(400, "the request ended before its head did");
      return Step{};
    }
    unsigned v = parser_.get().version();
    if (v != 10 && v != 11) return Error(505, "HTTP/1.0 and HTTP/1.1 only");
    Step s;
    s.kind = Step::kAdmit;  // consumed 0: the server reads the head again
    return s;
  }

 private:
  size_t max_head_;
  size_t taken_ = 0;
  http::request_parser<http::empty_body> parser_;
};

HttpGate::HttpGate(Admitted admitted, size_t max_head) : admitted_(std::move(admitted)), max_head_(max_head) {}

std::unique_ptr<Handshake> HttpGate::Begin(const std::string&, std::string*) {
  return std::make_unique<Conn>(max_head_);
}

void HttpGate::Admit(UniqueFd fd, std::string leftover, const std::string& peer) {
  admitted_(std::move(fd), std::move(leftover), peer);
}

}  // namespace dsec
