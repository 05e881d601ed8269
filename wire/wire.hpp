// CAF glue shared by dsecd and the SDK: protobuf messages as CAF message
// types (bytes on the wire only; passed by reference locally), the entry
// actor's interface, and RegisterTypes, which every binary calls with the
// same names (an unregistered type fails silently over the network).
#pragma once

#include <caf/all.hpp>
#include <google/protobuf/message_lite.h>

#include <string>
#include <type_traits>

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

namespace dsec {

// The SDK entry point: what a trainer can ask a node (role all) for. Each
// request type names its operation; every reply carries a dsec.v1.Status.
//   RunRequest          one-shot fncall run                   -> RunReply
//   CreateRequest       create a sandbox                      -> SandboxReply
//   ExecRequest         exec in sandbox exec.sandbox_id       -> ExecReply
//   DestroyRequest      destroy a sandbox                     -> SandboxReply
//   GetSandboxRequest   a sandbox's record                    -> SandboxReply
//   PauseRequest / ResumeRequest  freeze / thaw a sandbox     -> SandboxReply
//   ReadFileRequest / WriteFileRequest / ListFilesRequest     -> FileReply
//   (a streamed ExecRequest also sends v1::ExecOutput messages to its sender)
//   OpenSessionRequest  open (or re-open) a rollout session   -> SessionReply
//   StepRequest         run / fast-forward one step           -> StepReply
//   CloseSessionRequest close a session                       -> SessionReply
//   GetSessionRequest   a session's record                    -> SessionReply
//   AnnotateStepRequest attach reward/tokens/notes to a step  -> StepReply
//   AnnotateBatch       many annotations, one-way  -> AnnotateResults messages to its sender
//   Hello               one-way, first on every SDK connection: the client's id (owner of its sandboxes)
//   ListStepsRequest    a session's record and logged steps   -> StepsReply
//   RegisterImageRequest  register a built EROFS image        -> ImageReply
//   GetImageRequest / ListImagesRequest / RemoveImageRequest  -> ImageReply / ImagesReply / ImageReply
using entry_actor = caf::typed_actor<
    caf::replies_to<v1::RunRequest>::with<v1::RunReply>,
    caf::replies_to<v1::CreateRequest>::with<v1::SandboxReply>,
    caf::replies_to<v1::ExecRequest>::with<v1::ExecReply>,
    caf::replies_to<v1::DestroyRequest>::with<v1::SandboxReply>,
    caf::replies_to<v1::GetSandboxRequest>::with<v1::SandboxReply>,
    caf::replies_to<v1::PauseRequest>::with<v1::SandboxReply>,
    caf::replies_to<v1::ResumeRequest>::with<v1::SandboxReply>,
    caf::replies_to<v1::ReadFileRequest>::with<v1::FileReply>,
    caf::replies_to<v1::WriteFileRequest>::with<v1::FileReply>,
    caf::replies_to<v1::ListFilesRequest>::with<v1::FileReply>,
    caf::replies_to<v1::OpenSessionRequest>::with<v1::SessionReply>,
    caf::replies_to<v1::StepRequest>::with<v1::StepReply>,
    caf::replies_to<v1::CloseSessionRequest>::with<v1::SessionReply>,
    caf::replies_to<v1::GetSessionRequest>::with<v1::SessionReply>,
    caf::replies_to<v1::AnnotateStepRequest>::with<v1::StepReply>,
    caf::reacts_to<v1::AnnotateBatch>,  // answered with AnnotateResults messages
    caf::reacts_to<v1::Hello>,          // one-way: the SDK client on this connection
    caf::replies_to<v1::ListStepsRequest>::with<v1::StepsReply>,
    caf::replies_to<v1::RegisterImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::GetImageRequest>::with<v1::ImageReply>,
    caf::replies_to<v1::ListImagesRequest>::with<v1::ImagesReply>,
    caf::replies_to<v1::RemoveImageRequest>::with<v1::ImageReply>>;

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
