// RoPE: a table kernel forms cos/sin of t * inv_freq in double and rounds once to fp32
// (bit-compatible with the CPU reference's table), then the apply kernel rotates
// packs of the first half against the matching packs of the second half. The table is
// built per call, or once by the caller (rope_table) and passed to the *_table entries.
#include "kernels/rope.cuh"

#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

__global__ void rope_table_kernel(float2* __restrict__ table, int T, int half, int HD, ops::RopeFreq rope) {
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(T) * half) return;
  const int t = static_cast<int>(idx / half), i = static_cast<int>(idx % half);
  const double inv_freq = ops::rope_inv_freq(rope, i, HD);
  double s, c;
  sincos(t * inv_freq, &s, &c);
  table[idx] = make_float2(static_cast<float>(c), static_cast<float>(s));
}

// One thread per (row, head, pack of V pair indices); row n's position is n % T_, less its
// document's start with packed documents (ds). Row n starts at x + n * pitch.
template <typename T, int V>
__global__ void rope_apply_kernel(T* __restrict__ x, const float2* __restrict__ table, const int32_t* __restrict__ ds,
                                  int rows, int T_, int H, int half, size_t pitch, float sign) {
  const int packs = half / V;
  const size_t total = static_cast<size_t>(rows) * H * packs;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int p = static_cast<int>(idx % packs);
    const size_t rh = idx / packs;  // row * H + head
    const size_t n = rh / H;
    const int t = static_cast<int>(n % T_) - (ds != nullptr ? ds[n] : 0);
    T* v = x + n * pitch + (rh - n * H) * (2 * half) + static_cast<size_t>(p) * V;
    Pack<T, V> a = pack_load<T, V>(v), b = pack_load<T, V>(v + half);
    const float2* cs = table + static_cast<size_t>(t) * half + static_cast<size_t>(p) * V;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float x1 = to_f32(a.v[j]), x2 = to_f32(b.v[j]);
      const float c = cs[j].x, s = sign * cs[j].y;
      a.v[j] = from_f32<T>(x1 * c - x2 * s);
      b.v[j] = from_f32<T>(x2 * c + x1 * s);
    }
    pack_store<T, V>(v, a);
    pack_store<T, V>(v + half, b);
  }
}

template <typename T>
void rope_apply(void* x, const float2* table, const int32_t* ds, int rows, int T_, int H, int half, size_t pitch,
                float sign, cudaStream_t stream) {
  constexpr int V = VEC16<T>;
  const size_t pairs = static_cast<size_t>(rows) * H * half;
  if (half % V == 0 && pitch % V == 0 && aligned16(x)) {
    DTK_LAUNCH(grid_for(pairs / V, 256), 256, 0, stream, rope_apply_kernel<T, V>)
    (static_cast<T*>(x), table, ds, rows, T_, H, half, pitch, sign);
  } else {
    DTK_LAUNCH(grid_for(pairs, 256), 256, 0, stream, rope_apply_kernel<T, 1>)
    (static_cast<T*>(x), table, ds, rows, T_, H, half, pitch, sign);
  }
  DT_CUDA_LAUNCH_CHECK();
}

void table_build(float2* table, int T, int HD, const ops::RopeFreq& rope, cudaStream_t stream) {
  const int half = HD / 2;
  DTK_LAUNCH(blocks_for(static_cast<size_t>(T) * half, 256), 256, 0, stream, rope_table_kernel)
  (table, T, half, HD, rope);
  DT_CUDA_LAUNCH_CHECK();
}

// Row pitches of q and k (0: dense).
struct Strides {
  int q = 0, kv = 0;
};

void rope_run(void* q, void* k, int B, int T, int NH, int NKV, int HD, const float2* table, DType dtype, float sign,
              cudaStream_t stream, const int32_t* ds, Strides st) {
  const int half = HD / 2;
  const size_t qs = st.q > 0 ? static_cast<size_t>(st.q) : static_cast<size_t>(NH) * HD;
  const size_t ks = st.kv > 0 ? static_cast<size_t>(st.kv) : static_cast<size_t>(NKV) * HD;
  DTK_REQUIRE(qs >= static_cast<size_t>(NH) * HD && (k == nullptr || ks >= static_cast<size_t>(NKV) * HD), UsageError,
              "rope: a row stride is below the row's heads");
  dispatch(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    rope_apply<Ty>(q, table, ds, B * T, T, NH, half, qs, sign, stream);
    if (k) rope_apply<Ty>(k, table, ds, B * T, T, NKV, half, ks, sign, stream);
  });
}

// A table for this call only (rope_forward / rope_backward without one).
void rope_run(void* q, void* k, int B, int T, int NH, int NKV, int HD, const ops::RopeFreq& rope, DType dtype,
              float sign, cudaStream_t stream, const int32_t* ds, Strides st) {
  DTK_REQUIRE(HD > 0 && HD % 2 == 0, UsageError, "rope needs an even head dimension");
  if (B <= 0 || T <= 0) return;
  Scratch table(rope_table_bytes(T, HD), stream);
  table_build(table.as<float2>(), T, HD, rope, stream);
  rope_run(q, k, B, T, NH, NKV, HD, table.as<float2>(), dtype, sign, stream, ds, st);
}
}  // namespace

size_t rope_table_bytes(int T, int HD) { return static_cast<size_t>(T) * (HD / 2) * sizeof(float2); }

void rope_table(void* table, int T, int HD, const ops::RopeFreq& rope, cudaStream_t stream) {
  DTK_REQUIRE(HD > 0 && HD % 2 == 0, UsageError, "rope needs an even head dimension");
  if (T <= 0) return;
  table_build(static_cast<float2*>(table), T, HD, rope, stream);
}

void rope_forward_table(void* q, void* k, int B, int T, int NH, int NKV, int HD, const void* table, DType dtype,
                        cudaStream_t stream, const int32_t* doc_start, int q_stride, int kv_stride) {
  DTK_REQUIRE(HD > 0 && HD % 2 == 0, UsageError, "rope needs an even head dimension");
  if (B <= 0 || T <= 0) return;
  rope_run(q, k, B, T, NH, NKV, HD, static_cast<const float2*>(table), dtype, 1.0f, stream, doc_start,
           {q_stride, kv_stride});
}
void rope_backward_table(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, const void* table, DType dtype,
                         cudaStream_t stream, const int32_t* doc_start, int q_stride, int kv_stride) {
  DTK_REQUIRE(HD > 0 && HD % 2 == 0, UsageError, "rope needs an even head dimension");
  if (B <= 0 || T <= 0) return;
  rope_run(dq, dk, B, T, NH, NKV, HD, static_cast<const float2*>(table), dtype, -1.0f, stream, doc_start,
           {q_stride, kv_stride});
}

void rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, const ops::RopeFreq& rope, DType dtype,
                  cudaStream_t stream, const int32_t* doc_start, int q_stride, int kv_stride) {
  rope_run(q, k, B, T, NH, NKV, HD, rope, dtype, 1.0f, stream, doc_start, {q_stride, kv_stride});
}
void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, const ops::RopeFreq& rope, DType dtype,
                   cudaStream_t stream, const int32_t* doc_start, int q_stride, int kv_stride) {
  rope_run(dq, dk, B, T, NH, NKV, HD, rope, dtype, -1.0f, stream, doc_start, {q_stride, kv_stride});
}

}  // namespace dtrain::kernels
