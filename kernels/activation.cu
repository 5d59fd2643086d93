// One generic pointwise kernel (NIN inputs, NOUT outputs, overwrite or accumulate) with
// a functor per op; the vector path moves 16 bytes per tensor per thread step.
#include "kernels/activation.cuh"

#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr float GELU_K = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float GELU_C = 0.044715f;

// The tensors of one pointwise op. With rows (cols > 0), element i lies at row i / cols,
// column i % cols, and each tensor's rows are its ld apart (a column block of a wider array).
template <int NIN, int NOUT>
struct Io {
  const void* in[NIN];
  void* out[NOUT];
  size_t cols = 0;  // 0: every tensor dense
  size_t ld_in[NIN] = {}, ld_out[NOUT] = {};
};

template <bool ROWS>
__device__ __forceinline__ size_t at(size_t i, size_t cols, size_t ld) {
  if constexpr (ROWS) return i / cols * ld + i % cols;
  return i;
}

template <typename T, int V, bool ACC, bool ROWS, int NIN, int NOUT, typename Op>
__global__ void pointwise_kernel(Io<NIN, NOUT> io, size_t n, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t npack = n / V;
  for (size_t p = tid; p < npack; p += stride) {
    const size_t i = p * V;  // a pack never straddles rows: cols % V == 0 on this path
    Pack<T, V> a[NIN], o[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; ++k)
      a[k] = pack_load<T, V>(static_cast<const T*>(io.in[k]) + at<ROWS>(i, io.cols, io.ld_in[k]));
    if constexpr (ACC) {
#pragma unroll
      for (int k = 0; k < NOUT; ++k)
        o[k] = pack_load<T, V>(static_cast<const T*>(io.out[k]) + at<ROWS>(i, io.cols, io.ld_out[k]));
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float x[NIN], y[NOUT];
#pragma unroll
      for (int k = 0; k < NIN; ++k) x[k] = to_f32(a[k].v[j]);
      op(x, y);
#pragma unroll
      for (int k = 0; k < NOUT; ++k) o[k].v[j] = from_f32<T>(ACC ? to_f32(o[k].v[j]) + y[k] : y[k]);
    }
#pragma unroll
    for (int k = 0; k < NOUT; ++k)
      pack_store<T, V>(static_cast<T*>(io.out[k]) + at<ROWS>(i, io.cols, io.ld_out[k]), o[k]);
  }
  for (size_t i = npack * V + tid; i < n; i += stride) {
    float x[NIN], y[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = to_f32(static_cast<const T*>(io.in[k])[at<ROWS>(i, io.cols, io.ld_in[k])]);
    op(x, y);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) {
      T* out = static_cast<T*>(io.out[k]) + at<ROWS>(i, io.cols, io.ld_out[k]);
      *out = from_f32<T>(ACC ? to_f32(*out) + y[k] : y[k]);
    }
  }
}

template <bool ACC, bool ROWS, int NIN, int NOUT, typename Op>
void pointwise_dispatch(const Io<NIN, NOUT>& io, size_t n, bool vec, DType dtype, Op op, cudaStream_t stream) {
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = VEC16<T>;
    bool v = vec;
    if constexpr (ROWS) {  // packs stay inside a row and 16-byte aligned in every row
      v = v && io.cols % V == 0;
      for (int k = 0; k < NIN; ++k) v = v && io.ld_in[k] % V == 0;
      for (int k = 0; k < NOUT; ++k) v = v && io.ld_out[k] % V == 0;
    }
    if (v) {
      DTK_LAUNCH(grid_for(n / V + 1, 256), 256, 0, stream, pointwise_kernel<T, V, ACC, ROWS, NIN, NOUT, Op>)
      (io, n, op);
    } else {
      DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, pointwise_kernel<T, 1, ACC, ROWS, NIN, NOUT, Op>)(io, n, op);
    }
    DT_CUDA_LAUNCH_CHECK();
  });
}

