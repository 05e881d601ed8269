#include "dsec/processes.hpp"

#include "sdk/src/client_impl.hpp"
#include "sdk/src/extra_calls.hpp"

namespace dsec {

void ProcessAsync(const Sandbox& sandbox, v1::ProcessRequest req, Done<v1::ProcessReply> done) {
  ExtraCalls::Call<v1::ProcessReply>(sandbox, std::move(req), std::move(done));
}

namespace {

Result<v1::ProcessReply> Ask(const Sandbox& sb, v1::ProcessOp op, uint32_t pid, int signal = 0,
                             const std::string& input = "") {
  v1::ProcessRequest req;
  req.set_op(op);
  req.set_pid(pid);
  req.set_signal(signal);
  req.set_input(input);
  return Wait<v1::ProcessReply>([&](Done<v1::ProcessReply> d) { ProcessAsync(sb, std::move(req), std::move(d)); });
}

}  // namespace

Result<std::vector<v1::ProcessInfo>> ListProcesses(const Sandbox& sandbox) {
  auto r = Ask(sandbox, v1::PROCESS_OP_LIST, 0);
  if (!r.ok()) return r.status();
  return std::vector<v1::ProcessInfo>(r->processes().begin(), r->processes().end());
}

Status SignalProcess(const Sandbox& sandbox, uint32_t pid, int signal) {
  return Ask(sandbox, v1::PROCESS_OP_SIGNAL, pid, signal).status();
}

Status SendInput(const Sandbox& sandbox, uint32_t pid, const std::string& input) {
  return Ask(sandbox, v1::PROCESS_OP_INPUT, pid, 0, input).status();
}

Status CloseStdin(const Sandbox& sandbox, uint32_t pid) {
  return Ask(sandbox, v1::PROCESS_OP_CLOSE_STDIN, pid).status();
}

void UsageAsync(const Sandbox& sandbox, Done<v1::UsageReply> done) {
  ExtraCalls::Call<v1::UsageReply>(sandbox, v1::UsageRequest(), std::move(done));
}

Result<v1::SandboxUsage> MeasureUsage(const Sandbox& sandbox) {
  auto r = Wait<v1::UsageReply>([&](Done<v1::UsageReply> d) { UsageAsync(sandbox, std::move(d)); });
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_usage());
}

}  // namespace dsec
