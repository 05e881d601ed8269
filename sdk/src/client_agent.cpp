#include "sdk/src/client_agent.hpp"

#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/network/multiplexer.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <set>
#include <unordered_map>
#include <utility>

#include "wire/wire.hpp"
#include "runtime/door_auth.hpp"
#include "wire/tls.hpp"

namespace dsec::sdk {

namespace {

// A socket through the door, on its way from the dialer to the agent:
// closed if the message is dropped.
struct Dialed {
  std::shared_ptr<UniqueFd> fd;
  Status status;        // why not, when fd is empty
  bool refused = false; // nothing listened there
  uint8_t flags = 0;    // the door's (kFlagTls: TLS from here)
};

}  // namespace
}  // namespace dsec::sdk

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::sdk::Dialed)

namespace dsec::sdk {

namespace {

using Clock = std::chrono::steady_clock;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using dial_atom = caf::atom_constant<caf::atom("dial")>;

// Annotations per AnnotateBatch (dsecd takes up to 4096).
constexpr int kMaxBatch = 1024;

struct Queued {
  Clock::time_point deadline;
  CallMsg call;
};

// A call sent to dsecd: its deadline, and the id its reply will carry.
struct Inflight {
  Clock::time_point deadline;
  caf::message_id reply_id;
  CallMsg call;
};

struct AgentState {
  std::string host;
  uint16_t port = 0;
  std::string token;
  std::string client_id;
  std::chrono::milliseconds connect_timeout{5000};
  AgentShared* shared = nullptr;
  bool to_node = false;  // a cluster node's agent: unsendable calls are rerouted
  caf::actor entry;
  caf::actor dialer;  // blocking connects and door handshakes, off the agent's thread
  bool connecting = false, ticking = false;
  bool ever_connected = false;
  std::chrono::milliseconds backoff{50};
  std::string last_error = "not connected yet";
  std::deque<Queued> queued;
  std::unordered_map<uint64_t, Inflight> inflight;
  // The inflight calls by deadline (their ids).
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;
  // Streamed execs in flight: stream id -> where their output goes.
  std::unordered_map<uint64_t, std::function<void(const v1::ExecOutput&)>> streams;
  uint64_t next_id = 0;
  // Annotations issued since the last flush: they go to dsecd together
  // when the agent's mailbox holds nothing older (a flush message to
  // itself), or at kMaxBatch.
  v1::AnnotateBatch batch;
  bool flush_posted = false;
  static constexpr const char* name = "dsec_sdk_agent";
};

using Self = caf::stateful_actor<AgentState>*;

// While calls wait (queued or in flight), a tick every 50 ms checks their
// deadlines: a call fails at most that much after its deadline.
void Tick(Self self) {
  auto& st = self->state;
  if (st.ticking || (st.queued.empty() && st.inflight.empty())) return;
  st.ticking = true;
  self->delayed_send(self, std::chrono::milliseconds(50), tick_atom::value);
}

// Why a TLS connection may fail after the door.
std::string TlsHint() {
  return " (over TLS: when dsecd has --tls-cert/--tls-key/--tls-ca, this client needs a certificate of the same CA: "
         "ClientOptions::tls_cert/tls_key/tls_ca or $DSEC_TLS_CERT/$DSEC_TLS_KEY/$DSEC_TLS_CA)";
}

std::string Where(Self self) { return self->state.host + ":" + std::to_string(self->state.port); }

// $DSEC_SDK_TRACE=1: the connection's steps on stderr, with their times
// (a connection that hangs says where).
void Trace(Self self, const char* what, const std::string& detail = "") {
  static const bool on = [] {
    const char* v = std::getenv("DSEC_SDK_TRACE");
    return v && *v && *v != '0';
  }();
  if (!on) return;
  auto ms = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count() / 1000.0;
  std::fprintf(stderr, "dsec sdk trace [pid %d] %.1f %s %s %s\n", static_cast<int>(::getpid()), ms,
               Where(self).c_str(), what, detail.c_str());
}


// Tells CAF the call's reply is not coming (an error in its place), so it
// drops the reply handler; a reply that does come later finds none and is
// dropped too. (The calls carry no CAF timeout, which would have done this.)
void DropReplyHandler(Self self, caf::message_id reply_id, caf::sec why) {
  if (!reply_id.is_response()) return;  // a batched annotation: no handler
  self->enqueue(caf::make_mailbox_element(nullptr, reply_id, {}, caf::make_error(why)), self->context());
}

void FlushBatch(Self self) {
  auto& st = self->state;
  if (st.batch.calls_size() == 0 || !st.entry) return;
  self->send(st.entry, std::move(st.batch));
  st.batch = v1::AnnotateBatch();
}

// Records call `id` as in flight, with its deadline from now.
Inflight* Track(Self self, uint64_t id, CallMsg call) {
  auto& st = self->state;
  Inflight* entry = &st.inflight[id];
  entry->deadline = Clock::now() + call.timeout;
  entry->call = std::move(call);
  st.deadlines.emplace(entry->deadline, id);
  return entry;
}

// Forgets call `id` (it ended) and hands it back.
Inflight Untrack(Self self, std::unordered_map<uint64_t, Inflight>::iterator it) {
  auto& st = self->state;
  Inflight call = std::move(it->second);
  st.deadlines.erase({call.deadline, it->first});
  st.inflight.erase(it);
  return call;
}

void Dispatch(Self self, CallMsg call) {
  auto& st = self->state;
  uint64_t id = ++st.next_id;
  if (call.annotate) {
    auto* c = st.batch.add_calls();
    c->set_call_id(id);
    *c->mutable_request() = std::move(*call.annotate);
    call.annotate.reset();
    Track(self, id, std::move(call));
    if (st.batch.calls_size() >= kMaxBatch) {
      FlushBatch(self);
    } else if (!st.flush_posted) {
      st.flush_posted = true;
      self->send(self, flush_atom::value);
    }
    Tick(self);
    return;
  }
  // Calls reach dsecd in the order they were issued: annotations waiting
  // for their batch go first.
  FlushBatch(self);
  // Only `fail` is needed once the call is in flight: `send` (which holds
  // the request) moves out instead of being copied.
  auto send = std::move(call.send);
  uint64_t stream = call.on_output ? call.stream_id : 0;
  if (stream) st.streams[stream] = call.on_output;
  Inflight* entry = Track(self, id, std::move(call));
  Trace(self, "call", std::to_string(id));
  auto claim = [self, id, stream] {
    auto& st = self->state;
    Trace(self, "reply", std::to_string(id));
    if (stream) st.streams.erase(stream);
    auto it = st.inflight.find(id);
    if (it == st.inflight.end()) return false;
    Untrack(self, it);
    return true;
  };
  // (The reply cannot come before this returns: `entry` stays valid.)
  entry->reply_id = send(self, st.entry, std::move(claim));
  Tick(self);
}

// Fails every call in flight with `err` (the connection dropped, or the
// client is closing).
void FailInflight(Self self, const caf::error& err, caf::sec why) {
  auto& st = self->state;
  auto inflight = std::move(st.inflight);
  st.inflight.clear();
  st.deadlines.clear();
  st.streams.clear();
  st.batch.Clear();
  for (auto& [id, call] : inflight) {
    DropReplyHandler(self, call.reply_id, why);
    call.call.fail(err);
  }
}

// Fails queued and in-flight calls whose deadline passed; keeps ticking
// while any call waits.
void Expire(Self self) {
  auto& st = self->state;
  auto now = Clock::now();
  for (auto it = st.queued.begin(); it != st.queued.end();) {
    if (it->deadline <= now) {
      auto fail = std::move(it->call.fail);
      it = st.queued.erase(it);
      fail(Disconnected("cannot reach dsecd at " + Where(self) + ": " + st.last_error +
                        " (is dsecd running there? start it with `dsecd`, or point --addr / $DSEC_ADDR at it)"));
    } else {
      ++it;
    }
  }
  while (!st.deadlines.empty() && st.deadlines.begin()->first <= now) {
    uint64_t id = st.deadlines.begin()->second;
    st.deadlines.erase(st.deadlines.begin());
    auto it = st.inflight.find(id);
    if (it == st.inflight.end()) continue;
    auto call = std::move(it->second);
    st.inflight.erase(it);
    if (call.call.stream_id) st.streams.erase(call.call.stream_id);
    DropReplyHandler(self, call.reply_id, caf::sec::request_timeout);
    call.call.fail(caf::make_error(caf::sec::request_timeout));
  }
  Tick(self);
}

// A connection's end: the entry's handle, or why not (then retried).
void Connected(Self self, caf::strong_actor_ptr ptr, const std::set<std::string>& ifs) {
  auto& st = self->state;
  st.connecting = false;
  if (!ptr) {
    st.last_error = "nothing is published there";
  } else if (!self->system().assignable<entry_actor>(ifs)) {
    st.last_error = "the actor published there is not a dsec entry (different dsec version?)";
  } else {
    st.entry = caf::actor_cast<caf::actor>(std::move(ptr));
    self->monitor(st.entry);
    // First on the connection: who this is (the owner of its sandboxes).
    v1::Hello hello;
    hello.set_client_id(st.client_id);
    hello.set_version(DSEC_VERSION);
    self->send(st.entry, std::move(hello));
    st.backoff = std::chrono::milliseconds(50);
    st.ever_connected = true;
    st.shared->connections++;
    st.shared->connected = true;
    auto queued = std::move(st.queued);
    st.queued.clear();
    for (auto& q : queued) Dispatch(self, std::move(q.call));
    return;
  }
  self->delayed_send(self, st.backoff, caf::connect_atom::value);
}

// A node's agent that cannot reach its node hands its waiting calls (never
// sent) to their reroute: the controller answers them.
void Reroute(Self self) {
  auto& st = self->state;
  if (!st.to_node) return;
  for (auto it = st.queued.begin(); it != st.queued.end();) {
    if (!it->call.reroute) {
      ++it;
      continue;
    }
    auto call = std::move(it->call);
    it = st.queued.erase(it);
    auto reroute = std::move(call.reroute);
    call.reroute = nullptr;
    reroute(std::move(call));
  }
}

void Retry(Self self, const std::string& why) {
  auto& st = self->state;
  st.connecting = false;
  st.last_error = why;
  Reroute(self);
  self->delayed_send(self, st.backoff, caf::connect_atom::value);
  st.backoff = std::min(st.backoff * 2, std::chrono::milliseconds(1000));
  Expire(self);
}

// Before the first connection, a refusal is the answer: nothing listens
// there, the token is wrong, it is not a dsec port. Calls waiting for it
// fail now instead of at their deadlines.
void GiveUp(Self self, Status why, bool refused) {
  auto& st = self->state;
  if (refused)
    why = Status::Unavailable("cannot reach dsecd at " + Where(self) +
                              ": connection refused (is dsecd running there? start it with `dsecd`, or point "
                              "--addr / $DSEC_ADDR at it)");
  st.connecting = false;
  st.last_error = why.message();
  Reroute(self);
  auto queued = std::move(st.queued);
  st.queued.clear();
  for (auto& q : queued) q.call.fail(ToCafError(why));
  // Later calls try again from scratch.
  st.backoff = std::chrono::milliseconds(50);
}

void Connect(Self self) {
  auto& st = self->state;
  if (st.connecting || st.entry) return;
  st.connecting = true;
  Trace(self, "dial");
  self->request(st.dialer, caf::infinite, dial_atom::value)
      .then(
          [self](Dialed& d) {
            auto& st = self->state;
            Trace(self, d.fd ? "through the door" : "dial failed", d.status.message());
            if (!d.fd) {
              bool final = d.refused || d.status.code() == Status::Code::kUnauthenticated ||
                           d.status.code() == Status::Code::kFailedPrecondition;
              if (final && !st.ever_connected) return GiveUp(self, d.status, d.refused);
              return Retry(self, d.status.message());
            }
            // Through the door: BASP takes the socket over as a client
            // connection and answers with the entry once its handshake is done.
            // dsecd --tls: a TLS session from here (its handshake first).
            bool tls = d.flags & door::kFlagTls;
            auto& mm = self->system().middleman();
            auto basp = mm.named_broker<caf::io::basp_broker>(caf::atom("BASP"));
            auto scribe = tls::NewScribe(self->system(), d.fd->Release(), tls, /*accepted=*/false);
            if (!scribe.ok()) return Retry(self, scribe.status().message());
            self->request(basp, st.connect_timeout, caf::connect_atom::value, std::move(*scribe), st.port)
                .then(
                    [self](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
                      Trace(self, "BASP connected");
                      Connected(self, std::move(ptr), ifs);
                    },
                    [self, tls](caf::error& err) {
                      Trace(self, "BASP failed", self->system().render(err));
                      Retry(self, self->system().render(err) + (tls ? TlsHint() : std::string()));
                    });
          },
          [self](caf::error& err) { Retry(self, self->system().render(err)); });
}

// The dialer: one blocking connect and door handshake at a time.
caf::behavior Dialer(caf::event_based_actor*, std::string host, uint16_t port, std::string token,
                     std::chrono::milliseconds timeout) {
  return {
      [=](dial_atom) {
        Dialed d;
        auto fd = door::Dial(host, port, token, door::kSdk, timeout, &d.refused, &d.flags);
        if (fd.ok()) d.fd = std::make_shared<UniqueFd>(std::move(*fd));
        else d.status = fd.status();
        return d;
      },
  };
}

caf::behavior Agent(Self self, std::string host, uint16_t port, std::string token, std::string client_id,
                    std::chrono::milliseconds connect_timeout, AgentShared* shared, bool to_node) {
  auto& st = self->state;
  st.to_node = to_node;
  st.host = std::move(host);
  st.port = port;
  st.token = std::move(token);
  st.client_id = std::move(client_id);
  st.connect_timeout = connect_timeout;
  st.shared = shared;
  st.dialer = self->spawn<caf::detached + caf::linked>(Dialer, st.host, st.port, st.token, connect_timeout);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.entry.address()) return;
    st.entry = nullptr;
    st.shared->connected = false;
    st.last_error = "connection lost (" + self->system().render(dm.reason) + ")";
    // Annotations still waiting for their batch were never sent: they wait
    // for the next connection like any call issued now.
    for (auto& c : *st.batch.mutable_calls()) {
      auto it = st.inflight.find(c.call_id());
      if (it == st.inflight.end()) continue;
      Inflight call = Untrack(self, it);
      call.call.annotate = std::make_shared<v1::AnnotateStepRequest>(std::move(*c.mutable_request()));
      st.queued.push_back(Queued{call.deadline, std::move(call.call)});
    }
    st.batch.Clear();
    // The replies of the calls sent will not come: fail them now.
    FailInflight(self,
                 Disconnected("the connection to dsecd at " + Where(self) +
                              " was lost while the request was in flight; it may or may not have "
                              "been carried out"),
                 caf::sec::request_receiver_down);
    Connect(self);
    Tick(self);
  });
  Connect(self);
  return {
      [self](CallMsg& call) {
        auto& st = self->state;
        if (st.entry) {
          Dispatch(self, std::move(call));
          return;
        }
        st.queued.push_back(Queued{Clock::now() + call.timeout, std::move(call)});
        Connect(self);
        Expire(self);
      },
      [self](caf::connect_atom) { Connect(self); },
      [self](v1::ExecOutput& piece) {
        auto& st = self->state;
        // Pieces for a call that already ended (timed out) are dropped.
        if (auto it = st.streams.find(piece.stream_id()); it != st.streams.end()) it->second(piece);
      },
      [self](caf::close_atom) {
        // The client is going away: nobody may be left waiting.
        auto& st = self->state;
        auto queued = std::move(st.queued);
        st.queued.clear();
        for (auto& q : queued) q.call.fail(Disconnected("the dsec client is shutting down"));
        FailInflight(self, Disconnected("the dsec client is shutting down"), caf::sec::request_receiver_down);
        self->quit();
      },
      [self](flush_atom) {
        self->state.flush_posted = false;
        FlushBatch(self);
      },
      [self](v1::AnnotateResults& results) {
        auto& st = self->state;
        for (auto& r : *results.mutable_results()) {
          // A call that already ended (deadline, disconnect) is not there.
          auto it = st.inflight.find(r.call_id());
          if (it == st.inflight.end() || !it->second.call.annotated) continue;
          Untrack(self, it).call.annotated(*r.mutable_reply());
        }
      },
      [self](tick_atom) {
        self->state.ticking = false;
        Expire(self);
      },
  };
}

}  // namespace

