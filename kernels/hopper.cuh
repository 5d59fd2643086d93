// INTERNAL to kernels/*.cu (device code): the sm_90 (Hopper) instructions an attention
// path built on FlashAttention-3's ideas needs: mbarrier objects, the 1D bulk copy
// global -> shared that completes on one, and the warpgroup MMA (wgmma) with operands in
// shared memory. One API for both compilers, as kernels/mma.cuh: under nvcc each function
// is the PTX instruction it names (and __trap() when compiled for an architecture below
// sm_90, or for wgmma, which PTX makes an sm_90a feature, for any but sm_90a); under the CPU execution engine (DTRAIN_CUDA_EMU) it is the engine's model
// (tests/cuda_emu/kernel_hopper.cpp, kernel_wgmma.cpp), which fails the launch naming the
// call site where a GPU computes garbage or hangs, and on a device profile below 9.0.
//
// mbarrier (PTX ISA "mbarrier"): init(count) starts phase 0 expecting `count` arrivals;
// a phase completes when its arrivals are in and its tx-count (raised by expect_tx,
// lowered by the bytes of each bulk copy that completes on the barrier) is zero. A bulk
// copy's bytes are visible once the phase it completes on has completed: wait for it with
// `while (!mbarrier_try_wait_parity(bar, phase & 1)) {}`. After init, the initialising
// thread runs fence_mbarrier_init() (the async proxy must see the init), then the block
// synchronises, before any bulk copy uses the barrier.
// Bulk copy: addresses 16-byte aligned, size a non-zero multiple of 16.
//
// wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): the 128
// threads of an aligned warpgroup (warps 4k..4k+3) execute each call together.
//   wgmma_fence(); wgmma_m64k16<T, N>(d, adesc, bdesc, scale_d) ...; wgmma_commit();
//   wgmma_wait<0>();
// D (64xN, fp32) = A (64x16) B (16xN) + (scale_d ? D : 0), A and B in shared memory
// (wgmma_m64k16), both K-major, or A in registers and B K- or MN-major (wgmma_m64k16_rs,
// below). K-major: A row m holds its 16 k values, B is stored as N rows of 16 k values
// (B[k][n] at row n). Register fragment of D (thread t of the warpgroup, w = t / 32,
// g = (t % 32) / 4, q = t % 4): d[i], i < N / 2, = D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)]
// (as mma.m16n8's C fragment, repeated over the N / 8 column blocks, one 16-row slab per warp).
// d must not be read or written between the mma_async and the wait_group that retires it
// (the engine leaves a NaN tag there meanwhile), nor the shared memory it reads written;
// wgmma_fence() goes before the first mma_async after a wait_group or register writes.
// Shared-memory matrix descriptor (wgmma_desc): start address, leading and stride
// dimension byte offsets (LBO, SBO) and the swizzle mode. For K-major 16-bit operands,
// row r (of M or N) and 16-byte chunk c (k = 8c..8c+7) of one k16 slice lie at
//   no swizzle: start + (r / 8) SBO + (r % 8) 16 + c LBO   (8-row x 16-byte core matrices)
//   128B swizzle: a = start + (r / 8) SBO + (r % 8) 128 + 16 c, with bits 4-6 of a XORed
//     with bits 7-9 (rows of 128 bytes = 64 k values, 8-row atoms of 1024 bytes, so
//     SBO = 1024 for dense atoms; LBO unused). Atoms must be 1024-byte aligned in the
//     shared window, and the k16 slice s of an atom starts at atom + 32 s.
// The engine models no swizzle and 128B swizzle only (it fails the launch on the others).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#ifdef DTRAIN_CUDA_EMU
#include <source_location>
#endif

