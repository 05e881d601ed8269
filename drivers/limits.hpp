// Effective limits of a run: per-exec overrides over the sandbox spec over the
// node's defaults, checked against the node's maxima.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"

namespace dsec::drivers {
struct KindTraits;  // driver.hpp
}

namespace dsec::drivers {

struct LimitPolicy {
  v1::Limits defaults;   // used where neither exec nor spec sets a value
  // Containers: files of any size unless asked (the disk limit bounds what
  // they write); 256 MiB per file broke builds and dataset steps.
  uint64_t container_file_size_bytes = 0;  // 0: no RLIMIT_FSIZE
  // defaults.disk_bytes / maxima.disk_bytes are containers' (fncall keeps
  // its files in memory, within the memory limit).
  v1::Limits maxima;     // a request above any of these is refused
  size_t max_argv_env_bytes = 1 << 20;    // argv + env, bytes
  size_t max_stdin_bytes = 16 << 20;
  static LimitPolicy Default();
};

// Merges exec over spec over defaults (the kind's own where its traits have
// them: KindTraits::own_disk); InvalidArgument naming the field and the
// maximum when a value is out of range.
Result<v1::Limits> EffectiveLimits(const LimitPolicy& policy, const KindTraits& kind, const v1::SandboxSpec& spec,
                                   const v1::ExecRequest& exec);

// Checks the size of argv/env/stdin and that argv is not empty.
Status CheckExecRequest(const LimitPolicy& policy, const v1::ExecRequest& exec);

// Checks what a spec adds to every exec: its env (names, NULs, total size
// against max_argv_env_bytes) and its workdir; and its labels (CheckLabels).
Status CheckSpec(const LimitPolicy& policy, const v1::SandboxSpec& spec);

// A spec's labels (its metadata) within their bounds: at most kMaxLabels
// keys; a key 1-256 bytes of printable ASCII without '='; a value at most
// 4096 bytes; kMaxLabelBytes in all. InvalidArgument naming the key.
inline constexpr size_t kMaxLabels = 64;
inline constexpr size_t kMaxLabelBytes = 16 << 10;
Status CheckLabels(const v1::SandboxSpec& spec);

}  // namespace dsec::drivers
