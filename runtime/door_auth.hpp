// The SDK's handshake at the front door (front_door.hpp), before any CAF
// byte: the node sends a challenge, the client answers with a nonce of its
// own and an HMAC keyed by the node's SDK token, the node says yes or no
// and, on yes, proves it holds the token too. Fixed sizes, so a stranger's
// bytes are judged at once and the parser behind the door (BASP) only ever
// sees peers that hold the token; and a client never speaks BASP to a peer
// that does not (one squatting the port while dsecd is down). The token
// itself never crosses the wire.
//
//   node -> client  challenge  "dsec" version service flags 0 server_nonce[32]       40 bytes
//   client -> node  response   "dsec" version service 0 0 client_nonce[32] mac[32]   72 bytes
//   node -> client  verdict    "dsec" code 0 length(2, big-endian) text              8 + length bytes
//
// mac = HMAC-SHA256(token, "dsec-door-v1" || challenge || client_nonce);
// a verdict of 0 carries the node's proof as its text:
// HMAC-SHA256(token, "dsec-door-v1-node" || challenge || client_nonce).
// After it the connection belongs to the protocol behind the door (BASP:
// the node sends its handshake first), inside a TLS session when the
// challenge's flags have kFlagTls (wire/tls.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dsec/status.hpp"
#include "runtime/front_door.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::door {

inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kChallengeSize = 40;
inline constexpr size_t kResponseSize = 72;
inline constexpr size_t kMaxVerdictText = 1024;

// What the door guards (a client that dials the wrong port learns so).
// kCluster: a node joining its controller (dsecd --cluster-listen), keyed by
// the cluster secret instead of the SDK token.
enum Service : uint8_t { kSdk = 1, kCluster = 2 };

// The challenge's flags: what the connection turns into after the door.
inline constexpr uint8_t kFlagTls = 1;  // a TLS session (dsecd --tls), the door's peer the TLS server

enum Verdict : uint8_t {
  kAdmitted = 0,
  kWrongToken = 1,
  kWrongVersion = 2,
  kWrongService = 3,
};

// The server side, for FrontDoor: admits peers whose response matches.
class TokenDoor : public HandshakeProtocol {
 public:
  using AdmitFn = std::function<void(UniqueFd fd, const std::string& peer)>;
  using LogFn = std::function<void(int level, const std::string& text)>;
  // `token_hint` ends the wrong-token message ("read <data>/sdk.token").
  TokenDoor(Service service, std::string token, std::string token_hint, AdmitFn admit, LogFn log = nullptr);
  const char* name() const override { return service_ == kCluster ? "cluster door" : "sdk door"; }
  // Another token this door admits (a node admits its controller's SDK
  // token once it has joined). Safe from any thread.
  void AddToken(const std::string& token);
  // The flags its challenges carry (kFlagTls); set before it serves.
  void set_flags(uint8_t flags) { flags_ = flags; }
  uint8_t flags() const { return flags_.load(); }
  std::unique_ptr<Handshake> Begin(const std::string& peer, std::string* greeting) override;
  void Admit(UniqueFd fd, std::string leftover, const std::string& peer) override;

  struct State;

 private:
  // The tokens a response may be keyed by (the first is the door's own).
  std::vector<std::string> Tokens() const;
  void LogRefusal(const std::string& peer);  // on the door's thread
  std::chrono::steady_clock::time_point last_refusal_log_{};
  uint64_t refusals_not_logged_ = 0;
  Service service_;
  std::atomic<uint8_t> flags_{0};
  mutable std::mutex mu_;
  std::vector<std::string> tokens_;
  std::string hint_;
  AdmitFn admit_;
  LogFn log_;
};

// The client side: connects to host:port and goes through the door within
// `timeout`. The socket (blocking) once admitted; else Unavailable (cannot
// connect: `refused` tells a refused connection from others), Unauthenticated
// (wrong token, with the node's hint), FailedPrecondition (not a dsec door
// or another version), DeadlineExceeded. `flags`: the challenge's (kFlagTls:
// the caller must speak TLS from here, as the TLS client).
Result<UniqueFd> Dial(const std::string& host, uint16_t port, const std::string& token, Service service,
                      std::chrono::milliseconds timeout, bool* refused = nullptr, uint8_t* flags = nullptr);

}  // namespace dsec::door
