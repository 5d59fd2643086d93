// The arithmetic of the device-local communicator (lib/comm/local_comm.cpp): several
// ranks' buffers on one device reduced element by element in a fixed rank order, so the
// result has the same bits whatever the ranks' timing; and its test switch's delay.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::kernels {

/// The most inputs one rank_reduce call takes (the ranks of one device-local group).
inline constexpr int RANK_REDUCE_MAX_INPUTS = 16;

enum class RankReduceOp { SUM, AVG, MAX };

/// out[i] = op over inputs[0][i], inputs[1][i], ... inputs[n-1][i], in that order, for
/// i < count (device pointers of one device, n in [1, RANK_REDUCE_MAX_INPUTS]). bf16 and
/// fp16 accumulate in fp32 and round once; AVG divides the fp32 sum by n (as NCCL's
/// reduction and the engine's NCCL). out may equal an input (each element is read by the
/// thread that writes it, before it writes); it must not partially overlap one.
void rank_reduce(void* out, const void* const* inputs, int n, size_t count, DType dtype, RankReduceOp op,
                 cudaStream_t stream);

/// The longest stream_delay (10 ms).
inline constexpr long long STREAM_DELAY_MAX_NS = 10'000'000;

/// One thread on `stream` spins on the GPU's nanosecond timer for `ns` (0 to
/// STREAM_DELAY_MAX_NS), reading it a bounded number of times, so the stream's later work
/// starts that much later (a test switch that widens race windows). Under the CPU execution
/// engine, whose time is not a GPU's, a fixed short loop.
void stream_delay(long long ns, cudaStream_t stream);

}  // namespace dtrain::kernels