namespace dtrain::kernels::detail {

enum class WgmmaSwizzle : uint64_t { NONE = 0, B128 = 1, B64 = 2, B32 = 3 };

// The shared-window address of p (under the engine: its offset in the dynamic shared
// memory, which is where the engine's shared window starts).
__device__ __forceinline__ uint32_t shared_addr(const void* p) {
#ifdef DTRAIN_CUDA_EMU
  return static_cast<uint32_t>(static_cast<const char*>(p) - static_cast<const char*>(::cuda_emu::dynamic_smem()));
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// The 64-bit matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start
// address >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 49-51 base offset (0), 62-63 swizzle.
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo, WgmmaSwizzle swizzle) {
  return static_cast<uint64_t>((shared_addr(smem) & 0x3ffff) >> 4) | static_cast<uint64_t>((lbo >> 4) & 0x3fff) << 16 |
         static_cast<uint64_t>((sbo >> 4) & 0x3fff) << 32 | static_cast<uint64_t>(swizzle) << 62;
}

#ifndef DTRAIN_CUDA_EMU
// ----------------------------------------------------------------------------
// nvcc: inline PTX for sm_90; a trap on older architectures.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define DTK_SM90_ASM(...) __trap()
#else
#define DTK_SM90_ASM(...) asm volatile(__VA_ARGS__)
#endif

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  DTK_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_inval(uint64_t* bar) {
  DTK_SM90_ASM("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(shared_addr(bar)) : "memory");
}
__device__ __forceinline__ uint64_t mbarrier_arrive(uint64_t* bar) {
  uint64_t state = 0;
  DTK_SM90_ASM("mbarrier.arrive.shared::cta.b64 %0, [%1];\n" : "=l"(state) : "r"(shared_addr(bar)) : "memory");
  return state;
}
__device__ __forceinline__ uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  uint64_t state = 0;
  DTK_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(shared_addr(bar)), "r"(tx_bytes)
               : "memory");
  return state;
}
// True once the phase of this parity has completed (may return false before: loop).
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  DTK_SM90_ASM("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(shared_addr(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
__device__ __forceinline__ void fence_mbarrier_init() {
  DTK_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() { DTK_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  DTK_SM90_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_addr(smem_dst)),
               "l"(__cvta_generic_to_global(gmem_src)), "r"(bytes), "r"(shared_addr(bar))
               : "memory");
}

// Named barriers (PTX ISA "bar, barrier"): bar.sync waits until `count` threads (whole
// warps, a multiple of 32) have arrived at barrier `id`; bar.arrive marks the calling warp's
// arrival without waiting. All 32 lanes of a warp execute the same one. Id 0 is
// __syncthreads's: use 1-15. (Not sm_90-specific; FlashAttention-3's warpgroups take
// turns at the tensor cores with them.)
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The Tensor Memory Accelerator's tile copy: the box of `map` (a CUtensorMap made by
// cuTensorMapEncodeTiled, passed to the kernel as a __grid_constant__ parameter) at
// coordinates (c0, c1, c2), dim 0 innermost, into shared memory at dst (128-byte aligned;
// 1024 for the 128B swizzle's pattern to start at an atom), swizzled as the map says,
// elements out of bounds zero; it completes on `bar` with the whole box's bytes.
__device__ __forceinline__ void tensor_copy_3d_g2s(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                   uint64_t* bar) {
  DTK_SM90_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(shared_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(shared_addr(bar))
      : "memory");
}

// wgmma is an arch-specific feature: sm_90a (compute_90a), not sm_90. Compiled for any
// other architecture (sm_90 included) these trap.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DTK_SM90A_ASM(...) __trap()
#else
#define DTK_SM90A_ASM(...) asm volatile(__VA_ARGS__)
#endif
__device__ __forceinline__ void wgmma_fence() { DTK_SM90A_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { DTK_SM90A_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(N >= 0, "wgmma_wait: N is the number of groups left pending (0 or more)");
  DTK_SM90A_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// D (N / 2 floats per thread) = A B + (scale_d ? D : 0). T = __nv_bfloat16 or __half;
// N = 64, 128 or 256. Generated (one asm per shape and type: PTX names every register).
template <typename T, int N>
__device__ __forceinline__ void wgmma_m64k16(float* d, uint64_t adesc, uint64_t bdesc, bool scale_d);
template <>
__device__ __forceinline__ void wgmma_m64k16<__nv_bfloat16, 64>(float* d, uint64_t adesc, uint64_t bdesc,
                                                                bool scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(adesc), "l"(bdesc), "r"(static_cast<int>(scale_d))
      : "memory");
#endif
}
template <>
__device__ __forceinline__ void wgmma_m64k16<__half, 64>(float* d, uint64_t adesc, uint64_t bdesc, bool scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(adesc), "l"(bdesc), "r"(static_cast<int>(scale_d))
      : "memory");
#endif
}
template <>
__device__ __forceinline__ void wgmma_m64k16<__nv_bfloat16, 128>(float* d, uint64_t adesc, uint64_t bdesc,
                                                                 bool scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(adesc), "l"(bdesc), "r"(static_cast<int>(scale_d))
      : "memory");
