// CUDA execution engine (test-only): the sm_90 warpgroup MMA (wgmma.fence, .mma_async
// m64nNk16 f32 += {bf16,f16} with A from a shared-memory matrix descriptor or from
// registers and B from a descriptor, K-major or MN-major (imm-trans-b), .commit_group,
// .wait_group), as the PTX ISA defines them ("Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Instructions": register fragments, shared memory matrix layouts and
// their canonical layouts, the matrix descriptor); kernels reach them through
// kernels/hopper.cuh.
//
// The model. The 128 threads of an aligned warpgroup (warps 4k..4k+3) meet at each
// instruction (same instruction, same call site, uniform operands). mma_async reads A
// (64x16, from shared memory, or from the 4 registers of each thread in the PTX ISA's
// m64nNk16 A fragment) and B (Nx16: K-major, B[n][k] rows of 16 k values, or MN-major,
// 16 rows of N values) and the accumulators when it is issued, and fills every thread's accumulator registers with a NaN tag; its result
// is written into them only by the wait_group that retires its group (commit_group makes
// the uncommitted ops one group; wait_group N retires all but the newest N groups).
// mma_asyncs on the same accumulators chain in order. D = C (scale-d 1) or 0, plus the 16
// products in k order in fp32 (a tensor core agrees to a few ulps, not bitwise).
//
// wgmma is an sm_90a feature: on any device profile but compute capability 9.0 (the b200's
// 10.0 included) it fails with an illegal instruction.
//
// Stricter than a GPU (each fails the launch naming the call site): a warpgroup with a
// thread missing, exited or at another instruction (a missing thread deadlocks, and the
// report names the instruction); operands that differ between threads; an mma_async with
// no wgmma.fence since the warpgroup's last wait_group (a GPU needs it only after the
// registers were written, which the engine cannot see); a descriptor with a swizzle mode
// other than none or 128B, a non-zero base offset, a 128B-swizzled start outside the
// first 128-byte row of a 1024-byte block, or rows outside the dynamic shared memory; an
// operand row a bulk copy still in flight writes; a store to the accumulators, or to the
// shared memory an op read, or to an A register of a register-A op, before the wait_group
// that retires it (a GPU may read the registers any time until then); imm-trans-b on a
// non-16-bit type (the engine's types are bf16 and f16 only, so the wrappers cannot pass
// one: kernels/hopper.cuh static_asserts it); a block that exits with wgmma unretired. Reading the accumulators early is not detected as such: they
// hold the NaN tag then.
#include "kernel_exec_internal.h"

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace cuda_emu {

namespace {

// A signalling NaN: a copy keeps its bits, arithmetic on it (even x * 1) quiets it, so a
// write of any value computed from it differs from the tag.
constexpr uint32_t ACC_TAG = 0x7f8afe57u;
constexpr unsigned UNCOMMITTED = ~0u;

struct WgmmaIo {
  int type, n;
  float* d;
  uint64_t adesc, bdesc;
  bool scale_d;
  const uint32_t* a;  // A from registers (4 of this thread's), or null: from adesc
  bool trans_b;
};

// The m64nNk16 accumulator fragment (PTX ISA, "Register Fragments: wgmma .m64nNk16",
// matrix D): thread t of the warpgroup (warp w = t / 32, g = lane / 4, q = lane % 4)
// holds d[i], i < N / 2, = D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)].
// The one place the engine knows it (kernels/hopper.cuh documents it for kernels).
inline int acc_row(unsigned t, int i) { return static_cast<int>(16 * (t / 32) + (t % 32) / 4) + 8 * ((i >> 1) & 1); }
inline int acc_col(unsigned t, int i) { return 8 * (i >> 2) + 2 * static_cast<int>(t % 4) + (i & 1); }

// The m64nNk16 A fragment for .f16/.bf16 (PTX ISA, "Register Fragments: wgmma .m64nNk16",
// matrix A, its figure): thread t holds a0..a7, two a register, a(2j) in the low half of
// register j; element a_i = A[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)]
// (mma.m16n8k16's A fragment, one 16-row slab per warp). Written out on its own, although
// it coincides with the accumulator's first 8 entries: that coincidence is what lets a
// kernel feed D's registers back as A (FlashAttention-3's P), and a table that is data
// says so rather than assumes it.
inline int afrag_row(unsigned t, int i) { return static_cast<int>(16 * (t / 32) + (t % 32) / 4) + 8 * ((i >> 1) & 1); }
inline int afrag_col(unsigned t, int i) { return 8 * (i >> 2) + 2 * static_cast<int>(t % 4) + (i & 1); }

[[gnu::cold, gnu::noinline, noreturn]] void fail_at(Block& b, unsigned t, int op, const char* file, int line,
                                                    const std::string& why, cudaError_t e = cudaErrorLaunchFailure) {
  thread_fail(b, lane_str(b, t) + " at " + op_name(op) + " at " + where_str(file, line) + ": " + why, e);
}

const char* RULE =
    " (.sync.aligned: all 128 threads of an aligned warpgroup, warps 4k to 4k+3, execute the same instruction)";

// Parks the calling thread until its warpgroup's 128 threads reach the same instruction;
// true for the last one, which then completes it (the others resume after it returns
// through wg_release).
bool wg_gather(Block& b, unsigned t, int op, const char* file, int line, const void* io) {
  Thread& th = b.threads[t];
  th.op = op;
  th.file = file;
  th.line = line;
  th.io = io;
  const unsigned wg = t / 128;
  if (b.n < (wg + 1) * 128)
    fail_at(b, t, op, file, line,
            "the block has " + std::to_string(b.n) + " threads, so warpgroup " + std::to_string(wg) +
                " lacks threads " + std::to_string(b.n) + "-" + std::to_string((wg + 1) * 128 - 1) + RULE);
  for (unsigned w = 4 * wg; w < 4 * wg + 4; ++w)
    if (b.warps[w].exited)
      fail_at(b, t, op, file, line, "threads of warp " + std::to_string(w) + " of its warpgroup already exited" + RULE);
  if (b.hopper.wgs.size() <= wg) b.hopper.wgs.resize(wg + 1);
  WarpGroupState& s = b.hopper.wgs[wg];
  if (s.count == 0) {
    s.op = op;
    s.file = file;
    s.line = line;
  } else if (s.op != op || s.line != line || std::strcmp(s.file, file) != 0) {
    fail_at(b, t, op, file, line,
            "other threads of its warpgroup wait at " + std::string(op_name(s.op)) + " at " +
                where_str(s.file, s.line) + RULE);
  }
  s.arrived[(t / 32) % 4] |= 1u << (t % 32);
  if (++s.count < 128) {
    thread_park(b, th);
    return false;
  }
  return true;
}

void wg_release(Block& b, unsigned t) {
  const unsigned wg = t / 128;
  WarpGroupState& s = b.hopper.wgs[wg];
  s.count = 0;
  s.arrived = {};
  for (unsigned w = 4 * wg; w < 4 * wg + 4; ++w) racecheck_warp_sync(*b.w, b, w);
  for (unsigned i = wg * 128; i < wg * 128 + 128; ++i)
    if (i != t) b.make_runnable(i);
}

// ----------------------------------------------------------------------------
// Matrix descriptors (PTX ISA, "Matrix Descriptor Format"): start address bits 0-13,
// leading dimension byte offset 16-29, stride dimension byte offset 32-45 (each >> 4),
// matrix base offset 49-51, swizzle mode 62-63 (0 none, 1 128B, 2 64B, 3 32B). Addresses
// are offsets in the shared window, which here starts at the dynamic shared memory.
// K-major operands of 16-bit elements, row r (of M or N) and 16-byte chunk c (8 k values):
//   none: start + (r / 8) SBO + (r % 8) 16 + c LBO           (8x16-byte core matrices)
//   128B: a = start + (r / 8) SBO + (r % 8) 128 + 16 c, then bits 4-6 ^= bits 7-9
// MN-major (B with imm-trans-b 1; the PTX ISA's canonical layouts, T = 8 16-bit elements):
// row k (< 16) holds N values, 16-byte chunk j = n / 8 of it at
//   none ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)): start + (k % 8) 16 + (k / 8) LBO + j SBO
//   128B ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): a = start + (k % 8) 128 + (k / 8) SBO +
//        (j % 8) 16 + (j / 8) LBO, then bits 4-6 ^= bits 7-9
// `rows` 16-byte rows are returned in order (K-major: 2 r + c; MN-major: k (N / 8) + j).
const char* operand_rows(Block& b, uint64_t desc, int rows, std::vector<const char*>& out, bool mn_major = false) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3fff) << 4;
  const uint32_t lbo = static_cast<uint32_t>(desc >> 16 & 0x3fff) << 4;
  const uint32_t sbo = static_cast<uint32_t>(desc >> 32 & 0x3fff) << 4;
  const int base_offset = static_cast<int>(desc >> 49 & 7), mode = static_cast<int>(desc >> 62 & 3);
  if (mode == 2 || mode == 3) return "its swizzle mode (64B or 32B) is not modelled by the engine (none and 128B are)";
  if (base_offset != 0) return "its matrix base offset is not 0 (not modelled by the engine)";
  if (mode == 1 && (start >> 7 & 7) != 0)
    return "a 128B-swizzled operand must start in the first 128-byte row of a 1024-byte block";
  if (mn_major) {
    for (uint32_t k = 0; k < 16; ++k)
      for (uint32_t j = 0; j < static_cast<uint32_t>(rows) / 8; ++j) {
        uint32_t a;
        if (mode == 0) a = start + (k % 8) * 16 + (k / 8) * lbo + j * sbo;
        else {
          a = start + (k % 8) * 128 + (k / 8) * sbo + (j % 8) * 16 + (j / 8) * lbo;
          a ^= (a >> 7 & 7) << 4;
        }
        if (a + 16 > b.w->smem_size) return "its rows run past the block's dynamic shared memory";
        out.push_back(b.w->smem_base + a);
      }
    return nullptr;
  }
  for (int r = 0; r < rows; ++r)
    for (uint32_t c = 0; c < 2; ++c) {
      uint32_t a;
      if (mode == 0) a = start + static_cast<uint32_t>(r / 8) * sbo + static_cast<uint32_t>(r % 8) * 16 + c * lbo;
      else {
        a = start + static_cast<uint32_t>(r / 8) * sbo + static_cast<uint32_t>(r % 8) * 128 + 16 * c;
        a ^= (a >> 7 & 7) << 4;
      }
      if (a + 16 > b.w->smem_size) return "its rows run past the block's dynamic shared memory";
      out.push_back(b.w->smem_base + a);
    }
  return nullptr;
}

