// CUDA execution engine (test-only): the device side of the CUDA subset for kernels
// compiled by g++: qualifiers, threadIdx & co., barriers, warp intrinsics, device math
// and atomics. Included by cuda_runtime.h; the scheduler behind it is kernel_exec.cpp.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <bit>
#include <cstring>
#include <type_traits>

// ----------------------------------------------------------------------------
// Qualifiers. Every block runs on one OS thread at a time (its threads are fibers of
// that thread), so a thread_local is exactly per block: that is what __shared__ needs.
// Static shared memory keeps whatever the previous block on that thread left in it
// (a GPU leaves it undefined too). __noinline__ is left alone: libstdc++ and glibc spell
// the attribute with that name.
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static thread_local

inline constexpr int warpSize = 32;

namespace cuda_emu {

// ----------------------------------------------------------------------------
// The executing thread's coordinates. The scheduler sets them when a block starts and
// the current-thread pointer on every fiber switch; constinit lets g++ read them
// without a TLS wrapper call.
struct BlockContext {
  uint3 block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
  void* dynamic_smem = nullptr;
};
extern thread_local constinit BlockContext t_block;
extern thread_local constinit const uint3* t_thread_idx;

inline const uint3& this_thread_idx() { return *t_thread_idx; }
inline const uint3& this_block_idx() { return t_block.block_idx; }
inline const dim3& this_block_dim() { return t_block.block_dim; }
inline const dim3& this_grid_dim() { return t_block.grid_dim; }

// The block's dynamic shared memory: 16-byte aligned, the launch's size, filled with
// 0xff bytes when the block starts and followed by an inaccessible guard page.
inline void* dynamic_smem() { return t_block.dynamic_smem; }

// ----------------------------------------------------------------------------
// Block and warp synchronisation (kernel_exec.cpp). file/line name the call site in
// error reports; the public spellings are the macros below.
void syncthreads(const char* file, int line);
int syncthreads_or(const char* file, int line, int pred);
int syncthreads_and(const char* file, int line, int pred);
int syncthreads_count(const char* file, int line, int pred);
void syncwarp(const char* file, int line, unsigned mask = 0xffffffffu);
unsigned ballot_sync(const char* file, int line, unsigned mask, int pred);
unsigned activemask(const char* file, int line);
// bar.sync id, count / bar.arrive id, count (kernel_namedbar.cpp): named barriers 1-15,
// per warp; kernels use them through kernels/hopper.cuh.
void named_barrier_sync(const char* file, int line, unsigned id, unsigned count);
void named_barrier_arrive(const char* file, int line, unsigned id, unsigned count);

enum ShuffleKind : int { SHFL_IDX, SHFL_XOR, SHFL_UP, SHFL_DOWN };
// One lane's part of a shuffle of `bytes`-sized values (4 or 8), carried as raw bits.
uint64_t warp_shuffle(const char* file, int line, ShuffleKind kind, unsigned mask, uint64_t bits, int bytes, int arg,
                      int width);

template <typename T>
T shuffle_typed(const char* file, int line, ShuffleKind kind, unsigned mask, T var, int arg, int width) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                "warp shuffles move 4- or 8-byte trivially copyable values");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = warp_shuffle(file, line, kind, mask, bits, static_cast<int>(sizeof(T)), arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
template <typename T>
T shfl_sync(const char* f, int l, unsigned mask, T var, int src_lane, int width = 32) {
  return shuffle_typed(f, l, SHFL_IDX, mask, var, src_lane, width);
}
template <typename T>
T shfl_xor_sync(const char* f, int l, unsigned mask, T var, int lane_mask, int width = 32) {
  return shuffle_typed(f, l, SHFL_XOR, mask, var, lane_mask, width);
}
template <typename T>
T shfl_up_sync(const char* f, int l, unsigned mask, T var, unsigned delta, int width = 32) {
  return shuffle_typed(f, l, SHFL_UP, mask, var, static_cast<int>(delta), width);
}
template <typename T>
T shfl_down_sync(const char* f, int l, unsigned mask, T var, unsigned delta, int width = 32) {
  return shuffle_typed(f, l, SHFL_DOWN, mask, var, static_cast<int>(delta), width);
}

// ----------------------------------------------------------------------------
// Tensor-core warp instructions and asynchronous copies (kernel_exec.cpp), as the PTX
// instructions they stand for; kernels use them through kernels/mma.cuh (inline PTX
// under nvcc). Register fragments use the PTX ISA layouts.
enum MmaType : int { MMA_BF16, MMA_F16 };
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, d: one
// lane's part (d: 4 floats in/out, a: 4 registers, b: 2). All 32 lanes of the warp
// must execute the same call.
void mma_m16n8k16(const char* file, int line, MmaType type, float* d, const uint32_t* a, const uint32_t* b);
// ldmatrix.sync.aligned.m8n8.x{matrices}{.trans}.shared.b16 r, [p]: one lane's part
// (r: `matrices` registers; p: this lane's row address, used by lanes < 8 * matrices).
void ldmatrix(const char* file, int line, int matrices, bool trans, uint32_t* r, const void* p);
// cp.async.cg.shared.global [smem_dst], [gmem_src], 16; cp.async.commit_group;
// cp.async.wait_group n: per thread. A copy lands in shared memory when the wait that
// retires its group runs, never earlier.
void cp_async_16(const char* file, int line, void* smem_dst, const void* gmem_src);
void cp_async_commit(const char* file, int line);
void cp_async_wait(const char* file, int line, int n);

// ----------------------------------------------------------------------------
// sm_90 instructions (kernel_hopper.cpp, kernel_wgmma.cpp), as the PTX ISA defines them;
// kernels use them through kernels/hopper.cuh. On a device profile below compute
// capability 9.0 each one fails the launch (cudaErrorIllegalInstruction).
// mbarrier.init.shared::cta.b64 [bar], count; mbarrier.inval.shared::cta.b64 [bar].
void mbarrier_init(const char* file, int line, uint64_t* bar, uint32_t count);
void mbarrier_inval(const char* file, int line, uint64_t* bar);
// mbarrier.arrive.shared::cta.b64 state, [bar] (count 1) and
// mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], tx: the returned state names
// the phase arrived at.
uint64_t mbarrier_arrive(const char* file, int line, uint64_t* bar);
uint64_t mbarrier_arrive_expect_tx(const char* file, int line, uint64_t* bar, uint32_t tx);
// mbarrier.try_wait.parity.shared::cta.b64 done, [bar], parity.
bool mbarrier_try_wait_parity(const char* file, int line, uint64_t* bar, uint32_t parity);
// fence.mbarrier_init.release.cluster; fence.proxy.async.shared::cta.
void fence_mbarrier_init(const char* file, int line);
void fence_proxy_async(const char* file, int line);
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar].
void bulk_copy_g2s(const char* file, int line, void* dst, const void* src, uint32_t bytes, uint64_t* bar);
// cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes
// [dst], [map, {coord[0..rank-1]}], [bar]: the box of a tensor map (cuda.h's
// cuTensorMapEncodeTiled) at those coordinates; tx bytes are the whole box's.
void tensor_copy_g2s(const char* file, int line, void* dst, const void* map, int rank, const int32_t* coord,
                     uint64_t* bar);
