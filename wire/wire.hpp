// CAF glue shared by dsecd and the SDK: protobuf messages as CAF message
// types (bytes on the wire only; passed by reference locally), the entry
// actor's interface (the table of calls, wire/calls.hpp), and
// RegisterTypes, which every binary calls with the same names (an
// unregistered type fails silently over the network).
#pragma once

#include <caf/all.hpp>
#include <google/protobuf/message_lite.h>

#include <string>
#include <type_traits>

#include "dsec/cluster/v1/cluster.pb.h"
#include "wire/calls.hpp"
#include "dsec/v1/service.pb.h"
#include "dsec/v1/types.pb.h"

namespace dsec::wire {

template <class T>
constexpr bool kIsProtobuf = std::is_base_of<google::protobuf::MessageLite, T>::value;

// Saving side (serializer, to_string): the message's bytes.
template <class Inspector, class T>
std::enable_if_t<kIsProtobuf<T> && Inspector::reads_state, typename Inspector::result_type>
InspectProtobuf(Inspector& f, T& x) {
  std::string buf = x.SerializeAsString();
  return f(caf::meta::type_name("protobuf"), buf);
}

// Loading side: read the bytes, parse them once they are all there.
template <class Inspector, class T>
std::enable_if_t<kIsProtobuf<T> && Inspector::writes_state, typename Inspector::result_type>
InspectProtobuf(Inspector& f, T& x) {
  std::string buf;
  auto load = caf::meta::load_callback([&]() -> caf::error {
    if (!x.ParseFromString(buf))
      return caf::make_error(caf::sec::invalid_argument, "malformed protobuf message");
    return caf::none;
  });
  return f(caf::meta::type_name("protobuf"), buf, load);
}

}  // namespace dsec::wire

namespace dsec::v1 {
// Found by ADL for every generated message of the dsec.v1 package.
template <class Inspector, class T>
auto inspect(Inspector& f, T& x) -> decltype(::dsec::wire::InspectProtobuf(f, x)) {
  return ::dsec::wire::InspectProtobuf(f, x);
}
}  // namespace dsec::v1

namespace dsec::cluster::v1 {
// The same for the cluster protocol's messages.
template <class Inspector, class T>
auto inspect(Inspector& f, T& x) -> decltype(::dsec::wire::InspectProtobuf(f, x)) {
  return ::dsec::wire::InspectProtobuf(f, x);
}
}  // namespace dsec::cluster::v1

namespace dsec {

// The SDK entry point: every call of the table (wire/calls.hpp), which a
// node and a controller both answer. Every reply carries a dsec.v1.Status;
// a streamed ExecRequest and a WatchRequest also send v1::ExecOutput
// messages to their sender,
// and an AnnotateBatch is answered with v1::AnnotateResults messages.
using entry_actor = calls::ActorOf<calls::All>::type;

// Registers every type that crosses the wire. Call on the config of every
// dsec process before constructing the actor_system.
void RegisterTypes(caf::actor_system_config& cfg);

// Settings every dsec process shares: the middleman, heartbeats so a dead
// peer is noticed, and the scheduler.
struct CafOptions {
  size_t scheduler_threads = 2;
  int heartbeat_ms = 1000;
  int connection_timeout_ms = 5000;
};
void ConfigureCaf(caf::actor_system_config& cfg, const CafOptions& options);

}  // namespace dsec
