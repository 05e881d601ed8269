#include "actors/front/console.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/log.hpp"

namespace dsec {
namespace {

// A socket the gate admitted, on its way to the broker: closed if the
// message is dropped (the broker gone) instead of leaking.
struct AdoptedConn {
  std::shared_ptr<UniqueFd> fd;
  std::string leftover;  // bytes after the AUTH line (pipelined commands)
  std::string peer;
};

}  // namespace
}  // namespace dsec

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::AdoptedConn)

namespace dsec {

namespace {

using nlohmann::json;
using caf::io::connection_handle;
using adopt_atom = caf::atom_constant<caf::atom("adopt")>;

std::string Line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }
std::string ErrorLine(const std::string& msg) { return Line(json{{"ok", false}, {"error", msg}}); }

std::string HelpLine() {
  return Line(json{{"ok", true},
                   {"commands",
                    {"AUTH <token>   authenticate (first; token in <data-dir>/admin.token)",
                     "status         node, uptime, kinds, counts", "nodes          the node records (one node in role all)",
                     "ls [--node N] [--kind K] [--state S]   sandboxes, sessions, runs in flight",
                     "sessions       rollout sessions: phase, steps, sandboxes, why closed",
                     "inspect ID     one sandbox, session or run", "kill ID        stop a run, destroy a sandbox, close a session",
                     "stats          counters of the node, the store and the drivers",
                     "drain N        (controller) no new placements on node N; undrain N undoes it",
                     "e2b-key ls | issue NAME | revoke NAME   the E2B door's API keys (issue prints the key once)",
                     "quit           close this connection"}}});
}

bool TokenEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.size() ? b.size() : 1)]);
  return diff == 0;
}

// "CMD arg..." -> lower-case cmd and its arguments.
std::string ParseLine(const std::string& line, std::vector<std::string>* args) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  for (std::string a; in >> a;) args->push_back(a);
  for (auto& ch : cmd) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return cmd;
}

constexpr int kMaxBadTokens = 3;         // then the connection is closed
constexpr int kMaxUnauthenticated = 20;  // commands refused before AUTH, then closed
constexpr size_t kMaxQueuedLines = 256;  // pipelined commands waiting

// Repeated wrong tokens slow their host down: after kFreeWrongTokens wrong
// tokens from one address (over any number of connections), every AUTH from
// it is refused unchecked for a wait that doubles with each further wrong
// one (1 s, 2 s, 4 s, ... 60 s), and a right token resets it. A guesser
// gets a handful of tries a minute however many connections it opens;
// another address, the operator's, is not held up. At most kMaxHosts
// addresses are remembered (past that, the one quiet longest is forgotten).
// On the front door's thread only.
class WrongTokenBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kFreeWrongTokens = 3;
  static constexpr size_t kMaxHosts = 4096;
  static constexpr std::chrono::seconds kMaxWait{60};

  // How long `host` must still wait before its next AUTH is checked.
  std::chrono::milliseconds Wait(const std::string& host, Clock::time_point now) const {
    auto it = hosts_.find(host);
    if (it == hosts_.end() || it->second.until <= now) return std::chrono::milliseconds(0);
    return std::chrono::duration_cast<std::chrono::milliseconds>(it->second.until - now) + std::chrono::milliseconds(1);
  }
  void Wrong(const std::string& host, Clock::time_point now) {
    if (hosts_.size() >= kMaxHosts && !hosts_.count(host)) {
      auto oldest = hosts_.begin();
      for (auto it = hosts_.begin(); it != hosts_.end(); ++it)
        if (it->second.last < oldest->second.last) oldest = it;
      hosts_.erase(oldest);
    }
    Host& h = hosts_[host];
    h.last = now;
    if (++h.wrong < kFreeWrongTokens) return;
    int doublings = std::min(h.wrong - kFreeWrongTokens, 6);
    h.until = now + std::min<Clock::duration>(std::chrono::seconds(1) * (1 << doublings), kMaxWait);
  }
  void Right(const std::string& host) { hosts_.erase(host); }

 private:
  struct Host {
    int wrong = 0;
    Clock::time_point until{}, last{};
  };
  std::map<std::string, Host> hosts_;
};

