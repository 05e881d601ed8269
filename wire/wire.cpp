#include "wire/wire.hpp"

#include <caf/io/all.hpp>

namespace dsec {

namespace {

// A protobuf message, under its full name in the schema ("dsec.v1.ExecRequest").
template <class Msg>
void Register(caf::actor_system_config& cfg) {
  cfg.add_message_type<Msg>(Msg::descriptor()->full_name());
}

// Every call's request and reply (a reply shared by several calls is
// registered once: CAF keeps the first).
template <class... Cs>
void RegisterCalls(caf::actor_system_config& cfg, caf::detail::type_list<Cs...>) {
  (Register<typename Cs::Request>(cfg), ...);
  auto reply = [&cfg](auto call) {
    using Reply = typename decltype(call)::Reply;
    if constexpr (!std::is_void<Reply>::value) Register<Reply>(cfg);
  };
  (reply(Cs{}), ...);
}

}  // namespace

void RegisterTypes(caf::actor_system_config& cfg) {
  RegisterCalls(cfg, calls::All{});
  // What calls send besides their replies.
  Register<v1::ExecOutput>(cfg);
  Register<v1::AnnotateResults>(cfg);
  Register<v1::ImageManifest>(cfg);
  // The cluster protocol (actors/cluster.hpp).
  Register<cluster::v1::NodeJoin>(cfg);
  Register<cluster::v1::NodeLoad>(cfg);
  Register<cluster::v1::JoinReply>(cfg);
  Register<cluster::v1::ChunkMap>(cfg);
  cfg.add_message_type<entry_actor>("dsec::entry_actor");
}

void ConfigureCaf(caf::actor_system_config& cfg, const CafOptions& o) {
  cfg.load<caf::io::middleman>();
  RegisterTypes(cfg);
  cfg.set("scheduler.max-threads", o.scheduler_threads);
  // Request/response dominated: the sharing policy answers a blocked waiter
  // in ~10 us where work stealing's back-off takes ~100 us (caf-0.17-guide).
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(o.heartbeat_ms)});
  cfg.set("middleman.connection-timeout",
          caf::timespan{std::chrono::milliseconds(o.connection_timeout_ms)});
  cfg.set("middleman.app-identifiers", std::vector<std::string>{"dsec-v1"});
  cfg.set("logger.verbosity", caf::atom("quiet"));
}

}  // namespace dsec
