// Host values staged through stream-ordered device scratch for the device communicators.
// The scratch is freed on the stream after the copies, also when a step throws.
#ifdef DTRAIN_HAVE_CUDA  // the device communicators only exist with CUDA

#include "comm/device_staging.h"

#include "core/cuda_check.h"

namespace dtrain::comm {

namespace {
// Runs body(scratch) with `bytes` of device scratch on `stream`, freed in stream order.
template <typename F>
void with_scratch(int device, cudaStream_t stream, size_t bytes, F&& body) {
  DT_CUDA_CHECK(cudaSetDevice(device));
  char* d = nullptr;
  DT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), bytes, stream));
  try {
    body(d);
  } catch (...) {
    (void)cudaFreeAsync(d, stream);
    throw;
  }
  DT_CUDA_CHECK(cudaFreeAsync(d, stream));
}
}  // namespace

void staged_allreduce_host(Communicator& c, int device, cudaStream_t stream, void* data, size_t count, DType dtype,
                           ReduceOp op) {
  if (count == 0) return;
  const size_t bytes = count * dtype_size(dtype);
  with_scratch(device, stream, bytes, [&](char* d) {
    DT_CUDA_CHECK(cudaMemcpyAsync(d, data, bytes, cudaMemcpyHostToDevice, stream));
    c.allreduce(d, d, count, dtype, op);
    DT_CUDA_CHECK(cudaMemcpyAsync(data, d, bytes, cudaMemcpyDeviceToHost, stream));
    c.synchronize();
  });
}

void staged_all_gather_host(Communicator& c, int device, cudaStream_t stream, const void* send, void* recv,
                            size_t send_count, DType dtype) {
  if (send_count == 0) return;
  const size_t bytes = send_count * dtype_size(dtype), all = bytes * static_cast<size_t>(c.size());
  with_scratch(device, stream, all, [&](char* d) {
    char* mine = d + static_cast<size_t>(c.rank()) * bytes;
    DT_CUDA_CHECK(cudaMemcpyAsync(mine, send, bytes, cudaMemcpyHostToDevice, stream));
    c.all_gather(mine, d, send_count, dtype);
    DT_CUDA_CHECK(cudaMemcpyAsync(recv, d, all, cudaMemcpyDeviceToHost, stream));
    c.synchronize();
  });
}

}  // namespace dtrain::comm

#endif  // DTRAIN_HAVE_CUDA
