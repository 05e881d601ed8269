#include "actors/front/sdk_entry.hpp"

#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/multiplexer.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "wire/tls.hpp"

namespace dsec {

SdkDoor::SdkDoor(caf::actor_system& sys, entry_actor entry, std::string token, std::string token_hint,
                 std::function<void(int, const std::string&)> log)
    : SdkDoor(sys, door::kSdk, caf::actor_cast<caf::strong_actor_ptr>(entry), sys.message_types(entry),
              std::move(token), std::move(token_hint), std::move(log)) {}

SdkDoor::SdkDoor(caf::actor_system& sys, door::Service service, caf::strong_actor_ptr served,
                 std::set<std::string> sigs, std::string token, std::string token_hint,
                 std::function<void(int, const std::string&)> log)
    : door::TokenDoor(
          service, std::move(token), std::move(token_hint),
          [this](UniqueFd fd, const std::string& peer) { Hand(std::move(fd), peer); }, log),
      sys_(sys),
      // Looked up here, on the thread that starts dsecd: named_broker is not
      // safe to call from the door's thread.
      basp_(sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"))),
      entry_(std::move(served)),
      sigs_(std::move(sigs)),
      log_(std::move(log)) {}

namespace {

// CAF names a connection by its socket's descriptor number, and BASP
// forgets a closed connection (its routing entry, by that name) a while
// after the socket is closed, through its queue. The kernel hands out the
// lowest free number, so under a storm of short connections a new one got
// the number of one BASP had not yet forgotten, and the late clean-up of
// the old one removed the new one's route: its replies were lost (0.2-0.5%
// of 2 000 dsecctl runs at 64 at a time waited 5 s and failed). Each
// admitted socket is moved to the next number of a wide window instead, so
// a number comes back only after the whole window has been used.
int Renumbered(int fd) {
  static std::atomic<int> next{0};
  static const int lo = 4096, hi = [] {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t cap = std::min<rlim_t>(rl.rlim_cur, lo + (1 << 18));
    return static_cast<int>(cap);
  }();
  if (hi - lo < 1024) return fd;  // too few descriptors for a window: as the kernel gave it
  int want = next.load();
  if (want < lo || want >= hi) want = lo;
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, want);
  if (moved < 0 && want != lo) moved = ::fcntl(fd, F_DUPFD_CLOEXEC, lo);  // the top is taken: wrap
  if (moved < 0) return fd;
  next.store(moved + 1);
  ::close(fd);
  return moved;
}

}  // namespace

void SdkDoor::Hand(UniqueFd fd, const std::string& peer) {
  // What BASP does for a connection its doorman accepted, through the
  // message it also takes from tests: the broker adopts the socket, writes
  // the server handshake and serves `entry_` on it. Making the scribe here
  // only wraps the socket; the broker registers it with the multiplexer.
  // With --tls the scribe is a TLS session, its handshake the first bytes.
  auto scribe = tls::NewScribe(sys_, Renumbered(fd.Release()), flags() & door::kFlagTls, /*accepted=*/true);
  if (!scribe.ok()) {
    if (log_) log_(3, std::string(name()) + ": " + peer + ": " + scribe.status().message());
    return;
  }
  caf::anon_send(basp_, caf::publish_atom::value, std::move(*scribe), port_.load(), entry_, sigs_);
}

}  // namespace dsec
