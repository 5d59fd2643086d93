// CUDA execution engine (test-only): the tensor-core warp instructions (mma.sync m16n8k16,
// ldmatrix m8n8) and cp.async, as the PTX ISA defines them: their arithmetic and data
// movement, and the shared- and global-memory operand checks. Lanes meet through
// kernel_exec.cpp's warp_aligned; kernels reach these through kernels/mma.cuh.
#include "kernel_exec_internal.h"

#include <cuda_fp16.h>

#include <link.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace cuda_emu {

namespace {

// ----------------------------------------------------------------------------
// mma and ldmatrix: what each lane leaves in Thread::io, and the warp's result.
struct MmaIo {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
};
struct LdsmIo {
  uint32_t* r;
  const void* p;
};

// D = A B + C on the warp's m16n8k16 tile, fragments as the PTX ISA lays them out
// (g = lane / 4, q = lane % 4; the lower index of a register's pair in its low 16 bits):
// a[j] holds A[g + 8 (j & 1)][2q + 8 (j >> 1) + {0, 1}], b[j] holds B[2q + 8 j + {0, 1}][g],
// d[i] is D[g + 8 (i >> 1)][2q + (i & 1)]. Every product of two bf16 or fp16 values is
// exact in fp32 (bf16: unless it leaves fp32's range); each D element starts from C and
// adds the 16 products in k order, each sum rounded to nearest even. A tensor core sums
// in another order and precision: results agree to a few ulps, not bitwise. Inf and NaN
// inputs propagate as in any fp32 arithmetic.
template <float (*CVT)(uint32_t)>
[[gnu::noinline]] void mma_compute(Thread* lanes) {
  float A[16][16], B[16][8], D[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto& io = *static_cast<const MmaIo*>(lanes[l].io);
    const int g = l >> 2, q = l & 3;
    for (int j = 0; j < 4; ++j) {
      float* row = &A[g + 8 * (j & 1)][2 * q + 8 * (j >> 1)];
      row[0] = CVT(io.a[j]);
      row[1] = CVT(io.a[j] >> 16);
    }
    for (int j = 0; j < 2; ++j) {
      B[2 * q + 8 * j][g] = CVT(io.b[j]);
      B[2 * q + 8 * j + 1][g] = CVT(io.b[j] >> 16);
    }
    for (int i = 0; i < 4; ++i) D[g + 8 * (i >> 1)][2 * q + (i & 1)] = io.d[i];
  }
  // k outermost: each element's sum keeps its order, the 128 sums run side by side.
  for (int k = 0; k < 16; ++k)
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) D[r][n] += A[r][k] * B[k][n];
  for (int l = 0; l < 32; ++l) {
    const auto& io = *static_cast<const MmaIo*>(lanes[l].io);
    const int g = l >> 2, q = l & 3;
    for (int i = 0; i < 4; ++i) io.d[i] = D[g + 8 * (i >> 1)][2 * q + (i & 1)];
  }
}

// ldmatrix .m8n8 .b16: lane 8m + r gave the address of row r of matrix m; register m of
// lane l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (of its
// transpose with .trans: rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4).
[[gnu::noinline]] void ldmatrix_compute(Thread* lanes, int matrices, bool trans) {
  for (int m = 0; m < matrices; ++m) {
    const char* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = static_cast<const char*>(static_cast<const LdsmIo*>(lanes[8 * m + r].io)->p);
    for (int l = 0; l < 32; ++l) {
      const int g = l >> 2, q = l & 3;
      uint16_t lo, hi;
      if (trans) {
        std::memcpy(&lo, rows[2 * q] + 2 * g, 2);
        std::memcpy(&hi, rows[2 * q + 1] + 2 * g, 2);
      } else {
        std::memcpy(&lo, rows[g] + 4 * q, 2);
        std::memcpy(&hi, rows[g] + 4 * q + 2, 2);
      }
      static_cast<const LdsmIo*>(lanes[l].io)->r[m] = lo | static_cast<uint32_t>(hi) << 16;
    }
  }
}

}  // namespace

void aligned_complete(int op, Thread* lanes) {
  switch (op) {
    case OP_MMA_BF16: mma_compute<bf16_bits>(lanes); break;
    case OP_MMA_F16: mma_compute<f16_bits>(lanes); break;
    case OP_LDSM_X1: ldmatrix_compute(lanes, 1, false); break;
    case OP_LDSM_X2: ldmatrix_compute(lanes, 2, false); break;
    case OP_LDSM_X4: ldmatrix_compute(lanes, 4, false); break;
    case OP_LDSM_X1_T: ldmatrix_compute(lanes, 1, true); break;
    case OP_LDSM_X2_T: ldmatrix_compute(lanes, 2, true); break;
    case OP_LDSM_X4_T: ldmatrix_compute(lanes, 4, true); break;
  }
}

