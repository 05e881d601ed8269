#include "drivers/limits.hpp"

#include <string>

#include "drivers/driver.hpp"

namespace dsec::drivers {

LimitPolicy LimitPolicy::Default() {
  LimitPolicy p;
  auto& d = p.defaults;
  d.set_memory_bytes(512ull << 20);
  d.set_pids(256);
  d.set_cpu_millis(0);  // no quota: weights share the CPU
  d.set_timeout_ms(30'000);
  d.set_cpu_time_ms(0);
  d.set_output_bytes(1 << 20);
  d.set_file_size_bytes(256ull << 20);
  d.set_open_files(1024);
  d.set_disk_bytes(10ull << 30);
  auto& m = p.maxima;
  m.set_memory_bytes(64ull << 30);
  m.set_pids(32768);
  m.set_cpu_millis(256'000);
  m.set_timeout_ms(24u * 3600 * 1000);
  m.set_cpu_time_ms(24u * 3600 * 1000);
  m.set_output_bytes(16 << 20);
  m.set_file_size_bytes(1ull << 40);
  m.set_open_files(1 << 20);
  m.set_disk_bytes(1ull << 40);
  return p;
}

namespace {

template <class T>
Status Pick(const char* field, T exec_v, T spec_v, T def_v, T max_v, T min_v, T* out) {
  T v = exec_v ? exec_v : spec_v ? spec_v : def_v;
  if (max_v && v > max_v)
    return Status::InvalidArgument("limit " + std::string(field) + "=" + std::to_string(v) +
                                   " is above this node's maximum " + std::to_string(max_v));
  if (v && v < min_v)
    return Status::InvalidArgument("limit " + std::string(field) + "=" + std::to_string(v) +
                                   " is below the minimum " + std::to_string(min_v));
  *out = v;
  return Status::Ok();
}

}  // namespace

Result<v1::Limits> EffectiveLimits(const LimitPolicy& p, const KindTraits& kind, const v1::SandboxSpec& spec,
                                   const v1::ExecRequest& exec) {
  const auto &e = exec.limits(), &s = spec.limits(), &d = p.defaults, &m = p.maxima;
  v1::Limits out;
  uint64_t u64 = 0;
  uint32_t u32 = 0;
  // A run needs some memory for its runner and /work; below 16 MiB nothing useful starts.
  DSEC_RETURN_IF_ERROR(Pick("memory_bytes", e.memory_bytes(), s.memory_bytes(), d.memory_bytes(),
                            m.memory_bytes(), uint64_t{16} << 20, &u64));
  out.set_memory_bytes(u64);
  DSEC_RETURN_IF_ERROR(Pick("pids", e.pids(), s.pids(), d.pids(), m.pids(), 1u, &u32));
  out.set_pids(u32);
  DSEC_RETURN_IF_ERROR(
      Pick("cpu_millis", e.cpu_millis(), s.cpu_millis(), d.cpu_millis(), m.cpu_millis(), 10u, &u32));
  out.set_cpu_millis(u32);
  DSEC_RETURN_IF_ERROR(
      Pick("timeout_ms", e.timeout_ms(), s.timeout_ms(), d.timeout_ms(), m.timeout_ms(), 1u, &u32));
  out.set_timeout_ms(u32);
  DSEC_RETURN_IF_ERROR(Pick("cpu_time_ms", e.cpu_time_ms(), s.cpu_time_ms(), d.cpu_time_ms(),
                            m.cpu_time_ms(), 1u, &u32));
  out.set_cpu_time_ms(u32);
  DSEC_RETURN_IF_ERROR(Pick("output_bytes", e.output_bytes(), s.output_bytes(), d.output_bytes(),
                            m.output_bytes(), uint64_t{1}, &u64));
  out.set_output_bytes(u64);
  // A kind with a disk of its own bounds files by that disk.
  uint64_t file_size_default = kind.own_disk ? p.container_file_size_bytes : d.file_size_bytes();
  DSEC_RETURN_IF_ERROR(Pick("file_size_bytes", e.file_size_bytes(), s.file_size_bytes(), file_size_default,
                            m.file_size_bytes(), uint64_t{1}, &u64));
  out.set_file_size_bytes(u64);
  DSEC_RETURN_IF_ERROR(
      Pick("open_files", e.open_files(), s.open_files(), d.open_files(), m.open_files(), 16u, &u32));
  out.set_open_files(u32);
  // A disk of its own needs a few MiB for what programs write at all
  // (caches, logs); other kinds have no disk limit unless asked.
  uint64_t disk_default = kind.own_disk ? d.disk_bytes() : 0;
  DSEC_RETURN_IF_ERROR(Pick("disk_bytes", e.disk_bytes(), s.disk_bytes(), disk_default, m.disk_bytes(),
                            uint64_t{16} << 20, &u64));
  out.set_disk_bytes(u64);
  return out;
}

Status CheckExecRequest(const LimitPolicy& p, const v1::ExecRequest& exec) {
  if (exec.attach_pid()) {  // no command: the output of one running
    if (!exec.stream())
      return Status::InvalidArgument("exec: attach_pid " + std::to_string(exec.attach_pid()) +
                                     " needs stream (the output comes as it is printed)");
    if (exec.argv_size() || !exec.stdin().empty() || exec.interactive() || exec.has_pty() ||
        !exec.idempotency_key().empty())
      return Status::InvalidArgument("exec: attach_pid attaches to a running process: no argv, stdin, "
                                     "interactive, pty or idempotency_key with it");
    return Status::Ok();
  }
  if (exec.argv_size() == 0 || exec.argv(0).empty())
    return Status::InvalidArgument("exec: argv is empty; give the command to run");
  if (exec.idempotency_key().size() > 1024)
    return Status::InvalidArgument("exec: idempotency_key is " + std::to_string(exec.idempotency_key().size()) +
                                   " bytes; the limit is 1024");
  if (!exec.idempotency_key().empty() && exec.stream())
    return Status::InvalidArgument("exec: an exec with an idempotency_key cannot stream its output");
  size_t bytes = 0;
  for (const auto& a : exec.argv()) {
    if (a.find('\0') != std::string::npos)
      return Status::InvalidArgument("exec: an argv element contains a NUL byte");
    bytes += a.size() + 1;
  }
  for (const auto& [k, v] : exec.env()) {
    if (k.empty())
      return Status::InvalidArgument("exec: an environment variable has an empty name");
    if (k.find('\0') != std::string::npos)
      return Status::InvalidArgument("exec: an environment variable name contains a NUL byte");
    if (k.find('=') != std::string::npos)
      return Status::InvalidArgument("exec: bad environment variable name '" + k +
                                     "' (a name cannot contain '=')");
    if (v.find('\0') != std::string::npos)
      return Status::InvalidArgument("exec: the value of environment variable '" + k +
                                     "' contains a NUL byte");
    bytes += k.size() + v.size() + 2;
  }
  if (bytes > p.max_argv_env_bytes)
    return Status::InvalidArgument("exec: argv+env is " + std::to_string(bytes) +
                                   " bytes, above the maximum " +
                                   std::to_string(p.max_argv_env_bytes));
  if (exec.stdin().size() > p.max_stdin_bytes)
    return Status::InvalidArgument("exec: stdin is " + std::to_string(exec.stdin().size()) +
                                   " bytes, above the maximum " + std::to_string(p.max_stdin_bytes) +
                                   " (pass large inputs as files)");
  if (exec.cwd().find('\0') != std::string::npos)
    return Status::InvalidArgument("exec: cwd contains a NUL byte");
  return Status::Ok();
}

Status CheckSpec(const LimitPolicy& p, const v1::SandboxSpec& spec) {
  size_t bytes = 0;
  for (const auto& [k, v] : spec.env()) {
    if (k.empty()) return Status::InvalidArgument("spec: an environment variable has an empty name");
    if (k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
      return Status::InvalidArgument("spec: environment variable name '" + k.substr(0, 64) +
                                     "' may not contain '=' or NUL");
    if (v.find('\0') != std::string::npos)
      return Status::InvalidArgument("spec: the value of environment variable " + k + " contains a NUL byte");
    bytes += k.size() + v.size() + 2;
  }
  if (bytes > p.max_argv_env_bytes)
    return Status::InvalidArgument("spec: env is " + std::to_string(bytes) + " bytes, above the maximum " +
                                   std::to_string(p.max_argv_env_bytes));
  if (spec.workdir().find('\0') != std::string::npos || spec.workdir().size() > 4096)
    return Status::InvalidArgument("spec: workdir contains a NUL byte or is longer than 4096 bytes");
  if (spec.image().size() > 256) return Status::InvalidArgument("spec: image name longer than 256 bytes");
  return CheckLabels(spec);
}

Status CheckLabels(const v1::SandboxSpec& spec) {
  if (static_cast<size_t>(spec.labels_size()) > kMaxLabels)
    return Status::InvalidArgument("spec: " + std::to_string(spec.labels_size()) + " labels, above the maximum of " +
                                   std::to_string(kMaxLabels));
  size_t bytes = 0;
  for (const auto& [k, v] : spec.labels()) {
    bool printable = !k.empty() && k.size() <= 256;
    for (unsigned char c : k) printable = printable && c > 0x20 && c < 0x7f && c != '=';
    if (!printable)
      return Status::InvalidArgument("spec: label key '" + k.substr(0, 64) +
                                     "' must be 1-256 bytes of printable ASCII, without spaces or '='");
    if (v.size() > 4096)
      return Status::InvalidArgument("spec: the value of label '" + k + "' is " + std::to_string(v.size()) +
                                     " bytes, above the maximum of 4096");
    bytes += k.size() + v.size();
  }
  if (bytes > kMaxLabelBytes)
    return Status::InvalidArgument("spec: labels take " + std::to_string(bytes) + " bytes, above the maximum of " +
                                   std::to_string(kMaxLabelBytes));
  return Status::Ok();
}

}  // namespace dsec::drivers
