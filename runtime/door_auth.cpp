#include "runtime/door_auth.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

namespace dsec::door {

namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[4] = {'d', 's', 'e', 'c'};
constexpr char kContext[] = "dsec-door-v1";
constexpr char kNodeContext[] = "dsec-door-v1-node";

// Random bytes, or false (then nothing is sent: a guessable nonce would
// make the handshake replayable).
bool RandomBytes(char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(out + got, n - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
    else if (errno != EINTR) return false;
  }
  return true;
}

std::string Header(uint8_t version, uint8_t service, uint8_t flags = 0) {
  std::string h(kMagic, 4);
  h.push_back(static_cast<char>(version));
  h.push_back(static_cast<char>(service));
  h.push_back(static_cast<char>(flags));
  h.push_back(0);
  return h;
}

std::string Mac(const std::string& token, const char* context, const std::string& challenge,
                const std::string& client_nonce) {
  std::string data = std::string(context) + challenge + client_nonce;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string VerdictBytes(Verdict v, const std::string& text) {
  std::string t = text.substr(0, kMaxVerdictText);
  std::string out(kMagic, 4);
  out.push_back(static_cast<char>(v));
  out.push_back(0);
  out.push_back(static_cast<char>(t.size() >> 8));
  out.push_back(static_cast<char>(t.size() & 0xff));
  return out + t;
}

const char* ServiceName(uint8_t s) {
  return s == kSdk ? "the SDK entry" : s == kCluster ? "a controller's cluster port" : "an unknown service";
}

const char* SecretName(uint8_t s) { return s == kCluster ? "cluster secret" : "SDK token"; }

}  // namespace

// --- server side --------------------------------------------------------

struct TokenDoor::State : Handshake {
  TokenDoor* door = nullptr;
  std::string peer;
  std::string challenge;
  bool broken = false;  // no random challenge could be made
  size_t Wants(const std::string& input) const override {
    return input.size() < kResponseSize ? kResponseSize - input.size() : 0;
  }
  Step OnInput(const std::string& in, bool eof) override {
    Step s;
    if (broken) {
      s.kind = Step::kReject;
      return s;
    }
    // Judged at the first byte that cannot be right.
    size_t n = std::min(in.size(), size_t{4});
    if (std::memcmp(in.data(), kMagic, n) != 0) {
      s.kind = Step::kReject;
      return s;
    }
    if (in.size() > 4 && static_cast<uint8_t>(in[4]) != kVersion) {
      s.kind = Step::kReject;
      s.reply = VerdictBytes(kWrongVersion, "this dsecd speaks door version " + std::to_string(kVersion) +
                                                ", the client " + std::to_string(static_cast<uint8_t>(in[4])) +
                                                " (use an SDK of the same dsec version)");
      return s;
    }
    if (in.size() > 5 && static_cast<uint8_t>(in[5]) != door->service_) {
      s.kind = Step::kReject;
      s.reply = VerdictBytes(kWrongService, std::string("this port is ") + ServiceName(door->service_) +
                                                ", not " + ServiceName(static_cast<uint8_t>(in[5])));
      return s;
    }
    if (in.size() < kResponseSize) {
      if (eof) s.kind = Step::kReject;
      return s;
    }
    s.consumed = kResponseSize;
    std::string client_nonce = in.substr(8, 32);
    for (const auto& token : door->Tokens()) {
      std::string want = Mac(token, kContext, challenge, client_nonce);
      if (want.size() == 32 && CRYPTO_memcmp(want.data(), in.data() + 40, 32) == 0) {
        s.kind = Step::kAdmit;
        s.reply = VerdictBytes(kAdmitted, Mac(token, kNodeContext, challenge, client_nonce));
        return s;
      }
    }
    s.kind = Step::kReject;
    s.reply = VerdictBytes(kWrongToken, std::string("wrong ") + SecretName(door->service_) +
                                            (door->hint_.empty() ? "" : " (" + door->hint_ + ")"));
    // A node with the wrong secret is an operator's mistake (or an attack):
    // logged. A wrong SDK token is the client's to report.
    if (door->service_ == kCluster) door->LogRefusal(peer);
    return s;
  }
};

TokenDoor::TokenDoor(Service service, std::string token, std::string token_hint, AdmitFn admit, LogFn log)
    : service_(service), tokens_{std::move(token)}, hint_(std::move(token_hint)), admit_(std::move(admit)),
      log_(std::move(log)) {}

// At most one line a second (a flood of wrong secrets must not fill the
// disk), saying how many were not logged.
void TokenDoor::LogRefusal(const std::string& peer) {
  if (!log_) return;
  auto now = Clock::now();
  if (now - last_refusal_log_ < std::chrono::seconds(1)) {
    ++refusals_not_logged_;
    return;
  }
  last_refusal_log_ = now;
  std::string more = refusals_not_logged_ ? " (and " + std::to_string(refusals_not_logged_) +
                                                " more refusals since the last line)"
                                          : "";
  refusals_not_logged_ = 0;
  log_(2, "cluster door: " + peer + " answered with a wrong cluster secret; refused" + more +
              " (a node must be started with the controller's --cluster-secret file)");
}

void TokenDoor::AddToken(const std::string& token) {
  std::lock_guard<std::mutex> lk(mu_);
  if (std::find(tokens_.begin(), tokens_.end(), token) == tokens_.end()) tokens_.push_back(token);
}

std::vector<std::string> TokenDoor::Tokens() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tokens_;
}

