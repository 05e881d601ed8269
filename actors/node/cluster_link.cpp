// A node's link to its controller (actors/cluster.hpp): dial through the
// cluster door, hand the socket to BASP, join, heartbeat, rejoin.
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/network/multiplexer.hpp>
#include <spdlog/logger.h>

#include <limits>

#include "actors/node/cluster_link.hpp"
#include "actors/node/context.hpp"
#include "drivers/images/lazy_images.hpp"
#include "dsec/status_proto.hpp"
#include "runtime/door_auth.hpp"
#include "runtime/metrics.hpp"
#include "state/table.hpp"
#include "wire/tls.hpp"

namespace dsec::link_detail {

// A socket through the cluster door, from the dialer to the link: closed
// if the message is dropped.
struct Dialed {
  std::shared_ptr<UniqueFd> fd;
  Status status;
  uint8_t flags = 0;  // the door's (kFlagTls)
};

}  // namespace dsec::link_detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsec::link_detail::Dialed)

namespace dsec {

namespace {

using link_detail::Dialed;
using dial_atom = caf::atom_constant<caf::atom("cdial")>;
using pulse_atom = caf::atom_constant<caf::atom("pulse")>;

struct LinkState {
  node_actor node;
  std::shared_ptr<NodeContext> ctx;
  LinkOptions o;
  caf::actor dialer;
  caf::actor controller;  // the controller's actor (a proxy) once connected
  bool connecting = false, joined = false;
  uint64_t generation = 0;  // of the heartbeat loop: one per join
  std::chrono::milliseconds backoff{100};
  int heartbeat_ms = 1000;
  std::string last_error;  // logged once per change
  static constexpr const char* name = "cluster_link";
};

using Self = caf::stateful_actor<LinkState>*;

std::string Where(Self self) {
  if (self->state.o.in_process) return "in this process";
  return "at " + self->state.o.host + ":" + std::to_string(self->state.o.port);
}

void Connect(Self self);

void Retry(Self self, const std::string& why) {
  auto& st = self->state;
  st.connecting = false;
  if (why != st.last_error)
    st.ctx->log->warn("cluster: cannot join the controller {}: {} (retrying)", Where(self), why);
  st.last_error = why;
  self->delayed_send(self, st.backoff, caf::connect_atom::value);
  st.backoff = std::min(st.backoff * 2, std::chrono::milliseconds(2000));
}

// What this node is and has: the parts its actor does not know.
void Fill(Self self, cluster::v1::NodeRecord* rec, cluster::v1::NodeLoad* load) {
  auto& st = self->state;
  const auto& o = st.ctx->options;
  if (rec) {
    rec->set_id(o.node_id);
    // In process (role all) it joins before dsecd's ports open, and its
    // trainers reach it through the controller's: no addresses of its own
    // (nor a read of them while the main thread sets them).
    if (!st.o.in_process) {
      rec->set_sdk_address(o.sdk_address);
      rec->set_admin_address(o.admin_address);
      rec->set_http_address(o.http_address);
    }
    rec->set_boot_count(o.boot);
    rec->set_version(DSEC_VERSION);
  }
  std::vector<std::string> kinds, unavailable;
  st.ctx->kinds->Kinds(&kinds, &unavailable);
  for (const auto& k : kinds) {
    if (rec) rec->add_kinds(k);
    load->add_kinds(k);
  }
  for (const auto& u : unavailable) {
    if (rec) rec->add_unavailable(u);
    load->add_unavailable(u);
  }
  auto h = metrics::ReadHostFigures();
  load->set_cpus(h.cpus);
  load->set_memory_bytes(h.memory_total);
  load->set_memory_available_bytes(h.memory_available);
  load->set_load1(h.load1);
  if (st.o.slots) load->set_slots(st.o.slots);
  else if (st.o.in_process) load->set_slots(std::numeric_limits<uint32_t>::max());
  else load->set_slots(std::max<uint64_t>(1, h.memory_total / (64ull << 20)));
  Status scanned = state::TypedTable<v1::ImageManifest>(st.ctx->store, state::Table::kImages)
                      .Scan("", [&](const std::string&, v1::ImageManifest&& m) {
                        load->add_images(m.name() + "@" + m.digest());
                        return load->images_size() < 10000;
                      });
  if (st.ctx->lazy)
    for (const auto& [digest, bytes] : st.ctx->lazy->CachedByImage()) (*load->mutable_image_cached())[digest] = bytes;
  // The heartbeat goes on without them: placement then prefers other
  // nodes, or sends the image again; the log says why.
  if (!scanned.ok()) st.ctx->log->warn("cluster: this heartbeat lists no images: {}", scanned.message());
}

void Joined(Self self, cluster::v1::JoinReply& r) {
  auto& st = self->state;
  if (r.status().code() != v1::Status::OK) {
    st.ctx->log->error("cluster: the controller {} refused this node: {}", Where(self), r.status().message());
    // Dropping the connection is the controller's; try again later.
    self->delayed_send(self, std::chrono::seconds(2), caf::connect_atom::value);
    st.connecting = false;
    return;
  }
  st.connecting = false;
  st.joined = true;
  st.backoff = std::chrono::milliseconds(100);
  st.last_error.clear();
  st.heartbeat_ms = r.heartbeat_ms() ? static_cast<int>(r.heartbeat_ms()) : 1000;
  if (st.o.on_token && !r.sdk_token().empty()) st.o.on_token(r.sdk_token());
  if (st.o.on_joined) st.o.on_joined();
  st.ctx->log->info("cluster: joined controller {} {}{}", r.controller_id(), Where(self),
                    r.draining() ? " (this node is draining: no new placements)" : "");
  self->send(self, pulse_atom::value, ++st.generation);
}

void Join(Self self) {
  auto& st = self->state;
  self->request(st.node, std::chrono::seconds(30), cluster_info_atom::value)
      .then(
          [self](cluster::v1::NodeJoin& j) {
            auto& st = self->state;
            if (!st.controller) return;
            Fill(self, j.mutable_node(), j.mutable_load());
            self->request(st.controller, std::chrono::seconds(30), join_atom::value, std::move(j),
                          caf::actor_cast<caf::actor>(st.node))
                .then([self](cluster::v1::JoinReply& r) { Joined(self, r); },
                      [self](caf::error& e) { Retry(self, "join: " + caf::to_string(e)); });
          },
          [self](caf::error& e) { Retry(self, "the node did not say what it holds: " + caf::to_string(e)); });
}

// The controller's actor in hand: watched, and joined.
void Connected(Self self, caf::actor controller) {
  auto& st = self->state;
  st.controller = std::move(controller);
  st.ctx->controller_node->Set(caf::to_string(st.controller.node()));
  if (st.o.on_controller) st.o.on_controller(st.controller);
  self->monitor(st.controller);
  Join(self);
}

void Connect(Self self) {
  auto& st = self->state;
  if (st.connecting || st.controller) return;
  st.connecting = true;
  if (st.o.in_process) return Connected(self, st.o.in_process);
  self->request(st.dialer, caf::infinite, dial_atom::value)
      .then(
          [self](Dialed& d) {
            auto& st = self->state;
            if (!d.fd) return Retry(self, d.status.message());
            // Both ends TLS or neither: a node started with --tls does not
            // send its join in the clear, and one without cannot speak it.
            bool tls = d.flags & door::kFlagTls;
            if (tls != st.o.tls)
              return Retry(self, tls ? "the controller speaks TLS (dsecd --tls): start this node with --tls too "
                                       "(and --tls-cert/--tls-key/--tls-ca when the controller has them)"
                                     : "this node was started with --tls and the controller was not: start the "
                                       "controller with --tls, or this node without it");
            auto& mm = self->system().middleman();
            auto basp = mm.named_broker<caf::io::basp_broker>(caf::atom("BASP"));
            auto scribe = tls::NewScribe(self->system(), d.fd->Release(), tls, /*accepted=*/false);
            if (!scribe.ok()) return Retry(self, scribe.status().message());
            self->request(basp, std::chrono::seconds(10), caf::connect_atom::value, std::move(*scribe), st.o.port)
                .then(
                    [self](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
                      if (!ptr) return Retry(self, "nothing is published on the cluster port");
                      Connected(self, caf::actor_cast<caf::actor>(std::move(ptr)));
                    },
                    [self, tls](caf::error& e) {
                      Retry(self, "BASP: " + caf::to_string(e) +
                                      (tls ? " (over TLS: do this node's --tls-cert/--tls-key/--tls-ca match the "
                                             "controller's? with certificates on one end, both need them)"
                                           : ""));
                    });
          },
          [self](caf::error& e) { Retry(self, caf::to_string(e)); });
}

caf::behavior Dialer(caf::event_based_actor*, std::string host, uint16_t port, std::string secret) {
  return {
      [=](dial_atom) {
        Dialed d;
        auto fd = door::Dial(host, port, secret, door::kCluster, std::chrono::seconds(5), nullptr, &d.flags);
        if (fd.ok()) d.fd = std::make_shared<UniqueFd>(std::move(*fd));
        else d.status = fd.status();
        return d;
      },
  };
}

caf::behavior Link(Self self, node_actor node, std::shared_ptr<NodeContext> ctx, LinkOptions o) {
  auto& st = self->state;
  st.node = std::move(node);
  st.ctx = std::move(ctx);
  st.o = std::move(o);
  if (!st.o.in_process)
    st.dialer = self->spawn<caf::detached + caf::linked>(Dialer, st.o.host, st.o.port, st.o.secret);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.controller.address()) return;
    st.controller = nullptr;
    if (st.o.on_controller) st.o.on_controller(caf::actor{});
    st.joined = false;
    st.connecting = false;
    if (st.o.in_process) {  // it went with this process's actor system
      st.ctx->log->warn("cluster: the in-process controller stopped ({})", caf::to_string(dm.reason));
      return self->quit(dm.reason);
    }
    st.ctx->log->warn("cluster: lost the controller {} ({}); rejoining", Where(self), caf::to_string(dm.reason));
    st.last_error = "lost";
    Connect(self);
  });
  Connect(self);
  return {
      [self](caf::connect_atom) {
        auto& st = self->state;
        if (!st.controller) return Connect(self);
        if (st.joined || st.connecting) return;
        st.connecting = true;  // connected, the join failed: again
        Join(self);
      },
      [self](rejoin_atom) {
        auto& st = self->state;
        if (!st.controller || !st.joined) return;  // joining already
        st.joined = false;
        st.connecting = true;
        st.ctx->log->warn("cluster: the controller {} had marked this node down; joining again", Where(self));
        Join(self);
      },
      [self](pulse_atom, uint64_t generation) {
        auto& st = self->state;
        if (!st.joined || generation != st.generation) return;  // an older loop
        self->request(st.node, std::chrono::seconds(10), cluster_load_atom::value)
            .then(
                [self](cluster::v1::NodeLoad& load) {
                  auto& st = self->state;
                  if (!st.joined) return;
                  Fill(self, nullptr, &load);
                  self->send(st.controller, beat_atom::value, st.ctx->options.node_id, std::move(load));
                },
                [self](caf::error& e) {
                  self->state.ctx->log->warn("cluster: the node did not give its load: {}", caf::to_string(e));
                });
        self->delayed_send(self, std::chrono::milliseconds(st.heartbeat_ms), pulse_atom::value, generation);
      },
  };
}

}  // namespace

caf::actor SpawnClusterLink(caf::actor_system& sys, node_actor node, std::shared_ptr<NodeContext> ctx,
                            LinkOptions options) {
  return sys.spawn(Link, std::move(node), std::move(ctx), std::move(options));
}

}  // namespace dsec
