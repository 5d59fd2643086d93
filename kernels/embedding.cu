// Embedding kernels. Backward is parallel over positions and deterministic without float
// atomics (llm.c's encoder backward idea): the positions are sorted by token id once per
// call (an LSD radix sort, 8 bits a pass, stable, so equal ids keep position order), then
// each (token run, channel) is summed by one thread in position order straight into its
// dwte element, the order the CPU reference adds in.
#include "kernels/embedding.cuh"

#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int SORT_CHUNK = 256;  // positions per radix-sort block (= threads = digit values)
constexpr int RADIX_BITS = 8;
constexpr int SCAN_THREADS = 1024;
constexpr int DWTE_THREADS = 128;

template <typename T, int V>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const T* __restrict__ wte, const T* __restrict__ wpe,
                                         const int32_t* __restrict__ ds, int N, int T_, int C, int Vocab) {
  const int packs = C / V;
  const size_t total = static_cast<size_t>(N) * packs;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int n = static_cast<int>(idx / packs);
    const size_t c = static_cast<size_t>(idx % packs) * V;
    const int tok = tokens[n];
    Pack<T, V> o;
    if (tok < 0 || tok >= Vocab) {
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = from_f32<T>(NAN);
    } else {
      o = pack_load<T, V>(wte + static_cast<size_t>(tok) * C + c);
      if (wpe) {
        const int t = n % T_ - (ds != nullptr ? ds[n] : 0);
        const Pack<T, V> p = pack_load<T, V>(wpe + static_cast<size_t>(t) * C + c);
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = from_f32<T>(to_f32(o.v[j]) + to_f32(p.v[j]));
      }
    }
    pack_store<T, V>(out + static_cast<size_t>(n) * C + c, o);
  }
}

// Sort keys: the token, or V for a token outside [0, V) (a run after every real row that
// backward skips: its forward row was NaN). Values: the positions.
__global__ void sort_init_kernel(uint32_t* __restrict__ keys, int32_t* __restrict__ pos,
                                 const int32_t* __restrict__ tokens, int N, int Vocab) {
  const int stride = gridDim.x * blockDim.x;
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
    const int32_t tok = tokens[n];
    keys[n] = tok >= 0 && tok < Vocab ? static_cast<uint32_t>(tok) : static_cast<uint32_t>(Vocab);
    pos[n] = n;
  }
}

// counts[d * chunks + chunk] = how many keys of the chunk have digit d (thread d counts).
__global__ void radix_count_kernel(int* __restrict__ counts, const uint32_t* __restrict__ keys, int N, int shift,
                                   int chunks) {
  __shared__ uint32_t digit[SORT_CHUNK];
  const int i = blockIdx.x * SORT_CHUNK + threadIdx.x;
  digit[threadIdx.x] = i < N ? (keys[i] >> shift) & (SORT_CHUNK - 1) : SORT_CHUNK;  // SORT_CHUNK: no key
  __syncthreads();
  int c = 0;
  for (int j = 0; j < SORT_CHUNK; ++j) c += digit[j] == threadIdx.x;
  counts[threadIdx.x * chunks + blockIdx.x] = c;
}

// In place exclusive prefix sum of n ints, one block: each thread scans a contiguous
// segment after a block scan of the segment totals.
__global__ void exclusive_scan_kernel(int* __restrict__ data, int n) {
  __shared__ int part[SCAN_THREADS];
  const int per = (n + SCAN_THREADS - 1) / SCAN_THREADS;
  const int b = min(n, static_cast<int>(threadIdx.x) * per), e = min(n, b + per);
  int s = 0;
  for (int i = b; i < e; ++i) s += data[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int off = 1; off < SCAN_THREADS; off <<= 1) {  // Hillis-Steele inclusive scan
    const int v = static_cast<int>(threadIdx.x) >= off ? part[threadIdx.x - off] : 0;
    __syncthreads();
    part[threadIdx.x] += v;
    __syncthreads();
  }
  int run = part[threadIdx.x] - s;
  for (int i = b; i < e; ++i) {
    const int c = data[i];
    data[i] = run;
    run += c;
  }
}

// Stable scatter of one pass: a key goes to its digit's offset for this chunk plus the
// number of keys before it in the chunk with the same digit.
__global__ void radix_scatter_kernel(uint32_t* __restrict__ keys_out, int32_t* __restrict__ pos_out,
                                     const uint32_t* __restrict__ keys, const int32_t* __restrict__ pos,
                                     const int* __restrict__ offsets, int N, int shift, int chunks) {
  __shared__ uint32_t digit[SORT_CHUNK];
  const int i = blockIdx.x * SORT_CHUNK + threadIdx.x;
  const uint32_t d = i < N ? (keys[i] >> shift) & (SORT_CHUNK - 1) : SORT_CHUNK;
  digit[threadIdx.x] = d;
  __syncthreads();
  if (i >= N) return;
  int rank = 0;
  for (int j = 0; j < static_cast<int>(threadIdx.x); ++j) rank += digit[j] == d;
  const int dst = offsets[d * chunks + blockIdx.x] + rank;
  keys_out[dst] = keys[i];
  pos_out[dst] = pos[i];
}

// Block x: sorted index x; when a run of one token starts there, its threads (one channel
// each, blockIdx.y slices C) add the run's dout rows in position order to dwte's row.
template <typename T>
__global__ void embedding_dwte_kernel(float* __restrict__ dwte, const T* __restrict__ dout,
                                      const uint32_t* __restrict__ keys, const int32_t* __restrict__ pos, int N, int C,
                                      int Vocab) {
  const int i = blockIdx.x;
  const uint32_t tok = keys[i];
  if (tok >= static_cast<uint32_t>(Vocab) || (i > 0 && keys[i - 1] == tok)) return;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* w = dwte + static_cast<size_t>(tok) * C + c;
  float acc = *w;
  for (int j = i; j < N && keys[j] == tok; ++j) acc += to_f32(dout[static_cast<size_t>(pos[j]) * C + c]);
  *w = acc;
}

