#include "actors/console.hpp"

#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/log.hpp"

namespace dsec {

namespace {

using nlohmann::json;
using caf::io::connection_handle;

struct Conn {
  // CAF derives connection handles from socket fds, which the kernel reuses:
  // a reply arriving for a connection that has gone must not reach the next
  // one on the same handle. Replies carry the generation they were asked in.
  uint64_t gen = 0;
  std::string inbuf;
  std::deque<std::string> lines;  // waiting for the previous command's reply
  bool busy = false;
  bool authed = false;
  int bad_auth = 0;
  int unauthenticated = 0;  // commands refused before AUTH
};

constexpr int kMaxUnauthenticated = 20;  // then the connection is closed
constexpr size_t kMaxQueuedLines = 256;  // pipelined commands waiting

struct ConsoleState {
  ConsoleOptions opts;
  node_actor node;
  std::map<connection_handle, Conn> conns;
  uint64_t next_gen = 0;
  uint16_t port = 0;
  std::shared_ptr<spdlog::logger> log;
  static constexpr const char* name = "console";
};

using Broker = caf::io::stateful_broker<ConsoleState>*;

std::string Line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }
std::string ErrorLine(const std::string& msg) { return Line(json{{"ok", false}, {"error", msg}}); }

void Send(Broker self, connection_handle h, const std::string& text) {
  if (!self->valid(h)) return;  // async replies may arrive after the peer left
  self->write(h, text.size(), text.data());
  self->flush(h);
}

void Close(Broker self, connection_handle h) {
  self->close(h);  // no connection_closed_msg follows a local close
  self->state.conns.erase(h);
}

bool TokenEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.size() ? b.size() : 1)]);
  return diff == 0;
}

void Pump(Broker self, connection_handle h);

