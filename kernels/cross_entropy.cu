// Cross-entropy kernels. The row loop handles any row alignment (V is often odd, e.g.
// GPT-2's 50257, and rows may be packed): a scalar head up to the first 16-byte boundary
// (empty for the model's padded rows), 16-byte packs, a scalar tail.
//  - cross_entropy_onepass_kernel (the backward, whenever the row fits on chip): the block
//    loads its row once into registers (CE1_PACKS packs per thread) and, past those, its
//    dynamic shared memory; reduces max and sum-exp; writes dlogits from what it holds. The
//    logits are read once from memory, not twice.
//  - cross_entropy_kernel (the forward alone, and rows too long for the above): per-thread
//    online (max, sum-exp) pairs merged across the block, then a second read of the row for
//    dlogits.
#include "kernels/cross_entropy.cuh"

#include "kernels/common.cuh"
#include "ops/step_scale.h"

#include <atomic>

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int CE_THREADS = 512;

template <typename T>
__device__ __forceinline__ int row_head(const T* row, int V) {
  const int h = static_cast<int>(((16u - (reinterpret_cast<uintptr_t>(row) & 15u)) & 15u) / sizeof(T));
  return h < V ? h : V;
}

// f(i, x) for every element of the row, spread over the block's threads.
template <typename T, typename F>
__device__ __forceinline__ void row_visit(const T* row, int V, F&& f) {
  constexpr int VEC = VEC16<T>;
  const int head = row_head(row, V);
  for (int i = threadIdx.x; i < head; i += blockDim.x) f(i, to_f32(row[i]));
  const int nvec = (V - head) / VEC;
  for (int p = threadIdx.x; p < nvec; p += blockDim.x) {
    const Pack<T, VEC> pk = pack_load<T, VEC>(row + head + p * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) f(head + p * VEC + j, to_f32(pk.v[j]));
  }
  for (int i = head + nvec * VEC + threadIdx.x; i < V; i += blockDim.x) f(i, to_f32(row[i]));
}

// logits and dlogits may alias (no __restrict__).
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    cross_entropy_kernel(float* __restrict__ losses, T* dlogits, const T* logits, const int32_t* __restrict__ targets,
                         int V, int ld, float scale, const float* __restrict__ count, int32_t ignore_index) {
  if (count != nullptr) scale = ops::ce_backward_scale(scale, *count);
  const int n = blockIdx.x;
  const T* x = logits + static_cast<size_t>(n) * ld;
  T* d = dlogits ? dlogits + static_cast<size_t>(n) * ld : nullptr;
  const int32_t tgt = targets[n];
  const bool masked = tgt == ignore_index;
  const bool invalid = !masked && (tgt < 0 || tgt >= V);
  float m = -INFINITY, lse = 0.0f;  // lse: log(sum exp(x - m)) once reduced
  if (!masked && !invalid) {
    __shared__ float x_target;
    if (threadIdx.x == 0) x_target = to_f32(x[tgt]);  // read before any in-place write
    float s = 0.0f;
    row_visit(x, V, [&](int, float v) {
      if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
      } else if (m != -INFINITY) {  // v = m = -inf (masked vocabulary) adds exp(-inf) = 0, not NaN
        s += expf(v - m);
      }
    });
    const float M = block_max(m);
    const float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M));
    m = M;
    lse = logf(S);
    if (losses && threadIdx.x == 0) losses[n] = lse - (x_target - m);
  } else if (losses && threadIdx.x == 0) {
    losses[n] = invalid ? NAN : 0.0f;
  }
  if (!d) return;
  // dlogits: 0 for masked rows, NaN for invalid targets, else (p - onehot) * scale.
  auto grad = [&](int i, float v) -> float {
    if (masked) return 0.0f;
    if (invalid) return NAN;
    return (expf(v - m - lse) - (i == tgt ? 1.0f : 0.0f)) * scale;
  };
  constexpr int VEC = VEC16<T>;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) == (reinterpret_cast<uintptr_t>(d) & 15u)) {
    const int head = row_head(x, V);
    for (int i = threadIdx.x; i < head; i += blockDim.x) d[i] = from_f32<T>(grad(i, to_f32(x[i])));
    const int nvec = (V - head) / VEC;
    for (int p = threadIdx.x; p < nvec; p += blockDim.x) {
      const int i0 = head + p * VEC;
      Pack<T, VEC> pk = pack_load<T, VEC>(x + i0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) pk.v[j] = from_f32<T>(grad(i0 + j, to_f32(pk.v[j])));
      pack_store<T, VEC>(d + i0, pk);
    }
    for (int i = head + nvec * VEC + threadIdx.x; i < V; i += blockDim.x) d[i] = from_f32<T>(grad(i, to_f32(x[i])));
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) d[i] = from_f32<T>(grad(i, to_f32(x[i])));
  }
}