// wgmma.fence / commit_group / wait_group n .sync.aligned, and
// wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{bf16,f16}.{bf16,f16} d, adesc, bdesc,
// scale_d, 1, 1, 0, trans_b (a null), or d, {a0..a3}, bdesc, scale_d, 1, 1, trans_b (A from
// the 4 registers at a; adesc unused): one thread's part (d: n / 2 floats), all 128
// threads of an aligned warpgroup together.
void wgmma_fence(const char* file, int line);
void wgmma_commit(const char* file, int line);
void wgmma_wait(const char* file, int line, int n);
void wgmma_m64k16(const char* file, int line, MmaType type, int n, float* d, uint64_t adesc, uint64_t bdesc,
                  bool scale_d, const uint32_t* a = nullptr, bool trans_b = false);

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::this_thread_idx())
#define blockIdx (::cuda_emu::this_block_idx())
#define blockDim (::cuda_emu::this_block_dim())
#define gridDim (::cuda_emu::this_grid_dim())

#define __syncthreads() ::cuda_emu::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(pred) ::cuda_emu::syncthreads_or(__FILE__, __LINE__, (pred))
#define __syncthreads_and(pred) ::cuda_emu::syncthreads_and(__FILE__, __LINE__, (pred))
#define __syncthreads_count(pred) ::cuda_emu::syncthreads_count(__FILE__, __LINE__, (pred))
#define __syncwarp(...) ::cuda_emu::syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __ballot_sync(mask, pred) ::cuda_emu::ballot_sync(__FILE__, __LINE__, (mask), (pred))
#define __activemask() ::cuda_emu::activemask(__FILE__, __LINE__)
#define __shfl_sync(...) ::cuda_emu::shfl_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::cuda_emu::shfl_xor_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::cuda_emu::shfl_up_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::cuda_emu::shfl_down_sync(__FILE__, __LINE__, __VA_ARGS__)

