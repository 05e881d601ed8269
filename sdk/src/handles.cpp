// The handles a Client gives out: Sandbox and Session, each call a request
// of the table (wire/calls.hpp) through the client's agent, to the node
// that holds it when a controller named one.
#include <algorithm>
#include <chrono>

#include "sdk/src/client_impl.hpp"

namespace dsec {

void Sandbox::ExecAsync(v1::ExecRequest req, Done<v1::ExecResult> done) const {
  req.set_sandbox_id(id_);
  auto timeout = client_->impl_->ExecTimeout(spec_, req);
  client_->impl_->CallVia<v1::ExecReply>(
      route_, std::move(req), timeout,
      Then<v1::ExecReply>(std::move(done), [](v1::ExecReply& r) { return std::move(*r.mutable_result()); }));
}

std::future<Result<v1::ExecResult>> Sandbox::ExecAsync(v1::ExecRequest req) const {
  auto p = std::make_shared<std::promise<Result<v1::ExecResult>>>();
  auto f = p->get_future();
  ExecAsync(std::move(req), [p](Result<v1::ExecResult> r) { p->set_value(std::move(r)); });
  return f;
}

Result<v1::ExecResult> Sandbox::Exec(v1::ExecRequest req) const {
  return Wait<v1::ExecResult>([&](Done<v1::ExecResult> d) { ExecAsync(std::move(req), std::move(d)); });
}

void Sandbox::ExecStreamAsync(v1::ExecRequest req, OnOutput on_output, Done<v1::ExecResult> done) const {
  req.set_sandbox_id(id_);
  req.set_stream(true);
  req.set_stream_id(client_->impl_->next_stream++);
  auto timeout = client_->impl_->ExecTimeout(spec_, req);
  client_->impl_->CallVia<v1::ExecReply>(
      route_, std::move(req), timeout,
      Then<v1::ExecReply>(std::move(done), [](v1::ExecReply& r) { return std::move(*r.mutable_result()); }),
      std::move(on_output));
}

Result<v1::ExecResult> Sandbox::ExecStream(v1::ExecRequest req, OnOutput on_output) const {
  return Wait<v1::ExecResult>(
      [&](Done<v1::ExecResult> d) { ExecStreamAsync(std::move(req), std::move(on_output), std::move(d)); });
}

template <class Reply, class Request>
void Sandbox::Call(Request req, Done<Reply> done, OnOutput on_output) const {
  req.set_sandbox_id(id_);
  auto timeout = client_->impl_->options.rpc_timeout;
  if constexpr (std::is_same<Request, v1::WatchRequest>::value) {  // it lasts until stopped, or its timeout
    if (!req.stop()) {
      req.set_stream_id(client_->impl_->next_stream++);
      timeout = req.timeout_ms() ? timeout + std::chrono::milliseconds(req.timeout_ms()) : std::chrono::hours(24 * 365);
    }
  }
  // A pause with memory writes a VM's memory out, a resume reads it back (a
  // restore, as a fork's): as long as snapshot and fork may take.
  if constexpr (std::is_same<Request, v1::PauseRequest>::value || std::is_same<Request, v1::ResumeRequest>::value)
    timeout = std::max<std::chrono::milliseconds>(timeout, std::chrono::minutes(5));
  client_->impl_->CallVia<Reply>(route_, std::move(req), timeout, std::move(done), std::move(on_output));
}
// ExtraCalls' (dsec/files.hpp, dsec/processes.hpp).
template void Sandbox::Call<v1::FileReply, v1::PathOpRequest>(v1::PathOpRequest, Done<v1::FileReply>, OnOutput) const;
template void Sandbox::Call<v1::ProcessReply, v1::ProcessRequest>(v1::ProcessRequest, Done<v1::ProcessReply>,
                                                                  OnOutput) const;
template void Sandbox::Call<v1::WatchReply, v1::WatchRequest>(v1::WatchRequest, Done<v1::WatchReply>, OnOutput) const;
template void Sandbox::Call<v1::UsageReply, v1::UsageRequest>(v1::UsageRequest, Done<v1::UsageReply>, OnOutput) const;

namespace {
// The reply's record. A node answers without its own address: the route it
// was asked through.
Done<v1::SandboxReply> RecordOf(std::string route, Done<v1::SandboxRecord> done) {
  return Then<v1::SandboxReply>(std::move(done), [route = std::move(route)](v1::SandboxReply& r) {
    if (r.sandbox().node_address().empty()) r.mutable_sandbox()->set_node_address(route);
    return std::move(*r.mutable_sandbox());
  });
}
}  // namespace

void Sandbox::GetAsync(Done<v1::SandboxRecord> done) const {
  Call<v1::SandboxReply>(v1::GetSandboxRequest(), RecordOf(route_, std::move(done)));
}
void Sandbox::DestroyAsync(DoneStatus done) const {
  Call<v1::SandboxReply>(v1::DestroyRequest(), StatusOnly<v1::SandboxReply>(std::move(done)));
}
void Sandbox::PauseAsync(DoneStatus done, bool memory) const {
  v1::PauseRequest req;
  req.set_memory(memory);
  Call<v1::SandboxReply>(std::move(req), StatusOnly<v1::SandboxReply>(std::move(done)));
}
void Sandbox::ResumeAsync(DoneStatus done) const {
  Call<v1::SandboxReply>(v1::ResumeRequest(), StatusOnly<v1::SandboxReply>(std::move(done)));
}
void Sandbox::SetTimeoutAsync(uint32_t seconds, Done<v1::SandboxRecord> done) const {
  v1::SetTimeoutRequest req;
  req.set_timeout_s(seconds);
  Call<v1::SandboxReply>(std::move(req), RecordOf(route_, std::move(done)));
}
void Sandbox::SetNetworkAsync(const v1::NetworkPolicy& policy, v1::NetworkChange change,
                              Done<v1::SandboxRecord> done) const {
  v1::SetNetworkRequest req;
  *req.mutable_policy() = policy;
  req.set_change(change);
  Call<v1::SandboxReply>(std::move(req), RecordOf(route_, std::move(done)));
}


void Sandbox::ReadFileAsync(const std::string& path, uint64_t max_bytes, Done<std::string> done) const {
  v1::ReadFileRequest req;
  req.set_path(path);
  req.set_max_bytes(max_bytes);
  Call<v1::FileReply>(std::move(req), Then<v1::FileReply>(std::move(done), [](v1::FileReply& r) {
                        return std::move(*r.mutable_content());
                      }));
}

void Sandbox::WriteFileAsync(const std::string& path, const std::string& content, uint32_t mode, bool make_parents,
                             DoneStatus done) const {
  v1::WriteFileRequest req;
  req.set_path(path);
  req.set_content(content);
  req.set_mode(mode);
  req.set_make_parents(make_parents);
  Call<v1::FileReply>(std::move(req), StatusOnly<v1::FileReply>(std::move(done)));
}

void Sandbox::ListFilesAsync(const std::string& path, Done<v1::FileReply> done) const {
  v1::ListFilesRequest req;
  req.set_path(path);
  Call<v1::FileReply>(std::move(req), std::move(done));
}

Result<v1::SandboxRecord> Sandbox::Get() const {
  return Wait<v1::SandboxRecord>([&](Done<v1::SandboxRecord> d) { GetAsync(std::move(d)); });
}
Status Sandbox::Destroy() const {
  return WaitStatus([&](DoneStatus d) { DestroyAsync(std::move(d)); });
}
Status Sandbox::Pause(bool memory) const {
  return WaitStatus([&](DoneStatus d) { PauseAsync(std::move(d), memory); });
}
Status Sandbox::Resume() const {
  return WaitStatus([&](DoneStatus d) { ResumeAsync(std::move(d)); });
}
Result<v1::SandboxRecord> Sandbox::SetTimeout(uint32_t seconds) const {
  return Wait<v1::SandboxRecord>([&](Done<v1::SandboxRecord> d) { SetTimeoutAsync(seconds, std::move(d)); });
}
Result<v1::SandboxRecord> Sandbox::SetNetwork(const v1::NetworkPolicy& policy, v1::NetworkChange change) const {
  return Wait<v1::SandboxRecord>([&](Done<v1::SandboxRecord> d) { SetNetworkAsync(policy, change, std::move(d)); });
}
Result<std::string> Sandbox::ReadFile(const std::string& path, uint64_t max_bytes) const {
  return Wait<std::string>([&](Done<std::string> d) { ReadFileAsync(path, max_bytes, std::move(d)); });
}
Status Sandbox::WriteFile(const std::string& path, const std::string& content, uint32_t mode,
                          bool make_parents) const {
  return WaitStatus([&](DoneStatus d) { WriteFileAsync(path, content, mode, make_parents, std::move(d)); });
}
Result<v1::FileReply> Sandbox::ListFiles(const std::string& path) const {
  return Wait<v1::FileReply>([&](Done<v1::FileReply> d) { ListFilesAsync(path, std::move(d)); });
}

void Session::StepAsync(uint64_t index, v1::ExecRequest req, const StepOptions& options,
                        std::function<void(Result<v1::StepReply>)> done) const {
  v1::StepRequest step;
  step.set_session(name_);
  step.set_index(index);
  step.set_sandbox(options.sandbox);
  *step.mutable_meta() = options.meta;
  step.set_not_replayable(options.not_replayable);
  const std::string& role = options.sandbox.empty() ? std::string("agent") : options.sandbox;
  v1::SandboxSpec spec = rec_->spec();
  for (const auto& sb : rec_->sandboxes())
    if (sb.role() == role) spec = sb.spec();
  auto timeout = client_->impl_->ExecTimeout(spec, req);
  *step.mutable_exec() = std::move(req);
  client_->impl_->CallVia<v1::StepReply>(rec_->node_address(), std::move(step), timeout, std::move(done));
}

std::future<Result<v1::StepReply>> Session::StepAsync(uint64_t index, v1::ExecRequest req,
                                                     const StepOptions& options) const {
  auto p = std::make_shared<std::promise<Result<v1::StepReply>>>();
  auto f = p->get_future();
  StepAsync(index, std::move(req), options, [p](Result<v1::StepReply> r) { p->set_value(std::move(r)); });
  return f;
}

Result<v1::StepReply> Session::Step(uint64_t index, v1::ExecRequest req, const StepOptions& options) const {
  return Wait<v1::StepReply>(
      [&](Done<v1::StepReply> d) { StepAsync(index, std::move(req), options, std::move(d)); });
}

void Session::AnnotateAsync(uint64_t index, const v1::StepMeta& meta,
                            std::function<void(Result<v1::StepMeta>)> done) const {
  v1::AnnotateStepRequest req;
  req.set_session(name_);
  req.set_index(index);
  *req.mutable_meta() = meta;
  client_->impl_->Annotate(rec_->node_address(), std::move(req), Then<v1::StepReply>(std::move(done), [](v1::StepReply& r) {
                             return std::move(*r.mutable_step()->mutable_meta());
                           }));
}

std::future<Result<v1::StepMeta>> Session::AnnotateAsync(uint64_t index, const v1::StepMeta& meta) const {
  auto p = std::make_shared<std::promise<Result<v1::StepMeta>>>();
  auto f = p->get_future();
  AnnotateAsync(index, meta, [p](Result<v1::StepMeta> r) { p->set_value(std::move(r)); });
  return f;
}

Result<v1::StepMeta> Session::Annotate(uint64_t index, const v1::StepMeta& meta) const {
  return Wait<v1::StepMeta>([&](Done<v1::StepMeta> d) { AnnotateAsync(index, meta, std::move(d)); });
}

void Session::StepsAsync(uint64_t from, uint32_t limit, Done<v1::StepsReply> done) const {
  v1::ListStepsRequest req;
  req.set_session(name_);
  req.set_from(from);
  req.set_limit(limit);
  client_->impl_->CallVia<v1::StepsReply>(rec_->node_address(), std::move(req), client_->impl_->options.rpc_timeout,
                                          std::move(done));
}

Result<v1::StepsReply> Session::Steps(uint64_t from, uint32_t limit) const {
  return Wait<v1::StepsReply>([&](Done<v1::StepsReply> d) { StepsAsync(from, limit, std::move(d)); });
}

void Session::SandboxAsync(const std::string& role, Done<Sandbox> done) const {
  for (const auto& sb : rec_->sandboxes()) {
    if (sb.role() != role) continue;
    if (sb.id().empty())
      return done(Status::FailedPrecondition("session " + name_ + ": sandbox '" + role +
                                             "' is fncall (a fresh run per step); there is no sandbox to attach to"));
    return Client::AttachVia(client_, rec_->node_address(), sb.id(), std::move(done));
  }
  done(Status::NotFound("session " + name_ + " has no sandbox '" + role + "'"));
}

Result<Sandbox> Session::sandbox(const std::string& role) const {
  return Wait<Sandbox>([&](Done<Sandbox> d) { SandboxAsync(role, std::move(d)); });
}

void Session::GetAsync(Done<v1::SessionRecord> done) const {
  v1::GetSessionRequest req;
  req.set_name(name_);
  client_->impl_->CallVia<v1::SessionReply>(
      rec_->node_address(), std::move(req), client_->impl_->options.rpc_timeout,
      Then<v1::SessionReply>(std::move(done), [](v1::SessionReply& r) { return std::move(*r.mutable_session()); }));
}

Result<v1::SessionRecord> Session::Get() const {
  return Wait<v1::SessionRecord>([&](Done<v1::SessionRecord> d) { GetAsync(std::move(d)); });
}

void Session::CloseAsync(DoneStatus done) const {
  v1::CloseSessionRequest req;
  req.set_name(name_);
  client_->impl_->CallVia<v1::SessionReply>(rec_->node_address(), std::move(req), client_->impl_->options.rpc_timeout,
                                            StatusOnly<v1::SessionReply>(std::move(done)));
}

Status Session::Close() const {
  return WaitStatus([&](DoneStatus d) { CloseAsync(std::move(d)); });
}

}  // namespace dsec
