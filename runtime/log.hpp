// Logging: spdlog, one named logger per component ("node", "console",
// "fncall", ...), all writing to the same sinks (stderr, and a file when
// asked). Call InitLogging once at start and ShutdownLogging after the
// actor system is gone.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace dsec {

struct LogOptions {
  std::string level = "info";  // trace, debug, info, warn, error, off
  std::string file;            // also append to this file when set
};

// InvalidArgument-like error text when the level is unknown; "" on success.
std::string InitLogging(const LogOptions& options);
// The logger for `component`, created on first use with the common sinks.
std::shared_ptr<spdlog::logger> Logger(const std::string& component);
void ShutdownLogging();

}  // namespace dsec
