// ExitStatus wording and signal names shared by the local and SSH spawners.
#include "launch/spawner.h"

#include <fmt/format.h>

#include <csignal>
#include <cstring>

namespace dtrain::launch {

Process::~Process() = default;

std::string signal_name(int signal) {
  // sigabbrev_np is glibc >= 2.32: "KILL" for 9, nullptr for unnamed numbers.
  const char* abbrev = ::sigabbrev_np(signal);
  if (abbrev) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", signal);
}

std::string ExitStatus::describe() const {
  std::string text;
  if (connection_lost) {
    text = detail.empty() ? "SSH connection lost" : detail;
    return text;
  }
  if (exited) text = fmt::format("exited with code {}", code);
  else text = fmt::format("killed by signal {} ({})", signal, signal_name(signal));
  if (!detail.empty()) text += fmt::format(" ({})", detail);
  return text;
}

}  // namespace dtrain::launch
