// The front door: one thread that accepts on dsecd's public ports and keeps
// a stranger's bytes away from the parsers behind them (CAF's BASP for the
// SDK, the console's command loop) until the peer has proven itself. Per
// listener, at most `max_pending` connections are in their handshake (a new
// one pushes out the oldest that has sent nothing, else the oldest), each
// with a deadline and a buffer of at most
// the protocol's max_input() bytes, and a connection is closed at its first
// wrong byte: a garbage connection costs O(bytes it sent), nothing it claims.
// Only a connection that passed is handed on (HandshakeProtocol::Admit).
//
// Plain C++: no CAF here. The protocols (door_auth.hpp for the SDK, the
// console's gate) decide; the door only reads, writes, times and bounds.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dsec/status.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec {

// One connection's handshake, as its protocol sees it.
class Handshake {
 public:
  virtual ~Handshake() = default;
  struct Step {
    enum Kind { kMore, kAdmit, kReject };
    Kind kind = kMore;
    std::string reply;    // written to the peer first (before the hand-off or the close)
    size_t consumed = 0;  // bytes of the input used up (dropped from the front)
  };
  // How many more bytes may be read now (never past what the protocol
  // needs: a peer's bytes after its handshake stay in the socket for the
  // parser behind the door).
  virtual size_t Wants(const std::string& input) const = 0;
  // The input grew (or the peer closed its side: eof). Decides.
  virtual Step OnInput(const std::string& input, bool eof) = 0;
};

class HandshakeProtocol {
 public:
  virtual ~HandshakeProtocol() = default;
  virtual const char* name() const = 0;
  // A new connection from `peer` (host:port): its state, and bytes to
  // send it at once (a challenge).
  virtual std::unique_ptr<Handshake> Begin(const std::string& peer, std::string* greeting) = 0;
  // The peer passed: `fd` is its (non-blocking) socket, `leftover` what it
  // sent after its handshake that the door had read. Runs on the door's
  // thread: hand the socket on, do not block.
  virtual void Admit(UniqueFd fd, std::string leftover, const std::string& peer) = 0;
};

struct FrontDoorListener {
  std::string name;                  // "sdk", "console", "http", "cluster": how it is found
  std::string host = "127.0.0.1";
  uint16_t port = 0;                 // 0: any free port
  HandshakeProtocol* protocol = nullptr;  // outlives the door
  size_t max_pending = 256;          // connections in their handshake at once
  int timeout_ms = 5000;             // to finish the handshake
  size_t max_input = 4096;           // bytes buffered per connection, at most
};

struct FrontDoorStats {
  uint64_t accepted = 0;   // connections taken from the kernel
  uint64_t admitted = 0;   // passed their handshake
  uint64_t rejected = 0;   // failed it (wrong bytes, wrong token, closed early)
  uint64_t timed_out = 0;  // did not finish it in time
  uint64_t evicted = 0;    // pushed out by a newer one at max_pending
  uint64_t pending = 0;    // in their handshake now
};

class FrontDoor {
 public:
  using LogFn = std::function<void(int level, const std::string& text)>;  // 0 debug .. 3 error
  // Binds every listener (an error names the address) and starts the thread.
  static Result<std::unique_ptr<FrontDoor>> Start(std::vector<FrontDoorListener> listeners, LogFn log = nullptr);
  ~FrontDoor();
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;

  // The bound port of the listener named `name` (0: none by that name),
  // and "host:port" with it.
  uint16_t port(const std::string& name) const;
  std::string address(const std::string& name) const;
  bool has(const std::string& name) const;
  // Stops accepting and closes every connection still in its handshake.
  void Stop();
  // The counters of the listener named `name` (zeros: none by that name).
  FrontDoorStats stats(const std::string& name) const;

  struct Impl;

 private:
  explicit FrontDoor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "host:port" split; false when it is not that (port 0-65535).
bool SplitHostPort(const std::string& s, std::string* host, uint16_t* port);

}  // namespace dsec
