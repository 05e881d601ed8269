#include "runtime/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <chrono>
#include <mutex>
#include <vector>

namespace dsec {

namespace {
std::mutex g_mu;
std::vector<spdlog::sink_ptr> g_sinks;
spdlog::level::level_enum g_level = spdlog::level::info;

std::vector<spdlog::sink_ptr>& Sinks() {
  if (g_sinks.empty()) g_sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  return g_sinks;
}
}  // namespace

std::string InitLogging(const LogOptions& o) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto level = spdlog::level::from_str(o.level);
  if (level == spdlog::level::off && o.level != "off")
    return "unknown log level '" + o.level + "' (trace, debug, info, warn, error, off)";
  g_level = level;
  g_sinks.clear();
  g_sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (!o.file.empty()) {
    try {
      g_sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(o.file, false));
    } catch (const spdlog::spdlog_ex& e) {
      return "cannot open log file " + o.file + ": " + e.what();
    }
  }
  spdlog::drop_all();
  // A log file someone tails shows info lines within a second, not when a
  // buffer fills (warnings and errors are flushed at once).
  if (!o.file.empty()) spdlog::flush_every(std::chrono::seconds(1));
  return {};
}

std::shared_ptr<spdlog::logger> Logger(const std::string& component) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (auto l = spdlog::get(component)) return l;
  auto& sinks = Sinks();
  auto l = std::make_shared<spdlog::logger>(component, sinks.begin(), sinks.end());
  l->set_level(g_level);
  l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%n] %v");
  l->flush_on(spdlog::level::warn);
  spdlog::register_logger(l);
  return l;
}

void ShutdownLogging() { spdlog::shutdown(); }

}  // namespace dsec
