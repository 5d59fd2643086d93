// The CUDA device's own set-up: its default memory pool keeps what it holds across
// synchronisations (release threshold UINT64_MAX), so the memory a step frees is reused
// by the next step instead of going back to the driver. Skips without a GPU.
#include "device/device.h"

#include "gpu/gpu_skip.h"

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdint>

using namespace dtrain;

TEST_CASE("the CUDA device keeps its default pool's memory across synchronisations") {
  SKIP_WITHOUT_GPU();
  auto dev = device::cuda_create(0);
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess);
  uint64_t threshold = 0;
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) == cudaSuccess);
  CHECK(threshold == UINT64_MAX);

  // What a step does: allocate, free, synchronise. The freed bytes stay reserved.
  const size_t bytes = size_t{8} << 20;
  uint64_t used0 = 0, reserved = 0, used = 0;
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used0) == cudaSuccess);
  void* p = dev->alloc(bytes);
  dev->free(p);
  dev->synchronize();
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess);
  CHECK(used == used0);
  CHECK(reserved >= used0 + bytes);
}