// Checks that no bulk copy in flight writes the op's rows.
void rows_not_in_flight(Block& b, unsigned t, const char* file, int line, const WgmmaOp& op) {
  if (op.rows.empty()) return;
  const char* lo = op.rows.front();
  const char* hi = lo;
  for (const char* r : op.rows) lo = r < lo ? r : lo, hi = r > hi ? r : hi;
  for (const MBarrier& m : b.hopper.mbars)
    for (const BulkCopy& c : m.copies) {
      if (c.dst >= hi + 16 || c.dst + c.bytes <= lo) continue;  // clear of all of them
      for (const char* r : op.rows)
        if (r < c.dst + c.bytes && c.dst < r + 16)
          fail_at(b, t, OP_WGMMA_MMA, file, line,
                  "it reads shared offset " + std::to_string(r - b.w->smem_base) + ", which the bulk copy issued at " +
                      where_str(c.file, c.line) + " has not written yet (its mbarrier's phase " +
                      std::to_string(m.phase) + " has not completed: wait on the right parity)");
    }
}

void operands_read(Block& b, unsigned t, const char* file, int line, const WgmmaIo& io, WgmmaOp& op) {
  float (*cvt)(uint32_t) = io.type == MMA_F16 ? f16_bits : bf16_bits;
  if (io.a != nullptr) {  // A from the threads' registers, through the fragment table
    op.a.assign(64 * 16, 0.0f);
    op.areg_vals.resize(128 * 4);
    for (unsigned i = 0; i < 128; ++i) {
      std::memcpy(&op.areg_vals[4 * i], op.areg[i], 16);
      for (int e = 0; e < 8; ++e)
        op.a[static_cast<size_t>(afrag_row(i, e) * 16 + afrag_col(i, e))] =
            cvt(op.areg_vals[4 * i + static_cast<unsigned>(e / 2)] >> (16 * (e % 2)));
    }
  }
  for (int which = io.a != nullptr ? 1 : 0; which < 2; ++which) {
    const int rows = which == 0 ? 64 : io.n;
    const bool mn = which == 1 && io.trans_b;
    const size_t first = op.rows.size();
    if (const char* why = operand_rows(b, which == 0 ? io.adesc : io.bdesc, rows, op.rows, mn))
      fail_at(b, t, OP_WGMMA_MMA, file, line, std::string(which == 0 ? "A" : "B") + " descriptor: " + why);
    std::vector<float>& dst = which == 0 ? op.a : op.b;
    dst.assign(static_cast<size_t>(rows) * 16, 0.0f);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 2; ++c)
        for (int e = 0; e < 8; ++e) {
          // element (r, k = 8 c + e): K-major row 2 r + c; MN-major row k (N / 8) + r / 8, value r % 8
          const int k = 8 * c + e;
          const char* row = mn ? op.rows[first + static_cast<size_t>(k * (rows / 8) + r / 8)]
                               : op.rows[first + static_cast<size_t>(2 * r + c)];
          uint16_t h;
          std::memcpy(&h, row + 2 * (mn ? r % 8 : e), 2);
          dst[static_cast<size_t>(r) * 16 + static_cast<size_t>(k)] = cvt(h);
        }
  }
  op.row_bytes.resize(op.rows.size() * 16);
  for (size_t i = 0; i < op.rows.size(); ++i) std::memcpy(&op.row_bytes[16 * i], op.rows[i], 16);
  rows_not_in_flight(b, t, file, line, op);
}

