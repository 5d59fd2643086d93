// Typed exceptions, their exit codes and the one generic status check. Free of fmt so
// nvcc-compiled code can include it; the formatting check macros are in core/check.h.
// Only apps/ catches these. Messages carry file:line and the host/rank context.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace dtrain {

// Process exit codes (documented in docs/commands.md). A launcher whose rank failed exits
// with that rank's code instead.
enum class Exit : int {
  OK = 0,
  INTERNAL = 1,       // a bug: an invariant did not hold
  USAGE = 2,          // bad command line, config or hostfile
  IO = 3,             // a file could not be read or written
  LAUNCH = 4,         // SSH / spawn / host key / agent failure
  COMM = 5,           // rendezvous or collective failure, timeout, peer lost
  TRAIN = 6,          // training cannot go on (e.g. fp16 loss scale at its minimum)
  CHECKPOINT = 7,     // no usable checkpoint
  DEVICE = 8,         // CUDA / cuBLAS / NCCL error
  HUNG = 9,           // a rank stopped heartbeating or made no training step in time (launcher)
  UNHEALTHY = 10,     // `dtrain doctor`: at least one check failed
  INTERRUPTED = 130,  // Ctrl-C
  STOPPED = 143       // told to stop (128 + SIGTERM): an agent whose round the launcher ended
};

class Error : public std::runtime_error {
 public:
  Error(Exit code, const std::string& what) : std::runtime_error(what), code_(code) {}
  Exit code() const { return code_; }
  int exit_code() const { return static_cast<int>(code_); }

 private:
  Exit code_;
};

#define DTRAIN_DEFINE_ERROR(Name, Code)                           \
  class Name : public Error {                                     \
   public:                                                        \
    explicit Name(const std::string& what) : Error(Code, what) {} \
  };
DTRAIN_DEFINE_ERROR(InternalError, Exit::INTERNAL)
DTRAIN_DEFINE_ERROR(UsageError, Exit::USAGE)
DTRAIN_DEFINE_ERROR(ConfigError, Exit::USAGE)
DTRAIN_DEFINE_ERROR(IoError, Exit::IO)
DTRAIN_DEFINE_ERROR(LaunchError, Exit::LAUNCH)
DTRAIN_DEFINE_ERROR(CommError, Exit::COMM)
DTRAIN_DEFINE_ERROR(TrainError, Exit::TRAIN)
DTRAIN_DEFINE_ERROR(CheckpointError, Exit::CHECKPOINT)
DTRAIN_DEFINE_ERROR(DeviceError, Exit::DEVICE)
#undef DTRAIN_DEFINE_ERROR

// "host=node1 rank=3" (or empty): appended to every check-macro message. Set once by
// the launcher, agents and ranks when they know who they are.
void set_error_context(std::string context);
const std::string& error_context();

namespace detail {
std::string where(const char* file, int line);
// Throws the Error subclass that matches code; used by DT_STATUS_CHECK.
[[noreturn]] void throw_error(Exit code, const std::string& message, const char* file, int line);
inline bool sys_ok(long r) { return r >= 0; }
std::string sys_describe(long r);  // strerror(errno) captured at the failure
}  // namespace detail

}  // namespace dtrain

// The one generic status check that DT_SYS_CHECK, DT_CUDA_CHECK, DT_CUBLAS_CHECK and
// DT_NCCL_CHECK are made from: evaluate expr once, test it with ok(status), describe a
// failure with describe(status), throw the Error for exit code `code`.
#define DT_STATUS_CHECK(expr, ok, describe, code)                                                            \
  do {                                                                                                       \
    auto dt_status_ = (expr);                                                                                \
    if (!(ok(dt_status_)))                                                                                   \
      ::dtrain::detail::throw_error(code, std::string(#expr) + " failed: " + describe(dt_status_), __FILE__, \
                                    __LINE__);                                                               \
  } while (0)

// DT_SYS_CHECK(::open(...)): POSIX calls returning -1 and setting errno.
#define DT_SYS_CHECK(expr) \
  DT_STATUS_CHECK(static_cast<long>(expr), ::dtrain::detail::sys_ok, ::dtrain::detail::sys_describe, ::dtrain::Exit::IO)