// Handles one line; returns false when the connection was closed.
bool HandleLine(Broker self, connection_handle h, const std::string& line) {
  auto& st = self->state;
  auto it = st.conns.find(h);
  if (it == st.conns.end()) return false;
  Conn& c = it->second;
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  std::vector<std::string> args;
  for (std::string a; in >> a;) args.push_back(a);
  if (cmd.empty()) return true;
  for (auto& ch : cmd) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (cmd == "help") {
    Send(self, h, Line(json{{"ok", true},
                            {"commands",
                             {"AUTH <token>   authenticate (first; token in <data-dir>/admin.token)",
                              "status         node, uptime, kinds, counts", "nodes          the node records (one node in role all)", "ls             sandboxes, sessions, runs in flight",
                              "sessions       rollout sessions: phase, steps, sandboxes, why closed",
                              "inspect ID     one sandbox, session or run", "kill ID        stop a run, destroy a sandbox, close a session",
                              "stats          counters of the node, the store and the drivers", "quit           close this connection"}}}));
    return true;
  }
  if (cmd == "quit" || cmd == "exit") {
    Send(self, h, Line(json{{"ok", true}, {"bye", true}}));
    Close(self, h);
    return false;
  }
  if (cmd == "auth") {
    if (args.size() == 1 && TokenEquals(args[0], st.opts.token)) {
      c.authed = true;
      Send(self, h, Line(json{{"ok", true}, {"auth", "ok"}}));
      return true;
    }
    st.log->warn("console: wrong token from {}", self->remote_addr(h));
    Send(self, h, ErrorLine("wrong token (it is in <data-dir>/admin.token)"));
    if (++c.bad_auth >= 3) {
      Close(self, h);
      return false;
    }
    return true;
  }
  if (!c.authed) {
    Send(self, h, ErrorLine("not authenticated: send 'AUTH <token>' first (the token is in <data-dir>/admin.token)"));
    if (++c.unauthenticated >= kMaxUnauthenticated) {
      Close(self, h);
      return false;
    }
    return true;
  }
  static const char* kKnown[] = {"status", "nodes", "ls", "sessions", "inspect", "kill", "stats", "crash"};
  bool known = false;
  for (const char* k : kKnown) known = known || cmd == k;
  if (!known) {
    Send(self, h, ErrorLine("unknown command '" + cmd + "' (help lists the commands)"));
    return true;
  }
  if (cmd == "kill") st.log->warn("console: kill {} from {}", args.empty() ? "" : args[0], self->remote_addr(h));
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

caf::behavior ConsoleBroker(Broker self, node_actor node, ConsoleOptions opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.node = std::move(node);
  st.log = Logger("console");
  auto acc = self->add_tcp_doorman(st.opts.port, st.opts.host.c_str(), true);
  if (!acc) {
    self->quit(acc.error());
    return {};
  }
  st.port = acc->second;
  self->set_exit_handler([self](caf::exit_msg& em) { self->quit(em.reason); });
  return {
      [self](caf::get_atom) { return self->state.port; },
      [self](const caf::io::new_connection_msg& m) {
        auto& st = self->state;
        if (st.conns.size() >= st.opts.max_connections) {
          std::string e = ErrorLine("too many console connections (" + std::to_string(st.opts.max_connections) + ")");
          self->write(m.handle, e.size(), e.data());
          self->flush(m.handle);
          self->close(m.handle);
          return;
        }
        Conn c;
        c.gen = ++st.next_gen;
        st.conns[m.handle] = std::move(c);
        self->configure_read(m.handle, caf::io::receive_policy::at_most(4096));
      },
      [self](const caf::io::new_data_msg& m) {
        auto& st = self->state;
        auto it = st.conns.find(m.handle);
        if (it == st.conns.end()) return;
        Conn& c = it->second;
        c.inbuf.append(m.buf.begin(), m.buf.end());
        for (auto pos = c.inbuf.find('\n'); pos != std::string::npos; pos = c.inbuf.find('\n')) {
          std::string line = c.inbuf.substr(0, pos);
          c.inbuf.erase(0, pos + 1);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          if (line.size() > st.opts.max_line) {
            Send(self, m.handle, ErrorLine("line too long (" + std::to_string(line.size()) + " bytes; max " +
                                           std::to_string(st.opts.max_line) + "); closing"));
            Close(self, m.handle);
            return;
          }
          if (c.lines.size() >= kMaxQueuedLines) {
            Send(self, m.handle, ErrorLine("too many commands queued (" + std::to_string(kMaxQueuedLines) +
                                           "); wait for replies; closing"));
            Close(self, m.handle);
            return;
          }
          c.lines.push_back(std::move(line));
        }
        if (c.inbuf.size() > st.opts.max_line) {
          Send(self, m.handle, ErrorLine("line too long (max " + std::to_string(st.opts.max_line) + " bytes); closing"));
          Close(self, m.handle);
          return;
        }
        Pump(self, m.handle);
      },
      [self](const caf::io::connection_closed_msg& m) { self->state.conns.erase(m.handle); },
      [self](const caf::io::acceptor_closed_msg&) { self->quit(); },
  };
}

}  // namespace

caf::expected<std::pair<caf::actor, uint16_t>> SpawnConsole(caf::actor_system& sys, node_actor node,
                                                             const ConsoleOptions& options) {
  auto broker = sys.middleman().spawn_broker(ConsoleBroker, std::move(node), options);
  caf::scoped_actor self{sys};
  caf::expected<std::pair<caf::actor, uint16_t>> out{caf::sec::cannot_open_port};
  self->monitor(broker);
  self->request(broker, std::chrono::seconds(5), caf::get_atom::value)
      .receive([&](uint16_t port) { out = std::make_pair(broker, port); },
               [&](caf::error&) {
                 // The broker quit: its bind failed.
                 self->receive([&](caf::down_msg& dm) {
                   out = caf::make_error(caf::sec::cannot_open_port,
                                         "admin console: cannot listen on " + options.host + ":" +
                                             std::to_string(options.port) + ": " + sys.render(dm.reason));
                 }, caf::after(std::chrono::seconds(1)) >> [&] {
                   out = caf::make_error(caf::sec::cannot_open_port,
                                         "admin console: cannot listen on " + options.host + ":" +
                                             std::to_string(options.port));
                 });
               });
  self->demonitor(broker);
  return out;
}

}  // namespace dsec
