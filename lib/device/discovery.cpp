// Device discovery: the one count of the CUDA devices this process sees. Its own file, so
// that the launcher's modules (which count GPUs but run no device code) link this and
// the kernels' discovery call, not the CUDA device with its kernels and cuBLASLt.
#include "device/device.h"

#ifdef DTRAIN_HAVE_CUDA
#include "kernels/device.cuh"
#endif

namespace dtrain::device {

int cuda_count() {
#ifdef DTRAIN_HAVE_CUDA
  return kernels::device_count();
#else
  return 0;
#endif
}

size_t cuda_memory_bytes() {
#ifdef DTRAIN_HAVE_CUDA
  size_t least = 0;
  for (int i = 0; i < kernels::device_count(); ++i) {
    const size_t b = kernels::device_memory_bytes(i);
    if (b && (!least || b < least)) least = b;
  }
  return least;
#else
  return 0;
#endif
}

}  // namespace dtrain::device
