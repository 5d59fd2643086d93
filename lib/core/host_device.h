// DT_HOST_DEVICE: marks an inline function that one header gives both the host code and
// the CUDA kernels (nvcc compiles it for both sides; any other compiler sees a plain
// inline function), so host and device compute it from one definition.
#pragma once

#if defined(__CUDACC__)
#define DT_HOST_DEVICE __host__ __device__
#else
#define DT_HOST_DEVICE
#endif