std::unique_ptr<Handshake> TokenDoor::Begin(const std::string& peer, std::string* greeting) {
  auto st = std::make_unique<State>();
  st->door = this;
  st->peer = peer;
  char nonce[32];
  if (!RandomBytes(nonce, sizeof nonce)) {
    // No challenge without a random one: the connection is refused (its
    // handshake judges an empty challenge wrong).
    if (log_) log_(3, std::string("sdk door: getrandom: ") + std::strerror(errno) + "; refusing connections");
    st->broken = true;
    return st;
  }
  st->challenge = Header(kVersion, service_, flags_.load()) + std::string(nonce, sizeof nonce);
  *greeting = st->challenge;
  return st;
}

void TokenDoor::Admit(UniqueFd fd, std::string leftover, const std::string& peer) {
  // The client waits for the verdict before it sends a byte more: nothing
  // can be left over. A peer that sent more anyway broke the protocol.
  if (!leftover.empty()) {
    if (log_) log_(2, "sdk door: " + peer + " sent bytes before its verdict; closed");
    return;
  }
  admit_(std::move(fd), peer);
}

// --- client side --------------------------------------------------------

namespace {

int MsLeft(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

Status ReadExactly(int fd, char* buf, size_t n, Clock::time_point deadline, const std::string& where,
                   const char* what) {
  size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, MsLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return Status::DeadlineExceeded(std::string("no ") + what + " from " + where + " in time");
    ssize_t r = ::recv(fd, buf + got, n - got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0)
      return Status::Unavailable(where + " closed the connection before its " + what +
                                 " (is it a dsecd SDK port? dsecd --listen)");
    if (r < 0) return Status::FromErrno(errno, "read from " + where);
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace

Result<UniqueFd> Dial(const std::string& host, uint16_t port, const std::string& token, Service service,
                      std::chrono::milliseconds timeout, bool* refused, uint8_t* flags) {
  if (refused) *refused = false;
  if (flags) *flags = 0;
  std::string where = host + ":" + std::to_string(port);
  auto deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return Status::Unavailable("cannot resolve " + host + ": " + ::gai_strerror(rc));
  Status last = Status::Unavailable("cannot connect to " + where);
  UniqueFd fd;
  for (addrinfo* ai = res; ai && !fd; ai = ai->ai_next) {
    UniqueFd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s) continue;
    int c = ::connect(s.get(), ai->ai_addr, ai->ai_addrlen);
    if (c < 0 && errno == EINPROGRESS) {
      pollfd p{s.get(), POLLOUT, 0};
      int pr;
      do pr = ::poll(&p, 1, MsLeft(deadline));
      while (pr < 0 && errno == EINTR);
      if (pr == 0) {
        last = Status::DeadlineExceeded("cannot connect to " + where + " within " + std::to_string(timeout.count()) +
                                        " ms");
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      c = err ? -1 : 0;
      errno = err;
    }
    if (c < 0) {
      if (errno == ECONNREFUSED && refused) *refused = true;
      last = Status::Unavailable("cannot connect to " + where + ": " + std::strerror(errno));
      continue;
    }
    fd = std::move(s);
  }
  ::freeaddrinfo(res);
  if (!fd) return last;
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char challenge[kChallengeSize];
  DSEC_RETURN_IF_ERROR(ReadExactly(fd.get(), challenge, sizeof challenge, deadline, where, "challenge"));
  if (std::memcmp(challenge, kMagic, 4) != 0)
    return Status::FailedPrecondition(where + " is not a dsec SDK port (no dsec challenge; is it the admin console?)");
  if (static_cast<uint8_t>(challenge[4]) != kVersion)
    return Status::FailedPrecondition(where + " speaks door version " + std::to_string(uint8_t(challenge[4])) +
                                      ", this client " + std::to_string(kVersion) +
                                      " (use an SDK of the same dsec version)");
  if (static_cast<uint8_t>(challenge[5]) != service)
    return Status::FailedPrecondition(where + " is " + ServiceName(uint8_t(challenge[5])) + ", not " +
                                      ServiceName(service));
  if (token.empty())
    return Status::Unauthenticated(std::string("no ") + SecretName(service) + " to answer the challenge of " + where +
                                   " with");
  char nonce[32];
  if (!RandomBytes(nonce, sizeof nonce)) return Status::FromErrno(errno, "getrandom");
  std::string client_nonce(nonce, sizeof nonce), chal(challenge, sizeof challenge);
  std::string response = Header(kVersion, service) + client_nonce + Mac(token, kContext, chal, client_nonce);
  size_t off = 0;
  while (off < response.size()) {
    ssize_t n = ::send(fd.get(), response.data() + off, response.size() - off, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
      pollfd p{fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, MsLeft(deadline)) == 0) return Status::DeadlineExceeded("sending to " + where + " timed out");
      continue;
    }
    if (n <= 0) return Status::FromErrno(errno, "send to " + where);
    off += static_cast<size_t>(n);
  }
  char head[8];
  DSEC_RETURN_IF_ERROR(ReadExactly(fd.get(), head, sizeof head, deadline, where, "verdict"));
  if (std::memcmp(head, kMagic, 4) != 0) return Status::FailedPrecondition(where + " sent a malformed verdict");
  size_t len = (static_cast<size_t>(static_cast<uint8_t>(head[6])) << 8) | static_cast<uint8_t>(head[7]);
  if (len > kMaxVerdictText) return Status::FailedPrecondition(where + " sent a malformed verdict");
  std::string text(len, '\0');
  if (len) DSEC_RETURN_IF_ERROR(ReadExactly(fd.get(), text.data(), len, deadline, where, "verdict"));
  switch (static_cast<uint8_t>(head[4])) {
    case kAdmitted: {
      // The node must prove it holds the token too.
      std::string proof = Mac(token, kNodeContext, chal, client_nonce);
      if (text.size() != proof.size() || CRYPTO_memcmp(text.data(), proof.data(), proof.size()) != 0)
        return Status::FailedPrecondition(where + " admitted the client without knowing the " + SecretName(service) +
                                          ": it is not the dsecd whose " + SecretName(service) +
                                          " this is (something else holds the port?)");
      break;
    }
    case kWrongToken: return Status::Unauthenticated("dsecd at " + where + " refused the connection: " + text);
    default: return Status::FailedPrecondition("dsecd at " + where + " refused the connection: " + text);
  }
  // What follows the door (the challenge's flags are covered by the MAC: a
  // man in the middle cannot turn TLS off).
  if (flags) *flags = static_cast<uint8_t>(challenge[6]);
  // Blocking from here: CAF sets its own flags on the socket it adopts.
  int mode = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, mode & ~O_NONBLOCK);
  return fd;
}

}  // namespace dsec::door
