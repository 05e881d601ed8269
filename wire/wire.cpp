#include "wire/wire.hpp"

#include <caf/io/all.hpp>

namespace dsec {

void RegisterTypes(caf::actor_system_config& cfg) {
  cfg.add_message_type<v1::RunRequest>("dsec.v1.RunRequest")
      .add_message_type<v1::RunReply>("dsec.v1.RunReply")
      .add_message_type<v1::CreateRequest>("dsec.v1.CreateRequest")
      .add_message_type<v1::SandboxReply>("dsec.v1.SandboxReply")
      .add_message_type<v1::ExecRequest>("dsec.v1.ExecRequest")
      .add_message_type<v1::ExecReply>("dsec.v1.ExecReply")
      .add_message_type<v1::DestroyRequest>("dsec.v1.DestroyRequest")
      .add_message_type<v1::GetSandboxRequest>("dsec.v1.GetSandboxRequest")
      .add_message_type<v1::PauseRequest>("dsec.v1.PauseRequest")
      .add_message_type<v1::ResumeRequest>("dsec.v1.ResumeRequest")
      .add_message_type<v1::ReadFileRequest>("dsec.v1.ReadFileRequest")
      .add_message_type<v1::WriteFileRequest>("dsec.v1.WriteFileRequest")
      .add_message_type<v1::ListFilesRequest>("dsec.v1.ListFilesRequest")
      .add_message_type<v1::FileReply>("dsec.v1.FileReply")
      .add_message_type<v1::ExecOutput>("dsec.v1.ExecOutput")
      .add_message_type<v1::OpenSessionRequest>("dsec.v1.OpenSessionRequest")
      .add_message_type<v1::SessionReply>("dsec.v1.SessionReply")
      .add_message_type<v1::StepRequest>("dsec.v1.StepRequest")
      .add_message_type<v1::StepReply>("dsec.v1.StepReply")
      .add_message_type<v1::CloseSessionRequest>("dsec.v1.CloseSessionRequest")
      .add_message_type<v1::GetSessionRequest>("dsec.v1.GetSessionRequest")
      .add_message_type<v1::AnnotateStepRequest>("dsec.v1.AnnotateStepRequest")
      .add_message_type<v1::AnnotateBatch>("dsec.v1.AnnotateBatch")
      .add_message_type<v1::AnnotateResults>("dsec.v1.AnnotateResults")
      .add_message_type<v1::Hello>("dsec.v1.Hello")
      .add_message_type<v1::ListStepsRequest>("dsec.v1.ListStepsRequest")
      .add_message_type<v1::StepsReply>("dsec.v1.StepsReply")
      .add_message_type<v1::RegisterImageRequest>("dsec.v1.RegisterImageRequest")
      .add_message_type<v1::GetImageRequest>("dsec.v1.GetImageRequest")
      .add_message_type<v1::ListImagesRequest>("dsec.v1.ListImagesRequest")
      .add_message_type<v1::RemoveImageRequest>("dsec.v1.RemoveImageRequest")
      .add_message_type<v1::ImageReply>("dsec.v1.ImageReply")
      .add_message_type<v1::ImagesReply>("dsec.v1.ImagesReply")
      .add_message_type<v1::NodeJoin>("dsec.v1.NodeJoin")
      .add_message_type<v1::NodeLoad>("dsec.v1.NodeLoad")
      .add_message_type<v1::JoinReply>("dsec.v1.JoinReply")
      .add_message_type<v1::ImageManifest>("dsec.v1.ImageManifest")
      .add_message_type<entry_actor>("dsec::entry_actor");
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
