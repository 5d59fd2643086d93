// Threading policy shared by the CPU ops (internal to lib/ops).
// Row loops (over B*T rows, or (b, head) pairs) run under `#pragma omp parallel for
// schedule(static)` with an `if(...)` so tiny problems stay serial; GEMMs go through
// OpenBLAS, which runs its own pthreads. No BLAS call is ever made inside an OpenMP
// region, so the two pools never nest and cannot oversubscribe: at any moment either
// OpenMP's threads or OpenBLAS's threads are working. Static schedules and per-row (or
// per-channel) ownership make every op deterministic: the same inputs give bit-identical
// outputs for any run, which activation recomputation relies on.
#pragma once

#include <cstddef>

namespace dtrain::ops {

// Below this many floats of work a loop stays serial (thread wake-up costs more).
inline constexpr size_t PARALLEL_MIN_WORK = 1 << 15;

}  // namespace dtrain::ops