// ----------------------------------------------------------------------------
// The one-pass kernel. Pack p of a row (the 16-byte packs after the scalar head) belongs
// to thread p % blockDim.x as its slot p / blockDim.x: slots below CE1_PACKS are
// registers, slot CE1_PACKS + k is ce1_smem[k * blockDim.x + threadIdx.x] (`extra` slots).
// The head's and the tail's scalars (fewer than VEC each) belong to threads 0, 1, ...
constexpr int CE1_THREADS = 1024;  // the most threads a block has
constexpr int CE1_PACKS = 8;       // register packs per thread: 32 registers of the row

// The running (max m, sum s of exp(x - m)) with one more pack: the pack's max first, one
// rescale at most. A -inf value adds 0, also while m is -inf (a masked vocabulary); a NaN
// makes s NaN.
template <typename T, int N>
__device__ __forceinline__ void online_add(float& m, float& s, const Pack<T, N>& pk) {
  float pm = m;
#pragma unroll
  for (int j = 0; j < N; ++j) pm = fmaxf(pm, to_f32(pk.v[j]));
  if (pm > m) {
    s *= expf(m - pm);  // from m = -inf: s is 0 (or NaN) and stays so
    m = pm;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float v = to_f32(pk.v[j]);
    s += v == -INFINITY ? 0.0f : expf(v - m);
  }
}

// Hides a pack's value from the compiler: without it nvcc keeps the fp32 values the
// reduction unpacked from every pack alive until the write instead of unpacking them again,
// twice the registers for 16-bit types (spills at CE1_PACKS = 8).
template <typename T, int N>
__device__ __forceinline__ void pack_pin(Pack<T, N>& p) {
#ifdef __CUDA_ARCH__
  static_assert(sizeof(p) == 16, "a 16-byte pack");
  uint32_t* w = reinterpret_cast<uint32_t*>(&p);
  asm volatile("" : "+r"(w[0]), "+r"(w[1]), "+r"(w[2]), "+r"(w[3]));
#else
  (void)p;
#endif
}