// "host:port" (or "[v6]:port") -> host.
std::string HostOf(const std::string& peer) {
  size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

// --- the gate: a connection until its AUTH, on the front door's thread ---

class Gate : public HandshakeProtocol {
 public:
  Gate(caf::actor broker, ConsoleOptions opts) : broker_(std::move(broker)), opts_(std::move(opts)), log_(Logger("console")) {}
  const char* name() const override { return "console"; }

  struct State : Handshake {
    Gate* gate = nullptr;
    std::string peer;
    int bad_tokens = 0, refused = 0;
    size_t Wants(const std::string& in) const override {
      return in.size() <= gate->opts_.max_line + 1 ? gate->opts_.max_line + 2 - in.size() : 0;
    }
    Step OnInput(const std::string& in, bool eof) override {
      Step s;
      auto nl = in.find('\n');
      if (nl == std::string::npos) {
        if (in.size() > gate->opts_.max_line) {
          s.reply = ErrorLine("line too long (max " + std::to_string(gate->opts_.max_line) + " bytes); closing");
          s.kind = Step::kReject;
        } else if (eof) {
          s.kind = Step::kReject;
        }
        return s;
      }
      s.consumed = nl + 1;
      std::string line = in.substr(0, nl);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.size() > gate->opts_.max_line) {
        s.reply = ErrorLine("line too long (" + std::to_string(line.size()) + " bytes; max " +
                            std::to_string(gate->opts_.max_line) + "); closing");
        s.kind = Step::kReject;
        return s;
      }
      std::vector<std::string> args;
      std::string cmd = ParseLine(line, &args);
      if (cmd.empty()) return s;
      if (cmd == "help") {
        s.reply = HelpLine();
      } else if (cmd == "quit" || cmd == "exit") {
        s.reply = Line(json{{"ok", true}, {"bye", true}});
        s.kind = Step::kReject;
      } else if (cmd == "auth") {
        auto now = WrongTokenBackoff::Clock::now();
        std::string host = HostOf(peer);
        if (auto wait = gate->backoff_.Wait(host, now); wait.count() > 0) {
          // Not even compared: a guess now tells nothing.
          s.reply = ErrorLine("too many wrong tokens from " + host + ": AUTH is refused for another " +
                              std::to_string((wait.count() + 999) / 1000) + " s");
          if (++bad_tokens >= kMaxBadTokens) s.kind = Step::kReject;
        } else if (args.size() == 1 && TokenEquals(args[0], gate->opts_.token)) {
          gate->backoff_.Right(host);
          s.reply = Line(json{{"ok", true}, {"auth", "ok"}});
          s.kind = Step::kAdmit;
        } else {
          gate->backoff_.Wrong(host, now);
          gate->WrongToken(peer);
          s.reply = ErrorLine("wrong token (it is in <data-dir>/admin.token)");
          if (++bad_tokens >= kMaxBadTokens) s.kind = Step::kReject;
        }
      } else {
        s.reply = ErrorLine("not authenticated: send 'AUTH <token>' first (the token is in <data-dir>/admin.token)");
        if (++refused >= kMaxUnauthenticated) s.kind = Step::kReject;
      }
      return s;
    }
  };

  std::unique_ptr<Handshake> Begin(const std::string& peer, std::string*) override {
    auto st = std::make_unique<State>();
    st->gate = this;
    st->peer = peer;
    return st;
  }

  void Admit(UniqueFd fd, std::string leftover, const std::string& peer) override {
    caf::anon_send(broker_, adopt_atom::value,
                   AdoptedConn{std::make_shared<UniqueFd>(std::move(fd)), std::move(leftover), peer});
  }

 private:
  // Logged at most once a second, with how many were not: a flood of wrong
  // tokens must not flood the log.
  void WrongToken(const std::string& peer) {
    auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lk(log_mu_);
    if (now - last_log_ < std::chrono::seconds(1)) {
      ++unlogged_;
      return;
    }
    last_log_ = now;
    if (unlogged_) log_->warn("console: wrong token from {} ({} more wrong tokens since the last report)", peer, unlogged_);
    else log_->warn("console: wrong token from {}", peer);
    unlogged_ = 0;
  }

  caf::actor broker_;
  ConsoleOptions opts_;
  WrongTokenBackoff backoff_;
  std::shared_ptr<spdlog::logger> log_;
  std::mutex log_mu_;
  std::chrono::steady_clock::time_point last_log_{};
  uint64_t unlogged_ = 0;
};

