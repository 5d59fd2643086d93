// CUDA execution engine (test-only): cuTensorMapEncodeTiled, the driver's tensor-map
// encoder (cuda.h), with the requirements its documentation lists checked as the driver
// does (CUDA_ERROR_INVALID_VALUE). The map's 128 bytes hold the engine's TensorMapDesc
// (kernel_hopper_internal.h), read by the cp.async.bulk.tensor model (kernel_hopper.cpp).
// Modelled: tile mode, ranks 1-5, 1-, 2-, 4- and 8-byte element types, no interleave,
// swizzle none or 128B, element strides 1, zero fill out of bounds. Anything else the driver
// accepts returns CUDA_ERROR_NOT_SUPPORTED and says so on stderr (never a silent success),
// as does a device profile below compute capability 9.0 (tensor maps are sm_90 and later).
#include "device_profile.h"
#include "kernel_hopper_internal.h"

#include <cuda.h>

#include <cstdio>
#include <cstring>

namespace cuda_emu {

namespace {

int elem_size(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ: return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return 8;
  }
  return 0;
}

CUresult unsupported(const char* what) {
  std::fprintf(stderr, "cuda_emu: cuTensorMapEncodeTiled: %s is not modelled by the engine\n", what);
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

const TensorMapDesc* tensor_map_decode(const void* map) {
  const auto* d = static_cast<const TensorMapDesc*>(map);
  if (reinterpret_cast<uintptr_t>(map) % 64 != 0 || d->tag != TensorMapDesc::TAG || d->rank < 1 || d->rank > 5)
    return nullptr;
  return d;
}

}  // namespace cuda_emu

CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                const cuuint64_t* dim, const cuuint64_t* strides, const cuuint32_t* box,
                                const cuuint32_t* estrides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  using cuda_emu::TensorMapDesc;
  const cuda_emu::rt::DeviceProfile* p = cuda_emu::rt::device_profile();
  if (!p || p->major < 9) return cuda_emu::unsupported("a tensor map on a device below compute capability 9.0");
  // The documented requirements.
  const int es = cuda_emu::elem_size(type);
  if (!map || reinterpret_cast<uintptr_t>(map) % 64 != 0 || es == 0 || rank == 0 || rank > 5 || !addr || !dim ||
      (rank > 1 && !strides) || !box || !estrides || reinterpret_cast<uintptr_t>(addr) % 16 != 0 ||
      static_cast<unsigned>(l2) > 3 || static_cast<unsigned>(oob) > 1 || static_cast<unsigned>(interleave) > 2)
    return CUDA_ERROR_INVALID_VALUE;
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3) return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t d = 0; d < rank; ++d) {
    if (dim[d] == 0 || dim[d] > (1ull << 32) || box[d] == 0 || box[d] > 256 || estrides[d] == 0 || estrides[d] > 8)
      return CUDA_ERROR_INVALID_VALUE;
    if (d + 1 < rank && (strides[d] % 16 != 0 || strides[d] >= (1ull << 40))) return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t inner = static_cast<uint64_t>(box[0]) * static_cast<uint64_t>(es);
  if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && inner % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
  const unsigned span[] = {0, 32, 64, 128};
  if (static_cast<unsigned>(swizzle) > 3) return cuda_emu::unsupported("a 128B swizzle with 32B or 64B atoms");
  if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_NONE &&
      inner > span[static_cast<unsigned>(swizzle)])
    return CUDA_ERROR_INVALID_VALUE;
  // What the engine models.
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return cuda_emu::unsupported("an interleaved layout");
  if (swizzle == CU_TENSOR_MAP_SWIZZLE_32B || swizzle == CU_TENSOR_MAP_SWIZZLE_64B)
    return cuda_emu::unsupported("the 32B and 64B swizzles");
  if (oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) return cuda_emu::unsupported("the NaN out-of-bounds fill");
  for (cuuint32_t d = 1; d < rank; ++d)
    if (estrides[d] != 1) return cuda_emu::unsupported("an element stride other than 1");
  TensorMapDesc t{};
  t.tag = TensorMapDesc::TAG;
  t.addr = reinterpret_cast<uintptr_t>(addr);
  t.rank = static_cast<uint8_t>(rank);
  t.elem_bytes = static_cast<uint8_t>(es);
  t.swizzle = static_cast<uint8_t>(swizzle);
  t.stride[0] = static_cast<uint64_t>(es);
  for (cuuint32_t d = 0; d < rank; ++d) {
    t.dim[d] = dim[d];
    t.box[d] = static_cast<uint16_t>(box[d]);
    if (d >= 1) t.stride[d] = strides[d - 1];
  }
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &t, sizeof t);
  return CUDA_SUCCESS;
}
