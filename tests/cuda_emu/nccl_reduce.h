// CUDA execution engine (test-only): NCCL's element-wise reductions and type sizes, as
// the TCP collectives (nccl.cpp) apply them on the executor thread.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <vector>

namespace cuda_emu::nccl {

// out[i] = op over in[0..n)[i] in rank order (16-bit floats accumulate in fp32 and round
// once; integers wrap; ncclAvg divides the sum by n). out may alias an input at the same
// index. An unknown type leaves out untouched (the callers validate types first).
void reduce(ncclDataType_t dt, ncclRedOp_t op, void* out, const std::vector<const void*>& in, size_t count);
// Bytes per element of dt.
size_t dtype_size(ncclDataType_t dt);

}  // namespace cuda_emu::nccl