// --- the broker: authenticated connections ------------------------------

struct Conn {
  // CAF derives connection handles from socket fds, which the kernel reuses:
  // a reply arriving for a connection that has gone must not reach the next
  // one on the same handle. Replies carry the generation they were asked in.
  uint64_t gen = 0;
  std::string peer;
  std::string inbuf;
  std::deque<std::string> lines;  // waiting for the previous command's reply
  bool busy = false;
  int bad_tokens = 0;
};

struct ConsoleState {
  ConsoleOptions opts;
  admin_actor node;
  std::map<connection_handle, Conn> conns;
  uint64_t next_gen = 0;
  std::shared_ptr<spdlog::logger> log;
  static constexpr const char* name = "console";
};

using Broker = caf::io::stateful_broker<ConsoleState>*;

void Send(Broker self, connection_handle h, const std::string& text) {
  if (!self->valid(h)) return;  // async replies may arrive after the peer left
  self->write(h, text.size(), text.data());
  self->flush(h);
}

void Close(Broker self, connection_handle h) {
  self->close(h);  // no connection_closed_msg follows a local close
  self->state.conns.erase(h);
}

void Pump(Broker self, connection_handle h);

// Handles one line; returns false when the connection was closed.
bool HandleLine(Broker self, connection_handle h, const std::string& line) {
  auto& st = self->state;
  auto it = st.conns.find(h);
  if (it == st.conns.end()) return false;
  Conn& c = it->second;
  std::vector<std::string> args;
  std::string cmd = ParseLine(line, &args);
  if (cmd.empty()) return true;
  if (cmd == "help") {
    Send(self, h, HelpLine());
    return true;
  }
  if (cmd == "quit" || cmd == "exit") {
    Send(self, h, Line(json{{"ok", true}, {"bye", true}}));
    Close(self, h);
    return false;
  }
  if (cmd == "auth") {  // again: harmless, but still checked
    if (args.size() == 1 && TokenEquals(args[0], st.opts.token)) {
      Send(self, h, Line(json{{"ok", true}, {"auth", "ok"}}));
      return true;
    }
    st.log->warn("console: wrong token from {}", c.peer);
    Send(self, h, ErrorLine("wrong token (it is in <data-dir>/admin.token)"));
    if (++c.bad_tokens >= kMaxBadTokens) {
      Close(self, h);
      return false;
    }
    return true;
  }
  static const char* kKnown[] = {"status", "nodes", "ls",    "sessions", "inspect", "kill",
                                 "stats",  "crash", "fault", "drain",    "undrain", "e2b-key"};
  bool known = false;
  for (const char* k : kKnown) known = known || cmd == k;
  if (!known) {
    Send(self, h, ErrorLine("unknown command '" + cmd + "' (help lists the commands)"));
    return true;
  }
  if (cmd == "kill" || cmd == "drain" || cmd == "undrain")
    st.log->warn("console: {} {} from {}", cmd, args.empty() ? "" : args[0], c.peer);
  c.busy = true;
  uint64_t gen = c.gen;
  auto answer = [self, h, gen](const std::string& line) {
    auto it = self->state.conns.find(h);
    if (it == self->state.conns.end() || it->second.gen != gen) return;  // that client has gone
    Send(self, h, line);
    it->second.busy = false;
    Pump(self, h);
  };
  self->request(st.node, std::chrono::seconds(35), admin_atom::value, cmd, args)
      .then([answer](const std::string& reply) { answer(reply + "\n"); },
            [self, answer](caf::error& e) { answer(ErrorLine("node did not answer: " + self->system().render(e))); });
  return true;
}