#endif
}
template <>
__device__ __forceinline__ void wgmma_m64k16<__half, 128>(float* d, uint64_t adesc, uint64_t bdesc, bool scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(adesc), "l"(bdesc), "r"(static_cast<int>(scale_d))
      : "memory");
#endif
}
template <>
__device__ __forceinline__ void wgmma_m64k16<__nv_bfloat16, 256>(float* d, uint64_t adesc, uint64_t bdesc,
                                                                 bool scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(adesc), "l"(bdesc), "r"(static_cast<int>(scale_d))
      : "memory");
#endif
}
template <>
__device__ __forceinline__ void wgmma_m64k16<__half, 256>(float* d, uint64_t adesc, uint64_t bdesc, bool scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(adesc), "l"(bdesc), "r"(static_cast<int>(scale_d))
      : "memory");
#endif
}

// D (N / 2 floats per thread) = A B + (scale_d ? D : 0) with A from registers: a[0..3],
// this thread's part of the m64nNk16 A fragment (PTX ISA figure "WGMMA .m64nNk16 register
// fragment layout for matrix A"; two 16-bit elements a register, the lower-indexed in the
// low half): element i (a[i / 2]) = A[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)],
// the accumulator's layout of its first 8 entries, so D's entries 8 c..8 c + 7, packed in
// pairs, are the A of the k16 slice c (FlashAttention-3's P). TB = 1: B MN-major
// (imm-trans-b, defined for 16-bit types only): its 16 rows of k each hold N values, 16-byte
// chunk j = n / 8 of row k at
//   no swizzle: start + (k % 8) 16 + (k / 8) LBO + j SBO
//   128B swizzle: a = start + (k % 8) 128 + (k / 8) SBO + (j % 8) 16 + (j / 8) LBO, bits 4-6
//     of a XORed with bits 7-9 (128-byte rows of 64 n values, SBO = 1024 for dense 8-row
//     atoms, LBO the step between 64-column blocks)
// (the PTX ISA's canonical MN-major layouts). TB = 0: K-major, as above. a must not be
// written until the wait_group that retires the op. N = 64 or 128.
template <typename T, int N, int TB>
__device__ __forceinline__ void wgmma_m64k16_rs(float* d, const uint32_t* a, uint64_t bdesc, bool scale_d) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "wgmma_m64k16_rs: T must be __nv_bfloat16 or __half (imm-trans-b is for 16-bit types only)");
  static_assert(N == 64 || N == 128, "wgmma_m64k16_rs: N must be 64 or 128");
  static_assert(TB == 0 || TB == 1, "wgmma_m64k16_rs: TB is 0 (B K-major) or 1 (MN-major)");
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  if constexpr (N == 64 && std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(static_cast<int>(scale_d)), "n"(TB)
        : "memory");
  } else if constexpr (N == 64 && std::is_same_v<T, __half>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(static_cast<int>(scale_d)), "n"(TB)
        : "memory");
  } else if constexpr (N == 128 && std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(static_cast<int>(scale_d)), "n"(TB)
        : "memory");
  } else if constexpr (N == 128 && std::is_same_v<T, __half>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(static_cast<int>(scale_d)), "n"(TB)
        : "memory");
  }
#endif
}
#undef DTK_SM90_ASM
#undef DTK_SM90A_ASM

#else
// ----------------------------------------------------------------------------
// The CPU execution engine: each function takes its call site as a defaulted last
// argument (the engine's reports name it).
using HopperSite = std::source_location;
#define DTK_SITE at.file_name(), static_cast<int>(at.line())