// mma_async, completed by the warpgroup's last thread: checks, reads, queues the op.
void mma_issue(Block& b, unsigned t, const char* file, int line) {
  const unsigned wg0 = t / 128 * 128;
  WarpGroupState& s = b.hopper.wgs[t / 128];
  const auto& io = *static_cast<const WgmmaIo*>(b.threads[t].io);
  for (unsigned i = wg0; i < wg0 + 128; ++i) {
    const auto& o = *static_cast<const WgmmaIo*>(b.threads[i].io);
    if (o.type != io.type || o.n != io.n || (io.a == nullptr && o.adesc != io.adesc) || o.bdesc != io.bdesc ||
        o.scale_d != io.scale_d || (o.a == nullptr) != (io.a == nullptr) || o.trans_b != io.trans_b)
      fail_at(b, i, OP_WGMMA_MMA, file, line,
              "its shape, type, descriptors, scale-d, A's source or imm-trans-b differ from those of " +
                  lane_str(b, t) + RULE);
  }
  if (!s.fenced)
    fail_at(b, t, OP_WGMMA_MMA, file, line,
            "no wgmma.fence since the warpgroup's last wgmma.wait_group (or the kernel's start): a wgmma.fence "
            "must order the register writes before the first mma_async that reads them");
  WgmmaOp op;
  op.n = io.n;
  op.scale_d = io.scale_d;
  op.trans_b = io.trans_b;
  op.file = file;
  op.line = line;
  op.group = UNCOMMITTED;
  for (unsigned i = 0; i < 128; ++i) {
    const auto* o = static_cast<const WgmmaIo*>(b.threads[wg0 + i].io);
    op.acc[i] = o->d;
    op.areg[i] = o->a;
  }
  if (io.a != nullptr)  // an A register that is also an accumulator would be overwritten by the op itself
    for (unsigned i = 0; i < 128; ++i)
      for (int r = 0; r < 4; ++r)
        for (int j = 0; j < op.n / 2; ++j)
          if (static_cast<const void*>(op.areg[i] + r) == static_cast<const void*>(op.acc[i] + j))
            fail_at(b, wg0 + i, OP_WGMMA_MMA, file, line,
                    "A register " + std::to_string(r) + " is its own accumulator d[" + std::to_string(j) + "]");
  operands_read(b, t, file, line, io, op);
  for (const WgmmaOp& o : s.ops)
    if (o.acc == op.acc) op.chained = true;
  op.c.assign(static_cast<size_t>(64 * op.n), 0.0f);
  if (!op.chained && op.scale_d)
    for (unsigned i = 0; i < 128; ++i)
      for (int j = 0; j < op.n / 2; ++j) op.c[static_cast<size_t>(acc_row(i, j) * op.n + acc_col(i, j))] = op.acc[i][j];
  for (unsigned i = 0; i < 128; ++i)
    for (int j = 0; j < op.n / 2; ++j) std::memcpy(&op.acc[i][j], &ACC_TAG, 4);
  s.ops.push_back(std::move(op));
}

