// NCCL backend: collectives between CUDA device buffers, the fast GPU path. The
// communicator is non-blocking so a watchdog can abort it: a lost peer, an NCCL error,
// a timeout or abort() end in CommError instead of a hang. CPU-only builds keep the
// factory, which then throws DeviceError. No CUDA header here: only nccl_comm.cpp (the
// module's CUDA glue) sees the CUDA toolkit or the execution engine.
#pragma once

#include "comm/communicator.h"

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>

namespace dtrain::comm {

struct NcclOptions {
  /// Bound on waiting for rank 0's NCCL id in the store, on communicator
  /// initialisation, and on every synchronize(): longer means CommError.
  std::chrono::milliseconds timeout{60000};
};

/// Creates this rank's NCCL communicator on CUDA device `device` (made current on the
/// calling thread, which should also allocate the Buffers). Rank 0 publishes the NCCL
/// unique id under the store key "nccl_unique_id"; the others wait for it. Collectives
/// are asynchronous on the communicator's stream: call synchronize() before reading
/// results on the host. Throws UsageError for bad arguments, CommError when the id or
/// the initialisation does not arrive in time, DeviceError without CUDA.
std::unique_ptr<Communicator> comm_create_nccl(gloo::rendezvous::Store& store, int rank, int size, int device,
                                               const NcclOptions& opts);

}  // namespace dtrain::comm