// n elements; with io.cols > 0, n / cols rows (a tensor whose ld equals cols is dense).
template <bool ACC, int NIN, int NOUT, typename Op>
void pointwise_launch(Io<NIN, NOUT> io, size_t n, DType dtype, Op op, cudaStream_t stream) {
  if (n == 0) return;
  bool vec = true, rows = false;
  for (int k = 0; k < NIN; ++k) vec = vec && aligned16(io.in[k]);
  for (int k = 0; k < NOUT; ++k) vec = vec && aligned16(io.out[k]);
  if (io.cols > 0) {
    for (int k = 0; k < NIN; ++k) rows = rows || io.ld_in[k] != io.cols;
    for (int k = 0; k < NOUT; ++k) rows = rows || io.ld_out[k] != io.cols;
  }
  if (rows) pointwise_dispatch<ACC, true>(io, n, vec, dtype, op, stream);
  else pointwise_dispatch<ACC, false>(io, n, vec, dtype, op, stream);
}

// ----------------------------------------------------------------------------
struct GeluFwd {
  __device__ void operator()(const float* x, float* y) const {
    const float v = x[0];
    y[0] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_C * v * v * v)));
  }
};
struct GeluBwd {  // x = {inp, dout}
  __device__ void operator()(const float* x, float* y) const {
    const float v = x[0];
    const float th = tanhf(GELU_K * (v + GELU_C * v * v * v));
    const float sech2 = 1.0f - th * th;
    const float g = 0.5f * (1.0f + th) + 0.5f * v * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * v * v);
    y[0] = g * x[1];
  }
};
struct SwigluFwd {  // x = {gate, up}
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] / (1.0f + expf(-x[0])) * x[1]; }
};
struct SwigluBwd {  // x = {dout, gate, up}; y = {dgate, dup}
  __device__ void operator()(const float* x, float* y) const {
    const float g = x[1];
    const float s = 1.0f / (1.0f + expf(-g));
    y[0] = x[0] * x[2] * s * (1.0f + g * (1.0f - s));
    y[1] = x[0] * (g * s);
  }
};
struct AddFwd {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] + x[1]; }
};
struct AddBwd {
  __device__ void operator()(const float* x, float* y) const {
    y[0] = x[0];
    y[1] = x[0];
  }
};
}  // namespace

void gelu_forward(void* out, const void* inp, size_t n, DType dtype, cudaStream_t stream) {
  pointwise_launch<false>(Io<1, 1>{{inp}, {out}}, n, dtype, GeluFwd{}, stream);
}
void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dtype, cudaStream_t stream) {
  pointwise_launch<false>(Io<2, 1>{{inp, dout}, {dinp}}, n, dtype, GeluBwd{}, stream);
}
void swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld, DType dtype,
                    cudaStream_t stream) {
  DTK_REQUIRE(ld >= cols, UsageError, "swiglu: the input row pitch is below the row width");
  pointwise_launch<false>(Io<2, 1>{{gate, up}, {out}, cols, {ld, ld}, {cols}}, rows * cols, dtype, SwigluFwd{}, stream);
}
void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, size_t rows,
                     size_t cols, size_t ld, DType dtype, cudaStream_t stream) {
  DTK_REQUIRE(ld >= cols, UsageError, "swiglu: the input row pitch is below the row width");
  pointwise_launch<false>(Io<3, 2>{{dout, gate, up}, {dgate, dup}, cols, {cols, ld, ld}, {ld, ld}}, rows * cols, dtype,
                          SwigluBwd{}, stream);
}
void residual_forward(void* out, const void* a, const void* b, size_t n, DType dtype, cudaStream_t stream) {
  pointwise_launch<false>(Io<2, 1>{{a, b}, {out}}, n, dtype, AddFwd{}, stream);
}
void residual_backward(void* da, void* db, const void* dout, size_t n, DType dtype, cudaStream_t stream) {
  pointwise_launch<true>(Io<1, 2>{{dout}, {da, db}}, n, dtype, AddBwd{}, stream);
}

}  // namespace dtrain::kernels
