#include "drivers/verdict.hpp"

#include <cerrno>
#include <cstring>

#include "drivers/run_outcome.pb.h"

namespace dsec::drivers {

namespace {

std::string Mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

v1::ExecResult ToExecResult(const run::Outcome& o, const v1::Limits& limits, const std::string& argv0) {
  v1::ExecResult r;
  r.set_exit_code(o.exit_code());
  r.set_signal(o.signal());
  r.set_stdout(o.stdout());
  r.set_stderr(o.stderr());
  r.set_stdout_truncated(o.stdout_truncated());
  r.set_stderr_truncated(o.stderr_truncated());
  r.set_cpu_us(o.cpu_us());
  r.set_wall_us(o.wall_us());
  r.set_peak_memory_bytes(o.peak_memory_bytes());
  if (!o.platform_error().empty()) {
    r.set_verdict(v1::VERDICT_PLATFORM_ERROR);
    r.set_error("platform error: " + o.platform_error());
  } else if (o.killed()) {
    r.set_verdict(v1::VERDICT_PLATFORM_ERROR);
    r.set_error("killed" + (o.kill_reason().empty() ? std::string() : ": " + o.kill_reason()));
  } else if (o.timed_out()) {
    r.set_verdict(v1::VERDICT_TIME_LIMIT);
    r.set_error("time limit: wall-clock limit of " + std::to_string(limits.timeout_ms()) +
                " ms exceeded");
  } else if (o.cpu_time_exceeded()) {
    r.set_verdict(v1::VERDICT_TIME_LIMIT);
    r.set_error("time limit: CPU-time limit of " + std::to_string(limits.cpu_time_ms()) +
                " ms exceeded");
  } else if (o.oom_killed()) {
    r.set_verdict(v1::VERDICT_MEMORY_LIMIT);
    r.set_error("memory limit: the run used more than " + Mib(limits.memory_bytes()) +
                " and was killed");
  } else if (o.output_exceeded()) {
    r.set_verdict(v1::VERDICT_OUTPUT_LIMIT);
    r.set_error("output limit: a stream passed " + std::to_string(limits.output_bytes()) +
                " bytes; the run was killed and its output truncated");
  } else if (!o.user_error().empty()) {
    r.set_verdict(v1::VERDICT_RUNTIME_ERROR);
    r.set_exec_failed(true);
    r.set_exit_code(126);
    r.set_error(o.user_error());
  } else if (o.exec_errno()) {
    r.set_verdict(v1::VERDICT_RUNTIME_ERROR);
    r.set_exec_failed(true);
    // The shell's convention, whatever the Outcome says: 127 not found, 126 not executable.
    r.set_exit_code(o.exec_errno() == ENOENT ? 127 : 126);
    r.set_error(argv0 + (o.exec_errno() == ENOENT ? ": command not found"
                                                   : std::string(": cannot execute: ") +
                                                         std::strerror(o.exec_errno())));
  } else if (o.exited()) {
    r.set_verdict(o.exit_code() == 0 ? v1::VERDICT_OK : v1::VERDICT_RUNTIME_ERROR);
  } else {
    r.set_verdict(v1::VERDICT_RUNTIME_ERROR);
    r.set_error(std::string("killed by signal ") + strsignal(o.signal()));
  }
  return r;
}

}  // namespace dsec::drivers
