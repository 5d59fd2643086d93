// rank_reduce: one grid-stride pass; each thread loads its element from every input in
// rank order and accumulates in fp32 (fp32 inputs: in fp32 as well), so no element's
// result depends on the launch shape or on the order blocks run in. stream_delay: one
// thread's bounded spin on the nanosecond timer.
#include "kernels/collective.cuh"

#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int RANK_REDUCE_THREADS = 256;

struct RankInputs {
  const void* p[RANK_REDUCE_MAX_INPUTS];
};

// out is not __restrict__: it may be one of the inputs (in-place forms).
template <typename T, RankReduceOp OP>
__global__ void rank_reduce_kernel(T* out, RankInputs in, int n, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float acc = to_f32(static_cast<const T*>(in.p[0])[i]);
    for (int r = 1; r < n; ++r) {
      const float v = to_f32(static_cast<const T*>(in.p[r])[i]);
      if constexpr (OP == RankReduceOp::MAX) acc = v > acc ? v : acc;
      else acc += v;
    }
    if constexpr (OP == RankReduceOp::AVG) acc = acc / static_cast<float>(n);
    out[i] = from_f32<T>(acc);
  }
}

template <typename T, RankReduceOp OP>
void rank_reduce_launch(void* out, const RankInputs& in, int n, size_t count, cudaStream_t stream) {
  DTK_LAUNCH(grid_for(count, RANK_REDUCE_THREADS), RANK_REDUCE_THREADS, 0, stream, rank_reduce_kernel<T, OP>)
  (static_cast<T*>(out), in, n, count);
  DT_CUDA_LAUNCH_CHECK();
}

// At most ns + 1024 timer reads: each read takes at least a cycle, so the loop ends by
// the count if the timer ever stalls, and by the time otherwise.
__global__ void stream_delay_kernel(unsigned long long ns) {
#ifdef DTRAIN_CUDA_EMU
  volatile unsigned sink = 0;
  for (unsigned i = 0; i < 64; ++i) sink = sink + i;
  (void)ns;
#else
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (unsigned long long i = 0; i < ns + 1024; ++i) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 >= ns) break;
  }
#endif
}

}  // namespace

void stream_delay(long long ns, cudaStream_t stream) {
  DTK_REQUIRE(ns >= 0 && ns <= STREAM_DELAY_MAX_NS, UsageError, "stream_delay: delay out of range");
  if (ns == 0) return;
  DTK_LAUNCH(1, 1, 0, stream, stream_delay_kernel)(static_cast<unsigned long long>(ns));
  DT_CUDA_LAUNCH_CHECK();
}

void rank_reduce(void* out, const void* const* inputs, int n, size_t count, DType dtype, RankReduceOp op,
                 cudaStream_t stream) {
  DTK_REQUIRE(n >= 1 && n <= RANK_REDUCE_MAX_INPUTS, UsageError, "rank_reduce: input count out of range");
  if (count == 0) return;
  RankInputs in{};
  for (int r = 0; r < n; ++r) in.p[r] = inputs[r];
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case RankReduceOp::SUM: return rank_reduce_launch<T, RankReduceOp::SUM>(out, in, n, count, stream);
      case RankReduceOp::AVG: return rank_reduce_launch<T, RankReduceOp::AVG>(out, in, n, count, stream);
      case RankReduceOp::MAX: return rank_reduce_launch<T, RankReduceOp::MAX>(out, in, n, count, stream);
    }
  });
}

}  // namespace dtrain::kernels