// Runs queued lines in order, one node request at a time per connection.
void Pump(Broker self, connection_handle h) {
  for (;;) {
    auto it = self->state.conns.find(h);
    if (it == self->state.conns.end() || it->second.busy || it->second.lines.empty()) return;
    std::string line = std::move(it->second.lines.front());
    it->second.lines.pop_front();
    if (!HandleLine(self, h, line)) return;
  }
}

// New bytes of connection `h`: split into lines, queued, run in order.
void OnData(Broker self, connection_handle h, const char* data, size_t n) {
  auto& st = self->state;
  auto it = st.conns.find(h);
  if (it == st.conns.end()) return;
  Conn& c = it->second;
  c.inbuf.append(data, n);
  for (auto pos = c.inbuf.find('\n'); pos != std::string::npos; pos = c.inbuf.find('\n')) {
    std::string line = c.inbuf.substr(0, pos);
    c.inbuf.erase(0, pos + 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() > st.opts.max_line) {
      Send(self, h, ErrorLine("line too long (" + std::to_string(line.size()) + " bytes; max " +
                              std::to_string(st.opts.max_line) + "); closing"));
      Close(self, h);
      return;
    }
    if (c.lines.size() >= kMaxQueuedLines) {
      Send(self, h, ErrorLine("too many commands queued (" + std::to_string(kMaxQueuedLines) +
                              "); wait for replies; closing"));
      Close(self, h);
      return;
    }
    c.lines.push_back(std::move(line));
  }
  if (c.inbuf.size() > st.opts.max_line) {
    Send(self, h, ErrorLine("line too long (max " + std::to_string(st.opts.max_line) + " bytes); closing"));
    Close(self, h);
    return;
  }
  Pump(self, h);
}

caf::behavior ConsoleBroker(Broker self, admin_actor node, ConsoleOptions opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.node = std::move(node);
  st.log = Logger("console");
  self->set_exit_handler([self](caf::exit_msg& em) { self->quit(em.reason); });
  return {
      [self](adopt_atom, AdoptedConn& a) {
        auto& st = self->state;
        int fd = a.fd->Release();
        auto h = self->add_scribe(fd);
        if (st.conns.size() >= st.opts.max_connections) {
          Send(self, h, ErrorLine("too many console connections (" + std::to_string(st.opts.max_connections) + ")"));
          self->close(h);
          return;
        }
        Conn c;
        c.gen = ++st.next_gen;
        c.peer = a.peer;
        st.conns[h] = std::move(c);
        self->configure_read(h, caf::io::receive_policy::at_most(4096));
        if (!a.leftover.empty()) OnData(self, h, a.leftover.data(), a.leftover.size());
      },
      [self](const caf::io::new_data_msg& m) { OnData(self, m.handle, m.buf.data(), m.buf.size()); },
      [self](const caf::io::connection_closed_msg& m) { self->state.conns.erase(m.handle); },
  };
}

}  // namespace

Console SpawnConsole(caf::actor_system& sys, admin_actor node, const ConsoleOptions& options) {
  Console c;
  c.broker = sys.middleman().spawn_broker(ConsoleBroker, std::move(node), options);
  c.gate = std::make_unique<Gate>(c.broker, options);
  return c;
}

}  // namespace dsec
