// The device layer: a runtime (runtime.h: memory, streams, events, copies, graphs) and an
// op table (op_table.h: every model op) in one object, with two implementations, the CPU
// (lib/ops over OpenBLAS, fp32) and CUDA (kernels/ and cuBLASLt on one compute stream per
// device, fp32/bf16/fp16 activations), each a runtime class and an ops class derived
// from it (cpu_runtime.h + cpu_device.cpp, cuda_rt.h + cuda_device.cpp; the plan device
// likewise). The model is written once over it.
#pragma once

#include "device/kind.h"
#include "device/op_table.h"
#include "device/runtime.h"

#include <cstddef>
#include <memory>
#include <string>

namespace dtrain::device {

/// A device: its runtime and its op table. Ops are issued on the runtime's current
/// stream (use_stream).
class Device : public Runtime, public OpTable {
 protected:
  Device() = default;
};

/// The process's CPU device.
Device& cpu();

/// A CUDA device: `index` into the devices this process sees (CUDA_VISIBLE_DEVICES),
/// with its own non-blocking compute stream. DeviceError when this build has no CUDA,
/// no device is visible or the index is out of range.
std::unique_ptr<Device> cuda_create(int index);

/// Where CUDA devices remember the GEMM algorithms they timed (kernels/gemm.cuh) when
/// $DTRAIN_GEMM_ALGO_CACHE does not say: a training rank passes <run dir>/gemm_algos.txt.
/// Call before the first GEMM; nothing in a CPU-only build.
void cuda_gemm_algo_cache_default(const std::string& path);

/// CUDA devices this process sees (0 in a CPU-only build or without a GPU): the one GPU count (discovery.cpp).
int cuda_count();

/// Global memory of the smallest CUDA device this process sees, in bytes (0 without one).
size_t cuda_memory_bytes();

/// Throws DeviceError saying why CUDA device `index` cannot be used: a CPU-only build
/// ("built without CUDA"), no device visible ("no CUDA device"), or an index out of range.
void cuda_require(int index);

/// Which attention forward CUDA device `index` runs at head dim HD and dtype
/// (kernels::attention_forward_kernels, for reports): `variant` what runs ("legacy", "fa2",
/// "hopper": the sm_90a forward with fa2's backward; "cuda-core" for fp32), `requested` what
/// $DTRAIN_ATTN_VARIANT asks ("legacy" when unset; "-" for fp32), and `fallback` why the hopper
/// forward does not run there when it was asked for (fa2's runs instead), else empty. Makes
/// device `index` current on this thread, as its ops do. DeviceError as cuda_require.
struct CudaAttnKernels {
  std::string variant, requested, fallback;
};
CudaAttnKernels cuda_attention_kernels(int index, int HD, DType dtype);

}  // namespace dtrain::device