// logits and dlogits may alias (no __restrict__): every read of the row comes before the
// block's first barrier, every write after its last. dlogits is not null.
template <typename T>
__global__ void __launch_bounds__(CE1_THREADS, 1)
    cross_entropy_onepass_kernel(float* __restrict__ losses, T* dlogits, const T* logits,
                                 const int32_t* __restrict__ targets, int V, int ld, float scale,
                                 const float* __restrict__ count, int32_t ignore_index, int extra) {
  constexpr int VEC = VEC16<T>;
  using P = Pack<T, VEC>;
  DTK_EXTERN_SHARED(float4, ce1_smem);
  P* spill = reinterpret_cast<P*>(ce1_smem) + threadIdx.x;  // this thread's slots, blockDim.x apart
  const int n = blockIdx.x, tid = threadIdx.x, bd = blockDim.x;
  const T* x = logits + static_cast<size_t>(n) * ld;
  T* d = dlogits + static_cast<size_t>(n) * ld;
  // d's packs line up with x's (the usual case: in place, or both rows 16-byte aligned),
  // else element stores.
  const bool same = ((reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(x)) & 15u) == 0;
  if (count != nullptr) scale = ops::ce_backward_scale(scale, *count);
  const int32_t tgt = targets[n];
  const bool masked = tgt == ignore_index;
  const bool plain = !masked && tgt >= 0 && tgt < V;  // else: masked, or an invalid target (NaN)
  const int head = row_head(x, V), npk = (V - head) / VEC, tail0 = head + npk * VEC;
  const int mine = npk - tid;  // slot k is this thread's when k * bd < mine
  // One scalar per thread at most: the head's (threads 0..head-1, head < VEC) or the
  // tail's (threads VEC..VEC+tail-1).
  const int si = tid < head ? tid : tid >= VEC && tid - VEC < V - tail0 ? tail0 + tid - VEC : -1;
  P r[CE1_PACKS] = {};
  Pack<T, 1> sv{};
  float m = -INFINITY, ml = 0.0f;  // ml: max + log(sum exp(x - max)) once reduced
  if (plain) {
    float x_target = 0.0f;
    if (tid == 0) x_target = to_f32(x[tgt]);  // before the barriers: in place, others then write
    const T* xp = x + head + tid * VEC;
#pragma unroll
    for (int k = 0; k < CE1_PACKS; ++k)
      if (k * bd < mine) r[k] = pack_load<T, VEC>(xp + k * bd * VEC);
    if (si >= 0) sv.v[0] = x[si];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CE1_PACKS; ++k)
      if (k * bd < mine) online_add(m, s, r[k]);
    for (int k = 0; k < extra; ++k)
      if ((CE1_PACKS + k) * bd < mine) {
        const P pk = pack_load<T, VEC>(xp + (CE1_PACKS + k) * bd * VEC);
        spill[k * bd] = pk;
        online_add(m, s, pk);
      }
    if (si >= 0) online_add(m, s, sv);
    const float M = block_max(m);
    const float S = block_sum(s == 0.0f ? 0.0f : s * expf(m - M));  // s = 0: nothing but -inf seen
    m = M;
    ml = M + logf(S);
    if (losses && tid == 0) losses[n] = ml - x_target;
  } else if (losses && tid == 0) {
    losses[n] = masked ? 0.0f : NAN;
  }
  // dlogits: (p - onehot) * scale, 0 for masked rows, NaN for an invalid target.
  const float fill = masked ? 0.0f : NAN;
  auto grad = [&](int i, float v) -> float { return plain ? (expf(v - ml) - (i == tgt ? 1.0f : 0.0f)) * scale : fill; };
  auto put = [&](int k, const P& in) {
    const int i0 = head + (k * bd + tid) * VEC;
    P o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = from_f32<T>(grad(i0 + j, to_f32(in.v[j])));
    if (same) {
      pack_store<T, VEC>(d + i0, o);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) d[i0 + j] = o.v[j];
    }
  };
#pragma unroll
  for (int k = 0; k < CE1_PACKS; ++k)
    if (k * bd < mine) {
      pack_pin(r[k]);
      put(k, r[k]);
    }
  for (int k = 0; k < extra; ++k)
    if ((CE1_PACKS + k) * bd < mine) put(CE1_PACKS + k, plain ? spill[k * bd] : P{});
  if (si >= 0) d[si] = from_f32<T>(grad(si, to_f32(sv.v[0])));
}

__global__ void loss_mean_kernel(float* __restrict__ mean, const float* __restrict__ losses,
                                 const int32_t* __restrict__ targets, int N, int32_t ignore_index) {
  double s = 0.0, c = 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    if (targets[n] == ignore_index) continue;
    s += losses[n];
    c += 1.0;
  }
  s = block_sum(s);
  c = block_sum(c);
  if (threadIdx.x == 0) *mean = c > 0.0 ? static_cast<float>(s / c) : 0.0f;
}

// The current device's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin),
// read once per device.
size_t smem_optin() { return static_cast<size_t>(device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>()); }