inline void mbarrier_init(uint64_t* bar, uint32_t count, HopperSite at = HopperSite::current()) {
  ::cuda_emu::mbarrier_init(DTK_SITE, bar, count);
}
inline void mbarrier_inval(uint64_t* bar, HopperSite at = HopperSite::current()) {
  ::cuda_emu::mbarrier_inval(DTK_SITE, bar);
}
inline uint64_t mbarrier_arrive(uint64_t* bar, HopperSite at = HopperSite::current()) {
  return ::cuda_emu::mbarrier_arrive(DTK_SITE, bar);
}
inline uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes, HopperSite at = HopperSite::current()) {
  return ::cuda_emu::mbarrier_arrive_expect_tx(DTK_SITE, bar, tx_bytes);
}
inline bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity, HopperSite at = HopperSite::current()) {
  return ::cuda_emu::mbarrier_try_wait_parity(DTK_SITE, bar, parity);
}
inline void fence_mbarrier_init(HopperSite at = HopperSite::current()) { ::cuda_emu::fence_mbarrier_init(DTK_SITE); }
inline void fence_proxy_async(HopperSite at = HopperSite::current()) { ::cuda_emu::fence_proxy_async(DTK_SITE); }
inline void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar,
                          HopperSite at = HopperSite::current()) {
  ::cuda_emu::bulk_copy_g2s(DTK_SITE, smem_dst, gmem_src, bytes, bar);
}
inline void tensor_copy_3d_g2s(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar,
                               HopperSite at = HopperSite::current()) {
  const int32_t coord[3] = {c0, c1, c2};
  ::cuda_emu::tensor_copy_g2s(DTK_SITE, dst, map, 3, coord, bar);
}
inline void named_bar_sync(uint32_t id, uint32_t count, HopperSite at = HopperSite::current()) {
  ::cuda_emu::named_barrier_sync(DTK_SITE, id, count);
}
inline void named_bar_arrive(uint32_t id, uint32_t count, HopperSite at = HopperSite::current()) {
  ::cuda_emu::named_barrier_arrive(DTK_SITE, id, count);
}
inline void wgmma_fence(HopperSite at = HopperSite::current()) { ::cuda_emu::wgmma_fence(DTK_SITE); }
inline void wgmma_commit(HopperSite at = HopperSite::current()) { ::cuda_emu::wgmma_commit(DTK_SITE); }
template <int N>
inline void wgmma_wait(HopperSite at = HopperSite::current()) {
  static_assert(N >= 0, "wgmma_wait: N is the number of groups left pending (0 or more)");
  ::cuda_emu::wgmma_wait(DTK_SITE, N);
}
template <typename T, int N>
inline void wgmma_m64k16(float* d, uint64_t adesc, uint64_t bdesc, bool scale_d,
                         HopperSite at = HopperSite::current()) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "wgmma_m64k16: T must be __nv_bfloat16 or __half");
  static_assert(N == 64 || N == 128 || N == 256, "wgmma_m64k16: N must be 64, 128 or 256");
  ::cuda_emu::wgmma_m64k16(DTK_SITE, std::is_same_v<T, __nv_bfloat16> ? ::cuda_emu::MMA_BF16 : ::cuda_emu::MMA_F16, N,
                           d, adesc, bdesc, scale_d);
}

// D (N / 2 floats per thread) = A B + (scale_d ? D : 0) with A from registers: a[0..3],
// this thread's part of the m64nNk16 A fragment (PTX ISA figure "WGMMA .m64nNk16 register
// fragment layout for matrix A"; two 16-bit elements a register, the lower-indexed in the
// low half): element i (a[i / 2]) = A[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)],
// the accumulator's layout of its first 8 entries, so D's entries 8 c..8 c + 7, packed in
// pairs, are the A of the k16 slice c (FlashAttention-3's P). TB = 1: B MN-major
// (imm-trans-b, defined for 16-bit types only): its 16 rows of k each hold N values, 16-byte
// chunk j = n / 8 of row k at
//   no swizzle: start + (k % 8) 16 + (k / 8) LBO + j SBO
//   128B swizzle: a = start + (k % 8) 128 + (k / 8) SBO + (j % 8) 16 + (j / 8) LBO, bits 4-6
//     of a XORed with bits 7-9 (128-byte rows of 64 n values, SBO = 1024 for dense 8-row
//     atoms, LBO the step between 64-column blocks)
// (the PTX ISA's canonical MN-major layouts). TB = 0: K-major, as above. a must not be
// written until the wait_group that retires the op. N = 64 or 128.
template <typename T, int N, int TB>
__device__ __forceinline__ void wgmma_m64k16_rs(float* d, const uint32_t* a, uint64_t bdesc, bool scale_d,
                                                HopperSite at = HopperSite::current()) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "wgmma_m64k16_rs: T must be __nv_bfloat16 or __half (imm-trans-b is for 16-bit types only)");
  static_assert(N == 64 || N == 128, "wgmma_m64k16_rs: N must be 64 or 128");
  static_assert(TB == 0 || TB == 1, "wgmma_m64k16_rs: TB is 0 (B K-major) or 1 (MN-major)");
  ::cuda_emu::wgmma_m64k16(DTK_SITE, std::is_same_v<T, __nv_bfloat16> ? ::cuda_emu::MMA_BF16 : ::cuda_emu::MMA_F16, N,
                           d, 0, bdesc, scale_d, a, TB == 1);
}
#undef DTK_SITE
#endif

}  // namespace dtrain::kernels::detail