// One thread per (position p, channel): the rows at position p, in row order. Without
// documents that is row t = p of every sequence. With them (ds), each document of a row
// holds position p at most once, at its start + p. The walk keeps t at or before the
// next uncounted document's position p: if the document holding t starts at t - p, t is
// it (add; the next document starts after t, so its position p is after t + p); if it
// starts later, its position p is ds[t] + p; if earlier, it was counted, and again the
// next one starts after t. Each step moves t by p + 1 at least or lands on a new
// document: O(T / (p + 1) + documents) per row.
template <typename T>
__global__ void embedding_dwpe_kernel(float* __restrict__ dwpe, const T* __restrict__ dout,
                                      const int32_t* __restrict__ ds, int B, int T_, int C) {
  const size_t total = static_cast<size_t>(T_) * C;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    float s = 0.0f;
    if (ds == nullptr) {
      for (int b = 0; b < B; ++b) s += to_f32(dout[static_cast<size_t>(b) * total + idx]);
    } else {
      const int p = static_cast<int>(idx / C);
      const size_t c = idx % C;
      for (int b = 0; b < B; ++b) {
        const int32_t* row = ds + static_cast<size_t>(b) * T_;
        for (int t = p; t < T_;) {
          const int start = row[t];
          if (start > t - p) {
            t = start + p;
            continue;
          }
          if (start == t - p) s += to_f32(dout[(static_cast<size_t>(b) * T_ + t) * C + c]);
          t += p + 1;
        }
      }
    }
    dwpe[idx] += s;
  }
}
}  // namespace

void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C, int V,
                       DType dtype, cudaStream_t stream, const int32_t* doc_start) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    constexpr int VEC = VEC16<Ty>;
    const bool vec = C % VEC == 0 && aligned16(out) && aligned16(wte) && (wpe == nullptr || aligned16(wpe));
    if (vec) {
      DTK_LAUNCH(grid_for(static_cast<size_t>(N) * C / VEC, 256), 256, 0, stream, embedding_forward_kernel<Ty, VEC>)
      (static_cast<Ty*>(out), tokens, static_cast<const Ty*>(wte), static_cast<const Ty*>(wpe), doc_start, N, T, C, V);
    } else {
      DTK_LAUNCH(grid_for(static_cast<size_t>(N) * C, 256), 256, 0, stream, embedding_forward_kernel<Ty, 1>)
      (static_cast<Ty*>(out), tokens, static_cast<const Ty*>(wte), static_cast<const Ty*>(wpe), doc_start, N, T, C, V);
    }
    DT_CUDA_LAUNCH_CHECK();
  });
}

void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C, int V,
                        DType dtype, cudaStream_t stream, const int32_t* doc_start) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  DTK_REQUIRE(V > 0, UsageError, "embedding backward needs a non-empty vocabulary");
  // Keys run to V (the invalid-token run): radix passes for its bit width, ping-ponging
  // between two key/position arrays.
  int passes = 0;
  for (uint32_t k = static_cast<uint32_t>(V); k != 0; k >>= RADIX_BITS) ++passes;
  const int chunks = static_cast<int>(blocks_for(static_cast<size_t>(N), SORT_CHUNK));
  const size_t n = static_cast<size_t>(N);
  Scratch scratch(4 * n * sizeof(uint32_t) + static_cast<size_t>(SORT_CHUNK) * chunks * sizeof(int), stream);
  uint32_t* keys[2] = {scratch.as<uint32_t>(), scratch.as<uint32_t>() + n};
  int32_t* pos[2] = {reinterpret_cast<int32_t*>(keys[1] + n), reinterpret_cast<int32_t*>(keys[1] + n) + n};
  int* counts = pos[1] + n;
  DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, sort_init_kernel)(keys[0], pos[0], tokens, N, V);
  DT_CUDA_LAUNCH_CHECK();
  for (int p = 0; p < passes; ++p) {
    const int in = p & 1, shift = p * RADIX_BITS;
    DTK_LAUNCH(chunks, SORT_CHUNK, 0, stream, radix_count_kernel)(counts, keys[in], N, shift, chunks);
    DT_CUDA_LAUNCH_CHECK();
    DTK_LAUNCH(1, SCAN_THREADS, 0, stream, exclusive_scan_kernel)(counts, SORT_CHUNK * chunks);
    DT_CUDA_LAUNCH_CHECK();
    DTK_LAUNCH(chunks, SORT_CHUNK, 0, stream, radix_scatter_kernel)
    (keys[1 - in], pos[1 - in], keys[in], pos[in], counts, N, shift, chunks);
    DT_CUDA_LAUNCH_CHECK();
  }
  const uint32_t* sorted_keys = keys[passes & 1];
  const int32_t* sorted_pos = pos[passes & 1];
  dispatch(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(N), blocks_for(static_cast<size_t>(C), DWTE_THREADS));
    DTK_LAUNCH(grid, DWTE_THREADS, 0, stream, embedding_dwte_kernel<Ty>)
    (dwte, static_cast<const Ty*>(dout), sorted_keys, sorted_pos, N, C, V);
    DT_CUDA_LAUNCH_CHECK();
    if (dwpe) {
      DTK_LAUNCH(grid_for(static_cast<size_t>(T) * C, 256), 256, 0, stream, embedding_dwpe_kernel<Ty>)
      (dwpe, static_cast<const Ty*>(dout), doc_start, B, T, C);
      DT_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace dtrain::kernels