// ----------------------------------------------------------------------------
// Device math missing from g++'s global namespace. The fast-math intrinsics are exact
// here: results may differ from a GPU's in the last bits, never in meaning.
using std::isfinite;
using std::isinf;
using std::isnan;

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
// IEEE round-to-nearest operations that a GPU never contracts into an FMA; g++ contracts
// nothing here (-std=c++20, no -ffp-contract=fast), so plain operators are exact.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, 4);
  return i;
}
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}

// CUDA's device min/max: one overload set for every arithmetic pair, mixed signedness
// resolved as the usual arithmetic conversions do (as CUDA's headers do).
template <typename A, typename B>
requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  const C x = static_cast<C>(a), y = static_cast<C>(b);
  return y < x ? y : x;
}
template <typename A, typename B>
requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  const C x = static_cast<C>(a), y = static_cast<C>(b);
  return x < y ? y : x;
}

// ----------------------------------------------------------------------------
// Atomics: sequentially consistent read-modify-writes (a GPU's are relaxed; stronger
// is always a legal outcome). They return the old value, as CUDA's do.
namespace cuda_emu {
template <typename T>
inline T atomic_max(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (old < v && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <typename T>
inline T atomic_min(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (v < old && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <typename T>
inline T atomic_cas(T* p, T compare, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(compare, v);
  return compare;  // the old value on failure, `compare` itself on success
}
}  // namespace cuda_emu

// Overloads rather than templates so mixed arguments convert as under nvcc.
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline double atomicAdd(double* p, double v) { return std::atomic_ref<double>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline int atomicMax(int* p, int v) { return ::cuda_emu::atomic_max(p, v); }
inline unsigned atomicMax(unsigned* p, unsigned v) { return ::cuda_emu::atomic_max(p, v); }
inline int atomicMin(int* p, int v) { return ::cuda_emu::atomic_min(p, v); }
inline unsigned atomicMin(unsigned* p, unsigned v) { return ::cuda_emu::atomic_min(p, v); }
inline int atomicCAS(int* p, int compare, int v) { return ::cuda_emu::atomic_cas(p, compare, v); }
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned v) { return ::cuda_emu::atomic_cas(p, compare, v); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long compare, unsigned long long v) {
  return ::cuda_emu::atomic_cas(p, compare, v);
}
inline int atomicExch(int* p, int v) { return std::atomic_ref<int>(*p).exchange(v); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).exchange(v); }
inline float atomicExch(float* p, float v) { return std::atomic_ref<float>(*p).exchange(v); }
// Global memory fence, for the last-block-finishes reductions (a block's writes, then an
// atomicAdd on a counter that the last block reads). The atomics above are seq_cst RMWs, which
// already order a block's earlier writes before the counter (release) and the last block's
// later reads after it (acquire), so the fence only stops the compiler moving accesses across
// it (a thread fence proper is not supported by -fsanitize=thread, which kernels/ builds with).
inline void __threadfence() { std::atomic_signal_fence(std::memory_order_seq_cst); }
