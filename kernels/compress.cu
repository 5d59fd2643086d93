// Top-k selection, sparse accumulation and Gram-Schmidt for gradient compression
// (kernels/compress.cuh). Top-k: a key per element (|x|'s bits, NaN as +inf's) orders
// magnitudes as unsigned integers; four histogram passes of 8 bits find the k-th largest
// key T and how many elements equal to T are taken (the lowest indices); a count pass per
// tile, one scan of the tile counts, and an ordered write per tile (one warp, ballots in
// index order) emit the picked elements with their indices ascending, as the CPU does.
#include "kernels/compress.cuh"

#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int kTile = 4096;  // elements per tile of the count and write passes
constexpr unsigned kInfKey = 0x7f800000u;

__device__ __forceinline__ unsigned mag_key(float x) {
  const unsigned u = __float_as_uint(x) & 0x7fffffffu;
  return u > kInfKey ? kInfKey : u;  // NaN counts as +inf, as ops::topk_select's
}

// The selection's state between passes: keys matching `prefix` under `mask` are the
// candidates, `need` of them are still to be taken from the top.
struct SelectState {
  unsigned prefix, mask, need;
};

__global__ void select_init_kernel(SelectState* st, unsigned* hist, unsigned need) {
  for (int i = threadIdx.x; i < 4 * 256; i += blockDim.x) hist[i] = 0;
  if (threadIdx.x == 0) *st = {0u, 0u, need};
}

__global__ void select_hist_kernel(const float* __restrict__ x, size_t n, const SelectState* st, unsigned* hist,
                                   int shift) {
  __shared__ unsigned local[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
  __syncthreads();
  const SelectState s = *st;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const unsigned key = mag_key(x[i]);
    if ((key & s.mask) == s.prefix) atomicAdd(&local[(key >> shift) & 255u], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    if (local[i]) atomicAdd(&hist[i], local[i]);
}

// One thread: the bin holding the need-th largest candidate narrows the prefix.
__global__ void select_pick_kernel(SelectState* st, const unsigned* hist, int shift) {
  SelectState s = *st;
  unsigned above = 0;
  for (int b = 255; b >= 0; --b) {
    if (above + hist[b] >= s.need) {
      s.prefix |= static_cast<unsigned>(b) << shift;
      s.mask |= 255u << shift;
      s.need -= above;
      break;
    }
    above += hist[b];
  }
  *st = s;
}

// Per tile: how many keys are above T and how many equal it.
__global__ void select_count_kernel(const float* __restrict__ x, size_t n, const SelectState* st, unsigned* above,
                                    unsigned* ties) {
  const unsigned T = st->prefix;
  const size_t lo = static_cast<size_t>(blockIdx.x) * kTile, hi = n < lo + kTile ? n : lo + kTile;
  unsigned a = 0, t = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const unsigned key = mag_key(x[i]);
    a += key > T;
    t += key == T;
  }
  // Counts up to kTile: exact in fp32, block_sum's type.
  a = static_cast<unsigned>(block_sum(static_cast<float>(a)));
  t = static_cast<unsigned>(block_sum(static_cast<float>(t)));
  if (threadIdx.x == 0) {
    above[blockIdx.x] = a;
    ties[blockIdx.x] = t;
  }
}

// One thread: each tile's first output slot and first tie rank (exclusive scans).
__global__ void select_scan_kernel(const SelectState* st, unsigned* above, unsigned* ties, unsigned tiles) {
  const unsigned need = st->need;
  unsigned out = 0, tie = 0;
  for (unsigned b = 0; b < tiles; ++b) {
    const unsigned a = above[b], t = ties[b];
    const unsigned taken = tie >= need ? 0u : min(t, need - tie);
    above[b] = out;  // now: the tile's first output slot
    ties[b] = tie;   // now: the tie rank of the tile's first tie
    out += a + taken;
    tie += t;
  }
}

// One warp per tile, 32 elements at a time in index order: a ballot orders the picks.
__global__ void select_write_kernel(float* __restrict__ x, size_t n, const SelectState* st, const unsigned* out0,
                                    const unsigned* tie0, float* __restrict__ values, int32_t* __restrict__ indices) {
  const unsigned T = st->prefix, need = st->need;
  const unsigned lane = threadIdx.x;
  const unsigned lt = (1u << lane) - 1u;
  const size_t lo = static_cast<size_t>(blockIdx.x) * kTile, hi = n < lo + kTile ? n : lo + kTile;
  unsigned out = out0[blockIdx.x], tie = tie0[blockIdx.x];
  for (size_t base = lo; base < hi; base += 32) {
    const size_t i = base + lane;
    const unsigned key = i < hi ? mag_key(x[i]) : 0u;
    const bool is_tie = i < hi && key == T;
    const unsigned tie_mask = __ballot_sync(0xffffffffu, is_tie);
    const bool pick = i < hi && (key > T || (is_tie && tie + __popc(tie_mask & lt) < need));
    const unsigned pick_mask = __ballot_sync(0xffffffffu, pick);
    if (pick) {
      const unsigned at = out + __popc(pick_mask & lt);
      values[at] = x[i];
      indices[at] = static_cast<int32_t>(i);
      x[i] = 0.0f;
    }
    out += __popc(pick_mask);
    tie += __popc(tie_mask);
  }
}

__global__ void sparse_add_kernel(float* __restrict__ dense, const float* __restrict__ values,
                                  const int32_t* __restrict__ indices, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dense[indices[i]] += values[i];
}

__global__ void orthogonalize_kernel(float* __restrict__ a, size_t rows, size_t cols) {
  for (size_t i = 0; i < cols; ++i) {
    double sq = 0.0;
    for (size_t r = threadIdx.x; r < rows; r += blockDim.x)
      sq += static_cast<double>(a[r * cols + i]) * a[r * cols + i];
    const double norm = sqrt(block_sum(sq));
    if (norm > 0.0)
      for (size_t r = threadIdx.x; r < rows; r += blockDim.x)
        a[r * cols + i] = static_cast<float>(a[r * cols + i] / norm);
    __syncthreads();  // column i is final before the dot products read it
    for (size_t j = i + 1; j < cols; ++j) {
      double dot = 0.0;
      for (size_t r = threadIdx.x; r < rows; r += blockDim.x)
        dot += static_cast<double>(a[r * cols + i]) * a[r * cols + j];
      dot = block_sum(dot);
      for (size_t r = threadIdx.x; r < rows; r += blockDim.x)
        a[r * cols + j] -= static_cast<float>(dot * a[r * cols + i]);
    }
    __syncthreads();  // the next column's norm reads what this one's projections wrote
  }
}

}  // namespace

