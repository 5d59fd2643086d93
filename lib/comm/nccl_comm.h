// NCCL backend: collectives between CUDA device buffers, the fast GPU path. The
// communicator is non-blocking so a watchdog can abort it: a lost peer, an NCCL error,
// a timeout or abort() end in CommError instead of a hang. CPU-only builds keep the
// factory, which then throws DeviceError.
#pragma once

#include "comm/communicator.h"

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>

#ifdef DTRAIN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

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

#ifdef DTRAIN_HAVE_CUDA
/// The stream controls of an NCCL communicator (dynamic_cast from Communicator).
class NcclCommunicator : public Communicator {
 public:
  /// The stream collectives are enqueued on (the communicator's own non-blocking stream
  /// unless set_stream() chose another).
  virtual cudaStream_t stream() const = 0;
  /// Enqueue later collectives on `stream` (not owned; must outlive its use here);
  /// nullptr restores the communicator's own stream.
  virtual void set_stream(cudaStream_t stream) = 0;
};
#endif

}  // namespace dtrain::comm