// Retires the oldest op: checks what it read and its accumulators, computes D and hands
// it to the next op on the same accumulators, or writes it into their registers.
void mma_retire(Block& b, unsigned t, const char* file, int line, WarpGroupState& s) {
  WgmmaOp& op = s.ops.front();
  const std::string issued = "the wgmma.mma_async issued at " + where_str(op.file, op.line);
  for (size_t i = 0; i < op.rows.size(); ++i)
    if (std::memcmp(op.rows[i], &op.row_bytes[16 * i], 16) != 0)
      fail_at(b, t, OP_WGMMA_WAIT, file, line,
              "shared offset " + std::to_string(op.rows[i] - b.w->smem_base) + ", read by " + issued +
                  ", was written before this wait_group retired it");
  const unsigned wg0 = t / 128 * 128;
  if (op.areg[0] != nullptr)
    for (unsigned i = 0; i < 128; ++i)
      for (unsigned r = 0; r < 4; ++r)
        if (op.areg[i][r] != op.areg_vals[4 * i + r])
          fail_at(b, wg0 + i, OP_WGMMA_WAIT, file, line,
                  "A register " + std::to_string(r) + " of " + issued +
                      " (A from registers) was written before the wait_group that retires it");
  for (unsigned i = 0; i < 128; ++i)
    for (int j = 0; j < op.n / 2; ++j)
      if (std::memcmp(&op.acc[i][j], &ACC_TAG, 4) != 0)
        fail_at(b, wg0 + i, OP_WGMMA_WAIT, file, line,
                "accumulator d[" + std::to_string(j) + "] of " + issued +
                    " was written before the wait_group that retires it");
  op.d.assign(op.c.begin(), op.c.end());
  if (!op.scale_d) std::fill(op.d.begin(), op.d.end(), 0.0f);
  for (int k = 0; k < 16; ++k)
    for (int r = 0; r < 64; ++r)
      for (int n = 0; n < op.n; ++n)
        op.d[static_cast<size_t>(r * op.n + n)] +=
            op.a[static_cast<size_t>(r * 16 + k)] * op.b[static_cast<size_t>(n * 16 + k)];
  for (size_t k = 1; k < s.ops.size(); ++k)
    if (s.ops[k].acc == op.acc) {  // the next op on these accumulators starts from D
      s.ops[k].c = std::move(op.d);
      s.ops[k].chained = false;
      s.ops.pop_front();
      return;
    }
  for (unsigned i = 0; i < 128; ++i)
    for (int j = 0; j < op.n / 2; ++j) op.acc[i][j] = op.d[static_cast<size_t>(acc_row(i, j) * op.n + acc_col(i, j))];
  s.ops.pop_front();
}

