// Time accounting of the CPU ops for benchmarks (bench_cpu_step's per-op breakdown): wall
// time per op class, measured on the calling thread around each device op, and the
// thread-time spent inside BLAS sgemm calls (on whichever pool thread runs them). Off by
// default; when off a scope costs one relaxed load.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>

namespace dtrain::ops {

enum class OpClass { LINEAR, ATTENTION, NORM, ACTIVATION, CROSS_ENTROPY, EMBEDDING, ROPE, OPTIMIZER, OTHER, COUNT };
inline constexpr size_t OP_CLASSES = static_cast<size_t>(OpClass::COUNT);

const char* op_class_name(OpClass c);

void op_stats_enable(bool on);
bool op_stats_enabled();
void op_stats_reset();
/// Seconds of wall time per class since the last reset (outermost scopes only).
std::array<double, OP_CLASSES> op_stats_seconds();
void op_stats_add(OpClass c, double seconds);

/// Times one op into its class when accounting is on; nested scopes (a fused op calling
/// another) count only the outermost one.
class OpScope {
 public:
  explicit OpScope(OpClass c);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpClass cls_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace dtrain::ops
