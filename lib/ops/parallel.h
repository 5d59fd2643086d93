// The CPU ops' threading: one small sleeping thread pool with static partitions.
// Row loops (over B*T rows, channels, or (b, head) pairs) run through parallel_for, and
// so do GEMMs: OpenBLAS is pinned to one thread and ops::gemm splits the output rows
// across the pool. Workers block on a condition variable after a short bounded spin
// (DTRAIN_POOL_SPIN_US, default 200 us) instead of spinning for long: OpenMP's default
// busy-wait, or OpenBLAS's own pool yielding next to it, made a loaded 2-core machine
// up to 2.5x slower than serial. Partitions depend only on the sizes and the
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
/// thread count, up to `chunks_per_thread` chunks per thread) claimed by the caller and
/// the pool's workers. More chunks balance better when the OS deschedules a worker; fewer
/// suit work with a fixed cost per chunk (a GEMM packs its B matrix once per call).
/// Serial when work < PARALLEL_MIN_WORK, when called from inside another parallel_for, or
/// while another thread is using the pool. Rethrows the first exception a chunk threw.
void parallel_for(size_t n, size_t work, const std::function<void(size_t, size_t)>& fn, int chunks_per_thread = 4);

}  // namespace dtrain::ops