Block& wg_block(const char* file, int line, int op, unsigned* t) {
  Block& b = current_block(file, line, op_name(op));
  *t = static_cast<unsigned>(cur_thread() - b.threads.data());
  require_sm90(b, *t, op_name(op), file, line, true);
  b.hopper.used = true;
  return b;
}

}  // namespace

std::string wgmma_block_end(Block& b) {
  for (size_t wg = 0; wg < b.hopper.wgs.size(); ++wg)
    if (!b.hopper.wgs[wg].ops.empty()) {
      const WgmmaOp& op = b.hopper.wgs[wg].ops.front();
      return "warpgroup " + std::to_string(wg) + " exits with the wgmma.mma_async issued at " +
             where_str(op.file, op.line) + " not retired by a wgmma.wait_group";
    }
  return "";
}

// ----------------------------------------------------------------------------
// Device-side entry points (cuda_emu_device.h).
void wgmma_fence(const char* file, int line) {
  unsigned t;
  Block& b = wg_block(file, line, OP_WGMMA_FENCE, &t);
  if (!wg_gather(b, t, OP_WGMMA_FENCE, file, line, nullptr)) return;
  b.hopper.wgs[t / 128].fenced = true;
  wg_release(b, t);
}

void wgmma_commit(const char* file, int line) {
  unsigned t;
  Block& b = wg_block(file, line, OP_WGMMA_COMMIT, &t);
  if (!wg_gather(b, t, OP_WGMMA_COMMIT, file, line, nullptr)) return;
  WarpGroupState& s = b.hopper.wgs[t / 128];
  for (auto& op : s.ops)
    if (op.group == UNCOMMITTED) op.group = s.committed;
  ++s.committed;
  wg_release(b, t);
}

