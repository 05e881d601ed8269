// A sandbox's running execs by pid (service.proto, ProcessRequest):
// listed, signalled, their stdin written and closed. An exec made with
// ExecRequest.interactive keeps its stdin open for SendInput until
// CloseStdin, and streamed (Sandbox::ExecStream) its first ExecOutput names
// its pid (no output in it). Container and VM kinds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsec/client.hpp"

namespace dsec {

// The execs running now, oldest first (any client's).
Result<std::vector<v1::ProcessInfo>> ListProcesses(const Sandbox& sandbox);
// `signal` to the process group of exec `pid`; NotFound when it has ended.
Status SignalProcess(const Sandbox& sandbox, uint32_t pid, int signal);
// `input` to an interactive exec's stdin, after what was sent before.
Status SendInput(const Sandbox& sandbox, uint32_t pid, const std::string& input);
Status CloseStdin(const Sandbox& sandbox, uint32_t pid);

// The request as given (sandbox_id set here); `done` on an SDK thread.
void ProcessAsync(const Sandbox& sandbox, v1::ProcessRequest req, Done<v1::ProcessReply> done);

// What the sandbox uses now (service.proto, UsageRequest): CPU time and its
// share since the last reading, memory, disk. FailedPrecondition when it
// is not running.
Result<v1::SandboxUsage> MeasureUsage(const Sandbox& sandbox);
void UsageAsync(const Sandbox& sandbox, Done<v1::UsageReply> done);

}  // namespace dsec
