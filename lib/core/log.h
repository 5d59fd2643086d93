// Leveled logging to stderr with a "[dtrain <context>]" prefix. The level comes from
// DTRAIN_LOG_LEVEL (debug|info|warn|error; default info). Thread-safe, line-atomic.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace dtrain {

enum class LogLevel { DEBUG = 0, INFO = 1, WARN = 2, ERROR = 3, OFF = 4 };

LogLevel log_level();
void log_set_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::DEBUG) log_write(LogLevel::DEBUG, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::INFO) log_write(LogLevel::INFO, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::WARN) log_write(LogLevel::WARN, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::ERROR) log_write(LogLevel::ERROR, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dtrain