// The one-pass kernel's block for rows of V elements of `elem` bytes under `optin` bytes of
// shared memory per block: threads (0 = the row does not fit: two passes), the shared-memory
// slots per thread past the registers, and their bytes. The packs counted are those of a row
// without a scalar head (the most any row has). lib/device/cuda_costs.cpp's
// PlanDevice::cross_entropy makes the same choice.
struct OnePass {
  unsigned threads = 0;
  int extra = 0;
  size_t smem = 0;
};
constexpr size_t CE1_STATIC_SMEM = 1024;  // block_max's and block_sum's partials, and room to spare
OnePass onepass_shape(int V, size_t elem, size_t optin) {
  const size_t npk = static_cast<size_t>(V) / (16 / elem), in_regs = static_cast<size_t>(CE1_PACKS) * CE1_THREADS;
  if (npk <= in_regs) {
    const size_t warps = (npk + CE1_PACKS * 32 - 1) / (CE1_PACKS * 32);
    return {static_cast<unsigned>(32 * (warps > 0 ? warps : 1)), 0, 0};
  }
  const size_t extra = (npk - in_regs + CE1_THREADS - 1) / CE1_THREADS, bytes = extra * CE1_THREADS * 16;
  if (bytes + CE1_STATIC_SMEM > optin) return {};
  return {CE1_THREADS, static_cast<int>(extra), bytes};
}
}  // namespace

int cross_entropy_onepass_max_vocab(DType dtype) {
  const size_t optin = smem_optin(), vec = 16 / dtype_size(dtype);
  const size_t slots = optin > CE1_STATIC_SMEM ? (optin - CE1_STATIC_SMEM) / (CE1_THREADS * 16) : 0;
  return static_cast<int>((CE1_PACKS + slots) * CE1_THREADS * vec + vec - 1);
}

void cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                    const int32_t* targets, int N, int V, int ld, float scale, int32_t ignore_index,
                                    DType dtype, cudaStream_t stream, const float* count) {
  DTK_REQUIRE(V > 0, UsageError, "cross-entropy needs a non-empty vocabulary");
  DTK_REQUIRE(ld >= V, UsageError, "cross-entropy: the logits' row pitch is below the vocabulary");
  if (N <= 0) {
    if (mean) DT_CUDA_CHECK(cudaMemsetAsync(mean, 0, sizeof(float), stream));
    return;
  }
  // The mean needs per-row losses: use a scratch row of losses when the caller has none.
  Scratch tmp(mean && !losses ? N * sizeof(float) : 0, stream);
  float* row_losses = losses ? losses : tmp.as<float>();
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const OnePass one = dlogits ? onepass_shape(V, sizeof(T), smem_optin()) : OnePass{};
    if (one.threads > 0) {
      if (one.smem > 48 * 1024)
        DT_CUDA_CHECK(cudaFuncSetAttribute(cross_entropy_onepass_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(one.smem)));
      DTK_LAUNCH(N, one.threads, one.smem, stream, cross_entropy_onepass_kernel<T>)
      (row_losses, static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, V, ld, scale, count, ignore_index,
       one.extra);
    } else {
      DTK_LAUNCH(N, CE_THREADS, 0, stream, cross_entropy_kernel<T>)
      (row_losses, static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, V, ld, scale, count, ignore_index);
    }
    DT_CUDA_LAUNCH_CHECK();
  });
  if (mean) {
    DTK_LAUNCH(1, 1024, 0, stream, loss_mean_kernel)(mean, row_losses, targets, N, ignore_index);
    DT_CUDA_LAUNCH_CHECK();
  }
}

void cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N, int V, int ld,
                           int32_t ignore_index, DType dtype, cudaStream_t stream) {
  cross_entropy_forward_backward(losses, mean, nullptr, logits, targets, N, V, ld, 1.0f, ignore_index, dtype, stream);
}

void cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                            float scale, int32_t ignore_index, DType dtype, cudaStream_t stream, const float* count) {
  cross_entropy_forward_backward(nullptr, nullptr, dlogits, logits, targets, N, V, ld, scale, ignore_index, dtype,
                                 stream, count);
}

}  // namespace dtrain::kernels
