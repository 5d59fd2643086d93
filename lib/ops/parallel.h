// The CPU ops' threading: one small sleeping thread pool with static partitions.
// Row loops (over B*T rows, channels, or (b, head) pairs) run through parallel_for, and
// so do GEMMs: OpenBLAS is pinned to one thread and ops::gemm splits the output rows
// across the pool. Workers block on a condition variable instead of spinning: OpenMP's
// default busy-wait, or OpenBLAS's own pool yielding next to it, made a loaded 2-core
// machine up to 2.5x slower than serial. Partitions depend only on the sizes and the
// thread count, and every loop owns its output rows, so results are deterministic
// (activation recomputation relies on that; row loops are even identical across thread
// counts).
#pragma once

#include <cstddef>
#include <functional>

namespace dtrain::ops {

/// Below this many floats of work a loop stays serial (waking threads costs more).
inline constexpr size_t PARALLEL_MIN_WORK = 1 << 15;

/// Threads the row loops use (>= 1). Default: $DTRAIN_NUM_THREADS, else $OMP_NUM_THREADS
/// (what torchrun-style launchers set per rank), else the number of hardware threads.
int num_threads();
/// Sets the thread count (n >= 1); takes effect for the next parallel_for.
void set_num_threads(int n);

/// Calls fn(begin, end) on contiguous chunks of [0, n) (a partition fixed by n and the
/// thread count, up to 4 chunks per thread) claimed by the caller and the pool's workers. Serial when work < PARALLEL_MIN_WORK, when called from inside
/// another parallel_for, or while another thread is using the pool. Rethrows the first
/// exception a chunk threw.
void parallel_for(size_t n, size_t work, const std::function<void(size_t, size_t)>& fn);

}  // namespace dtrain::ops