void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices, cudaStream_t stream) {
  DTK_REQUIRE(k <= n && n < (size_t{1} << 31), UsageError, "topk_select: k elements of n < 2^31");
  if (k == 0) return;
  const auto tiles = static_cast<unsigned>((n + kTile - 1) / kTile);
  Scratch state(sizeof(SelectState) + (4 * 256 + 2 * static_cast<size_t>(tiles)) * sizeof(unsigned), stream);
  auto* st = state.as<SelectState>();
  unsigned* hist = reinterpret_cast<unsigned*>(st + 1);
  unsigned* above = hist + 4 * 256;
  unsigned* ties = above + tiles;
  DTK_LAUNCH(1, 256, 0, stream, select_init_kernel)(st, hist, static_cast<unsigned>(k));
  DT_CUDA_LAUNCH_CHECK();
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    DTK_LAUNCH(grid_for(n, 256, 1024), 256, 0, stream, select_hist_kernel)(residual, n, st, hist + 256 * pass, shift);
    DT_CUDA_LAUNCH_CHECK();
    DTK_LAUNCH(1, 1, 0, stream, select_pick_kernel)(st, hist + 256 * pass, shift);
    DT_CUDA_LAUNCH_CHECK();
  }
  DTK_LAUNCH(tiles, 256, 0, stream, select_count_kernel)(residual, n, st, above, ties);
  DT_CUDA_LAUNCH_CHECK();
  DTK_LAUNCH(1, 1, 0, stream, select_scan_kernel)(st, above, ties, tiles);
  DT_CUDA_LAUNCH_CHECK();
  DTK_LAUNCH(tiles, 32, 0, stream, select_write_kernel)(residual, n, st, above, ties, values, indices);
  DT_CUDA_LAUNCH_CHECK();
}

void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  DTK_LAUNCH(grid_for(count, 256), 256, 0, stream, sparse_add_kernel)(dense, values, indices, count);
  DT_CUDA_LAUNCH_CHECK();
}

void orthogonalize_columns(float* a, size_t rows, size_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  DTK_LAUNCH(1, 256, 0, stream, orthogonalize_kernel)(a, rows, cols);
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dtrain::kernels
