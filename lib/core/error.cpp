// Error context and the helpers behind the check macros.
#include "core/error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace dtrain {

namespace {
std::mutex g_context_mu;
std::string g_context;
}  // namespace

void set_error_context(std::string context) {
  std::lock_guard<std::mutex> lock(g_context_mu);
  g_context = std::move(context);
}

const std::string& error_context() {
  std::lock_guard<std::mutex> lock(g_context_mu);
  return g_context;
}

namespace detail {

std::string where(const char* file, int line) {
  std::string_view f(file);
  // Show paths relative to the source tree: lib/config/config.cpp, not /home/...
  for (std::string_view root : {"/lib/", "/apps/", "/kernels/", "/tests/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string_view::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  const std::string& ctx = error_context();
  if (ctx.empty()) return fmt::format(" [{}:{}]", f, line);
  return fmt::format(" [{}:{} {}]", f, line, ctx);
}

void throw_error(Exit code, const std::string& message, const char* file, int line) {
  std::string m = message + where(file, line);
  switch (code) {
    case Exit::USAGE: throw ConfigError(m);
    case Exit::IO: throw IoError(m);
    case Exit::LAUNCH: throw LaunchError(m);
    case Exit::COMM: throw CommError(m);
    case Exit::TRAIN: throw TrainError(m);
    case Exit::CHECKPOINT: throw CheckpointError(m);
    case Exit::DEVICE: throw DeviceError(m);
    default: throw InternalError(m);
  }
}

std::string sys_describe(long r) {
  int err = errno;
  return fmt::format("returned {}, errno {} ({})", r, err, std::strerror(err));
}

}  // namespace detail
}  // namespace dtrain
