// Host values through device memory for a device communicator (NCCL, device-local): the
// staged allreduce_host / all_gather_host both share. CUDA glue: built with CUDA only.
#pragma once

#include "comm/communicator.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::comm {

/// allreduce of `count` host values in place: copied into stream-ordered scratch on
/// `stream` (device `device`), reduced by c.allreduce, copied back, then c.synchronize().
void staged_allreduce_host(Communicator& c, int device, cudaStream_t stream, void* data, size_t count, DType dtype,
                           ReduceOp op);

/// all_gather of `send_count` host values per rank into host recv (c.size() * send_count),
/// through stream-ordered scratch on `stream`, complete on return (c.synchronize()).
void staged_all_gather_host(Communicator& c, int device, cudaStream_t stream, const void* send, void* recv,
                            size_t send_count, DType dtype);

}  // namespace dtrain::comm