Result<caf::actor> ConnectEntry(caf::actor_system& sys, const std::string& host, uint16_t port,
                                const std::string& token, std::chrono::milliseconds timeout, uint8_t service) {
  uint8_t flags = 0;
  auto fd = door::Dial(host, port, token, static_cast<door::Service>(service), timeout, nullptr, &flags);
  if (!fd.ok()) return fd.status();
  auto& mm = sys.middleman();
  auto basp = mm.named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  auto scribe = tls::NewScribe(sys, fd->Release(), flags & door::kFlagTls, /*accepted=*/false);
  if (!scribe.ok()) return scribe.status();
  caf::scoped_actor self{sys};
  Result<caf::actor> out = Status::DeadlineExceeded("no BASP handshake from " + host + ":" + std::to_string(port));
  self->request(basp, timeout, caf::connect_atom::value, std::move(*scribe), port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
            if (!ptr || !sys.assignable<entry_actor>(ifs))
              out = Status::FailedPrecondition("no dsec entry at " + host + ":" + std::to_string(port));
            else
              out = caf::actor_cast<caf::actor>(std::move(ptr));
          },
          [&](caf::error& e) { out = Status::Unavailable(host + ":" + std::to_string(port) + ": " + sys.render(e)); });
  return out;
}

caf::error ToCafError(const Status& st) {
  return caf::error(static_cast<uint8_t>(st.code()), caf::atom("dsec"), caf::make_message(st.message()));
}

bool FromCafError(const caf::error& e, Status* out) {
  if (e.category() != caf::atom("dsec") || !e.context().match_elements<std::string>()) return false;
  *out = Status(static_cast<Status::Code>(e.code()), e.context().get_as<std::string>(0));
  return true;
}

caf::error Disconnected(const std::string& why) { return ToCafError(Status::Unavailable(why)); }

caf::actor SpawnAgent(caf::actor_system& sys, std::string host, uint16_t port, std::string token,
                      std::string client_id, std::chrono::milliseconds connect_timeout, AgentShared* shared,
                      bool to_node) {
  return sys.spawn(Agent, std::move(host), port, std::move(token), std::move(client_id), connect_timeout, shared,
                   to_node);
}

}  // namespace dsec::sdk