namespace {

// ----------------------------------------------------------------------------
// Shared-memory operands (ldmatrix rows, cp.async destinations): the block's dynamic
// shared memory or static __shared__ storage, which is thread_local here, so any address
// in this OS thread's thread-local storage passes (the engine's own thread_locals too:
// that much is not caught).
int tls_collect(dl_phdr_info* info, size_t, void* out) {
  auto& v = *static_cast<std::vector<std::pair<const char*, const char*>>*>(out);
  if (!info->dlpi_tls_data) return 0;  // no TLS, or not allocated in this thread yet
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_TLS) {
      const char* lo = static_cast<const char*>(info->dlpi_tls_data);
      v.emplace_back(lo, lo + info->dlpi_phdr[i].p_memsz);
    }
  return 0;
}

bool in_range(const void* p, size_t bytes, const char* lo, const char* hi) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a >= reinterpret_cast<uintptr_t>(lo) && a + bytes <= reinterpret_cast<uintptr_t>(hi);
}

}  // namespace

bool in_shared(Worker& w, const void* p, size_t bytes) {
  if (in_range(p, bytes, w.smem_base, w.smem_base + w.smem_size)) return true;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [lo, hi] : w.tls)
      if (in_range(p, bytes, lo, hi)) return true;
    if (pass == 0) {  // first use, or a module loaded since: read the list again
      w.tls.clear();
      dl_iterate_phdr(tls_collect, &w.tls);
    }
  }
  return false;
}

// What an address that is not shared memory is, for the report.
[[gnu::cold]] std::string not_shared_str(const Worker& w, const Thread& th, const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto base = reinterpret_cast<uintptr_t>(w.smem_base);
  if (a >= base && a < base + w.smem_size)
    return "runs past the end of the block's " + std::to_string(w.smem_size) +
           " bytes of dynamic shared memory (offset " + std::to_string(a - base) + ", " + std::to_string(bytes) +
           " bytes)";
  if (auto al = alloc_find(p, 0)) {
    const std::string where = "offset " + std::to_string(a - reinterpret_cast<uintptr_t>(al->base)) + " of a " +
                              std::to_string(al->size) + "-byte ";
    if (al->pinned_host) return "is in pinned host memory (" + where + "cudaMallocHost allocation), not shared memory";
    return "is in global memory (" + where + "cudaMalloc allocation on device " + std::to_string(al->device) +
           "), not shared memory";
  }
  if (th.carrier && in_range(p, bytes, th.carrier->stack_lo, th.carrier->stack_lo + FIBER_STACK))
    return "is on the thread's stack (a local variable), not shared memory";
  return "is not shared memory (neither in the block's " + std::to_string(w.smem_size) +
         " bytes of dynamic shared memory nor in a static __shared__ variable)";
}

