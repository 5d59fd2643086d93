// INTERNAL to kernels/*.cu (device code: never include it from host-only .cpp files):
// tensor-core warp instructions for sm_80+, one API for both compilers. Under nvcc each
// function is the PTX instruction it names (inline PTX); under the CPU execution engine
// (DTRAIN_CUDA_EMU) it is the engine's model of it (tests/cuda_emu), which is stricter
// than a GPU: it fails the launch, naming the call site, where a GPU silently computes
// garbage (a lane missing from a .sync.aligned instruction, a partial warp, an
// unaligned or non-shared address, a cp.async source that is not device memory).
//
// Register fragments follow the PTX ISA. With groupID g = lane / 4 and
// threadID_in_group q = lane % 4, and a register's lower-index element in its low 16 bits:
//   mma A (16x16, row-major): a[j] = A[g + 8 (j & 1)][2q + 8 (j >> 1) + {0, 1}]
//   mma B (16x8, "col"):      b[j] = B[2q + 8 j + {0, 1}][g]           (B indexed [k][n])
//   mma C/D (16x8, fp32):     d[i] = D[g + 8 (i >> 1)][2q + (i & 1)]
//   ldmatrix .m8n8 .b16: lane 8m + r gives the address of row r of matrix m (8 contiguous
//     16-bit elements, 16-byte aligned; x1 uses lanes 0-7, x2 lanes 0-15, x4 all);
//     register m of each lane = matrix m's row g, columns 2q and 2q + 1 (with .trans:
//     rows 2q and 2q + 1 of column g, i.e. the transposed matrix).
// So for A stored row-major in shared memory, ldmatrix_x4 with lane l pointing at
// &A[l % 16][8 (l / 16)] yields a[0..3]; for B stored [k][n] (row-major over k),
// ldmatrix_x4_trans with lane l pointing at &B[(l % 8) + 8 ((l / 8) % 2)][8 (l / 16)] yields
// the b fragments of columns 0-7 (registers 0, 1) and 8-15 (registers 2, 3).
// Products are exact in fp32 and accumulate in fp32; the engine's summation order is
// documented in tests/cuda_emu/kernel_exec.cpp (a GPU's differs in the last bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#ifdef DTRAIN_CUDA_EMU
#include <source_location>
#endif

namespace dtrain::kernels::detail {

// Two floats -> one register of two T (round to nearest even); lo goes to the low 16
// bits (the lower column index), as every fragment above expects.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
         static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16;
}

template <typename T>
inline constexpr bool is_mma_input_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

#ifndef DTRAIN_CUDA_EMU
// ----------------------------------------------------------------------------
// nvcc: inline PTX. Shared-memory operands are 32-bit .shared addresses; the asm that
// reads or writes memory clobbers "memory" so the compiler keeps ordinary loads and
// stores on their side of it.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// D = A B + D on one warp's m16n8k16 tile, fp32 accumulate. T = __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(is_mma_input_v<T>, "mma_m16n8k16: T must be __nv_bfloat16 or __half");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// ldmatrix from shared memory; p = this lane's row address (16-byte aligned, 8 x 16-bit).
__device__ __forceinline__ void ldmatrix_x1(uint32_t& r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r) : "r"(smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

// 16-byte asynchronous global -> shared copy (both addresses 16-byte aligned) and its
// group commit / wait, per thread as in PTX: a copy's bytes are guaranteed in shared
// memory, for this thread, only after the wait that retires its group; other threads
// see them after a barrier that follows that wait.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
               :
               : "r"(smem_u32(smem_dst)), "l"(__cvta_generic_to_global(gmem_src))
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending (copies not yet
// committed are not waited for).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(N >= 0, "cp_async_wait: N is the number of groups left pending (0 or more)");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#else
// ----------------------------------------------------------------------------
// The CPU execution engine. Each function takes its call site as a defaulted last
// argument (the engine's reports name it), so calls read the same as under nvcc.
using SourceSite = std::source_location;

template <typename T>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                         SourceSite at = SourceSite::current()) {
  static_assert(is_mma_input_v<T>, "mma_m16n8k16: T must be __nv_bfloat16 or __half");
  ::cuda_emu::mma_m16n8k16(at.file_name(), static_cast<int>(at.line()),
                           std::is_same_v<T, __nv_bfloat16> ? ::cuda_emu::MMA_BF16 : ::cuda_emu::MMA_F16, d, a, b);
}

inline void ldmatrix_x1(uint32_t& r, const void* p, SourceSite at = SourceSite::current()) {
  ::cuda_emu::ldmatrix(at.file_name(), static_cast<int>(at.line()), 1, false, &r, p);
}
inline void ldmatrix_x2(uint32_t (&r)[2], const void* p, SourceSite at = SourceSite::current()) {
  ::cuda_emu::ldmatrix(at.file_name(), static_cast<int>(at.line()), 2, false, r, p);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p, SourceSite at = SourceSite::current()) {
  ::cuda_emu::ldmatrix(at.file_name(), static_cast<int>(at.line()), 4, false, r, p);
}
inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p, SourceSite at = SourceSite::current()) {
  ::cuda_emu::ldmatrix(at.file_name(), static_cast<int>(at.line()), 2, true, r, p);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p, SourceSite at = SourceSite::current()) {
  ::cuda_emu::ldmatrix(at.file_name(), static_cast<int>(at.line()), 4, true, r, p);
}

inline void cp_async_16(void* smem_dst, const void* gmem_src, SourceSite at = SourceSite::current()) {
  ::cuda_emu::cp_async_16(at.file_name(), static_cast<int>(at.line()), smem_dst, gmem_src);
}
inline void cp_async_commit(SourceSite at = SourceSite::current()) {
  ::cuda_emu::cp_async_commit(at.file_name(), static_cast<int>(at.line()));
}
template <int N>
inline void cp_async_wait(SourceSite at = SourceSite::current()) {
  static_assert(N >= 0, "cp_async_wait: N is the number of groups left pending (0 or more)");
  ::cuda_emu::cp_async_wait(at.file_name(), static_cast<int>(at.line()), N);
}
#endif

}  // namespace dtrain::kernels::detail