void wgmma_wait(const char* file, int line, int n) {
  unsigned t;
  Block& b = wg_block(file, line, OP_WGMMA_WAIT, &t);
  if (n < 0) fail_at(b, t, OP_WGMMA_WAIT, file, line, "N = " + std::to_string(n) + " (must be 0 or more)");
  if (!wg_gather(b, t, OP_WGMMA_WAIT, file, line, nullptr)) return;
  WarpGroupState& s = b.hopper.wgs[t / 128];
  while (!s.ops.empty() && s.ops.front().group != UNCOMMITTED &&
         s.ops.front().group + static_cast<unsigned>(n) < s.committed)
    mma_retire(b, t, file, line, s);
  s.fenced = false;
  wg_release(b, t);
}

void wgmma_m64k16(const char* file, int line, MmaType type, int n, float* d, uint64_t adesc, uint64_t bdesc,
                  bool scale_d, const uint32_t* a, bool trans_b) {
  unsigned t;
  Block& b = wg_block(file, line, OP_WGMMA_MMA, &t);
  if (n < 8 || n > 256 || n % 8)
    fail_at(b, t, OP_WGMMA_MMA, file, line, "N = " + std::to_string(n) + " (must be a multiple of 8 from 8 to 256)");
  if (type != MMA_BF16 && type != MMA_F16)
    fail_at(b, t, OP_WGMMA_MMA, file, line,
            "type " + std::to_string(static_cast<int>(type)) + (trans_b ? " with imm-trans-b 1" : "") +
                ": the engine models .bf16 and .f16 (the only types imm-trans-b is defined for)");
  const WgmmaIo io{static_cast<int>(type), n, d, adesc, bdesc, scale_d, a, trans_b};
  if (!wg_gather(b, t, OP_WGMMA_MMA, file, line, &io)) return;
  mma_issue(b, t, file, line);
  wg_release(b, t);
}

}  // namespace cuda_emu
