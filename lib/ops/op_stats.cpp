// Per-op-class time counters behind bench_cpu_step's breakdown: relaxed atomics, a
// thread-local depth so only the outermost scope of a fused op counts.
#include "ops/op_stats.h"

#include <atomic>
#include <cstdint>

namespace dtrain::ops {

namespace {
std::atomic<bool> g_on{false};
std::array<std::atomic<uint64_t>, OP_CLASSES> g_ns{};
thread_local int t_depth = 0;
}  // namespace

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::LINEAR: return "linear (GEMM + bias)";
    case OpClass::ATTENTION: return "attention";
    case OpClass::NORM: return "norms (+ residual)";
    case OpClass::ACTIVATION: return "activations";
    case OpClass::CROSS_ENTROPY: return "cross-entropy";
    case OpClass::EMBEDDING: return "embedding";
    case OpClass::ROPE: return "rope";
    case OpClass::OPTIMIZER: return "AdamW";
    case OpClass::OTHER: return "other (copies, casts, adds)";
    case OpClass::COUNT: break;
  }
  return "?";
}

void op_stats_enable(bool on) { g_on = on; }
bool op_stats_enabled() { return g_on.load(std::memory_order_relaxed); }

void op_stats_reset() {
  for (auto& n : g_ns) n = 0;
}

std::array<double, OP_CLASSES> op_stats_seconds() {
  std::array<double, OP_CLASSES> s{};
  for (size_t i = 0; i < OP_CLASSES; ++i) s[i] = static_cast<double>(g_ns[i].load()) * 1e-9;
  return s;
}

void op_stats_add(OpClass c, double seconds) {
  g_ns[static_cast<size_t>(c)].fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

OpScope::OpScope(OpClass c) : cls_(c), on_(g_on.load(std::memory_order_relaxed) && t_depth == 0) {
  ++t_depth;
  if (on_) t0_ = std::chrono::steady_clock::now();
}

OpScope::~OpScope() {
  --t_depth;
  if (!on_) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
  g_ns[static_cast<size_t>(cls_)].fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

}  // namespace dtrain::ops
