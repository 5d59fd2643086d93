// Logging implementation: one fwrite per line under a mutex.
#include "core/log.h"

#include "core/env.h"
#include "core/error.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace dtrain {

namespace {

// Read when the process starts, before any config exists: an unknown value means info here,
// and the first config load refuses it naming DTRAIN_LOG_LEVEL (config's schema_env_knobs
// declares the knob; core cannot depend on config).
LogLevel level_from_env() {
  const char* v = env_get("DTRAIN_LOG_LEVEL");
  if (!v) return LogLevel::INFO;
  std::string_view s(v);
  if (s == "debug") return LogLevel::DEBUG;
  if (s == "warn") return LogLevel::WARN;
  if (s == "error") return LogLevel::ERROR;
  if (s == "off") return LogLevel::OFF;
  return LogLevel::INFO;
}

std::atomic<int> g_level{static_cast<int>(level_from_env())};
std::mutex g_mu;

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void log_set_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

void log_write(LogLevel level, std::string_view message) {
  static constexpr const char* kTag[] = {"debug", "", "warning", "error", ""};
  const std::string& ctx = error_context();
  std::string line = ctx.empty() ? std::string("[dtrain] ") : fmt::format("[dtrain {}] ", ctx);
  const char* tag = kTag[static_cast<int>(level)];
  if (*tag) line += fmt::format("{}: ", tag);
  line.append(message);
  if (line.empty() || line.back() != '\n') line.push_back('\n');
  std::lock_guard<std::mutex> lock(g_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace dtrain