namespace {

// Fails the calling thread unless [p, p + 16) is 16-byte aligned shared memory.
void shared16_check(Block& b, unsigned t, const char* what, const char* file, int line, const char* operand,
                    const void* p) {
  const bool aligned = (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
  if (aligned && in_shared(*b.w, p, 16)) return;
  const std::string head = lane_str(b, t) + " at " + what + " at " + where_str(file, line) + ": " + operand + " " +
                           hex(reinterpret_cast<uintptr_t>(p)) + " ";
  if (!aligned)
    thread_fail(b, head + "is not 16-byte aligned (16 bytes move as one naturally aligned access)",
                cudaErrorMisalignedAddress);
  thread_fail(b, head + not_shared_str(*b.w, b.threads[t], p, 16), cudaErrorIllegalAddress);
}

// ----------------------------------------------------------------------------
// cp.async (per thread; kernel_exec_internal.h's AsyncCopies). A copy lands when the
// cp.async.wait_group that retires its group runs: until then its destination keeps its
// old bytes (for dynamic shared memory, the 0xff fill), whatever barriers pass, and the
// source is read only then. A thread that exits with copies in flight is no error (PTX
// defines none; only a wait completes a copy, so nothing can legally read those bytes):
// the engine drops them, and their destinations keep their old bytes.
constexpr const char* CP_ASYNC = "cp.async.cg.shared.global";

[[gnu::cold, gnu::noinline, noreturn]] void cp_async_bad_source(Block& b, unsigned t, const char* file, int line,
                                                                const void* src) {
  const std::string head = lane_str(b, t) + " at " + CP_ASYNC + " at " + where_str(file, line) + ": global source " +
                           hex(reinterpret_cast<uintptr_t>(src)) + " ";
  if (reinterpret_cast<uintptr_t>(src) & 15u)
    thread_fail(b, head + "is not 16-byte aligned (cp-size 16 needs 16-byte aligned addresses)",
                cudaErrorMisalignedAddress);
  const int device = b.launch->k->device;
  const auto a = alloc_find(src, 0);
  std::string what;
  if (!a) {
    what = "is not device memory (host memory, freed memory or a guard zone)";
  } else {
    const std::string where = "offset " +
                              std::to_string(reinterpret_cast<uintptr_t>(src) - reinterpret_cast<uintptr_t>(a->base)) +
                              " of a " + std::to_string(a->size) + "-byte ";
    if (a->pinned_host)
      what = "is in pinned host memory (" + where +
             "cudaMallocHost allocation): the engine takes cp.async sources from device memory only";
    else if (a->device != device)
      what = "is memory of device " + std::to_string(a->device) + " (" + where +
             "allocation), but the kernel runs on device " + std::to_string(device);
    else what = "has fewer than 16 readable bytes (" + where + "allocation)";
  }
  thread_fail(b, head + what, cudaErrorIllegalAddress);
}

Block& async_block(const char* file, int line, const char* what, unsigned* t) {
  Block& b = current_block(file, line, what);
  *t = static_cast<unsigned>(cur_thread() - b.threads.data());
  return b;
}

}  // namespace

// ----------------------------------------------------------------------------
// Tensor-core warp instructions and cp.async (cuda_emu_device.h).
void mma_m16n8k16(const char* file, int line, MmaType type, float* d, const uint32_t* a, const uint32_t* bfrag) {
  const int op = type == MMA_F16 ? OP_MMA_F16 : OP_MMA_BF16;
  Block& b = current_block(file, line, op_name(op));
  const MmaIo io{d, a, bfrag};
  warp_aligned(b, *cur_thread(), file, line, op, &io);
}

void ldmatrix(const char* file, int line, int matrices, bool trans, uint32_t* r, const void* p) {
  Block& b = current_block(file, line, "ldmatrix");
  Thread& th = *cur_thread();
  const unsigned t = static_cast<unsigned>(&th - b.threads.data());
  int op = -1;
  if (matrices == 1) op = trans ? OP_LDSM_X1_T : OP_LDSM_X1;
  if (matrices == 2) op = trans ? OP_LDSM_X2_T : OP_LDSM_X2;
  if (matrices == 4) op = trans ? OP_LDSM_X4_T : OP_LDSM_X4;
  if (op < 0)
    thread_fail(b, lane_str(b, t) + " at ldmatrix at " + where_str(file, line) + ": " + std::to_string(matrices) +
                       " matrices (PTX has .x1, .x2 and .x4)");
  if (t % 32 < 8u * static_cast<unsigned>(matrices)) {
    shared16_check(b, t, op_name(op), file, line, "row address", p);
    racecheck_access(p, 16, false, reinterpret_cast<uintptr_t>(__builtin_return_address(0)));
  }
  const LdsmIo io{r, p};
  warp_aligned(b, th, file, line, op, &io);
}

void cp_async_16(const char* file, int line, void* smem_dst, const void* gmem_src) {
  unsigned t;
  Block& b = async_block(file, line, CP_ASYNC, &t);
  shared16_check(b, t, CP_ASYNC, file, line, "shared destination", smem_dst);
  if (reinterpret_cast<uintptr_t>(gmem_src) & 15u) cp_async_bad_source(b, t, file, line, gmem_src);
  const auto a = alloc_find(gmem_src, 16);
  if (!a || a->pinned_host || a->device != b.launch->k->device) cp_async_bad_source(b, t, file, line, gmem_src);
  b.async[t].q.push_back(AsyncCopy{smem_dst, gmem_src, AsyncCopies::UNCOMMITTED,
                                   reinterpret_cast<uintptr_t>(__builtin_return_address(0))});
  b.async_used = true;
}

void cp_async_commit(const char* file, int line) {
  unsigned t;
  Block& b = async_block(file, line, "cp.async.commit_group", &t);
  AsyncCopies& a = b.async[t];
  for (auto it = a.q.rbegin(); it != a.q.rend() && it->group == AsyncCopies::UNCOMMITTED; ++it) it->group = a.committed;
  ++a.committed;  // with no copies: an empty group, trivially complete
  b.async_used = true;
}

void cp_async_wait(const char* file, int line, int n) {
  unsigned t;
  Block& b = async_block(file, line, "cp.async.wait_group", &t);
  if (n < 0)
    thread_fail(b, lane_str(b, t) + " at cp.async.wait_group at " + where_str(file, line) +
                       ": N = " + std::to_string(n) + " (must be 0 or more)");
  AsyncCopies& a = b.async[t];
  // Every committed group but the newest n completes: its copies land now, in order.
  // Copies not yet committed stay in flight.
  size_t k = 0;
  for (; k < a.q.size() && a.q[k].group != AsyncCopies::UNCOMMITTED &&
         a.q[k].group + static_cast<unsigned>(n) < a.committed;
       ++k) {
    racecheck_access(a.q[k].dst, 16, true, a.q[k].pc);  // the copy's write, by its issuing code
    std::memcpy(a.q[k].dst, a.q[k].src, 16);
  }
  a.q.erase(a.q.begin(), a.q.begin() + static_cast<std::ptrdiff_t>(k));
}

}  // namespace cuda_emu
