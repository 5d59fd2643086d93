// CUDA execution engine (test-only): the sm_90 mbarrier objects and the bulk copies that
// complete on them, 1D (cp.async.bulk ... mbarrier::complete_tx::bytes) and tensor-map tiles
// (cp.async.bulk.tensor; the maps: tensor_map.cpp), as the PTX ISA defines them ("Parallel
// Synchronization and Communication Instructions: mbarrier", "Data Movement:
// cp.async.bulk, cp.async.bulk.tensor"); kernels reach them through kernels/hopper.cuh. A
// tensor copy is a bulk copy whose box is gathered (and swizzled, zero out of bounds) when it
// lands; its size is the whole box's.
//
// The model. An mbarrier has a phase, an expected arrival count (init's count, 1 to
// 2^20 - 1), a pending arrival count and a tx-count. arrive decrements the pending count,
// expect_tx raises the tx-count, a bulk copy lowers it by its size when it is issued. The
// phase completes when both counts are zero: then, and only then, the copies issued on
// it land in shared memory (their sources are read then), the phase advances, the pending
// count is reloaded and the tx-count cleared. try_wait.parity(p) is true once the phase
// of parity p has completed (the current phase's parity differs from p).
//
// Stricter than a GPU (each fails the launch naming the call site): a barrier outside
// shared memory or not 8-byte aligned; use before mbarrier.init or after mbarrier.inval;
// init of a live barrier; ordinary stores over a live barrier's 8 bytes; more arrivals in
// a phase than its count; a tx-count beyond +-(2^20 - 1); all arrivals in while the
// tx-count is negative (more bytes completed than expected: a GPU keeps the phase open);
// a bulk copy on a barrier whose initialising thread ran no fence.mbarrier_init or
// fence.proxy.async since the init; bulk operands that are not 16-byte aligned, a size
// that is not a non-zero multiple of 16, a source that is not device memory of the
// launch's device, a destination outside shared memory or overlapping a copy in flight;
// inval with copies in flight or threads waiting; a block that exits with copies in
// flight; and every sm_90 instruction on a device profile below compute capability 9.0.
// try_wait answers false once per phase before it suspends the thread, so a kernel that
// does not loop on it reads a phase that has not completed. A wait that can never
// complete leaves the block deadlocked; the report names the barrier and its counts.
#include "device_profile.h"
#include "kernel_exec_internal.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace cuda_emu {

namespace {

constexpr int64_t TX_LIMIT = (1 << 20) - 1;  // the PTX ISA's range of counts and tx-count
constexpr uint64_t TAG = 0x6d62617200000000ull;

uint64_t tag_of(const MBarrier& m) { return TAG | m.phase; }
void tag_write(const MBarrier& m) {
  const uint64_t v = tag_of(m);
  std::memcpy(m.addr, &v, 8);
}

std::string smem_where(const Worker& w, const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(w.smem_base);
  if (a >= base && a < base + w.smem_size) return "shared offset " + std::to_string(a - base);
  return "static __shared__ " + hex(a);
}

std::string bar_str(const Block& b, const MBarrier& m) {
  return "mbarrier at " + smem_where(*b.w, m.addr) + " (initialised at " + where_str(m.file, m.line) + " with count " +
         std::to_string(m.expected) + ")";
}
std::string counts_str(const MBarrier& m) {
  return "phase " + std::to_string(m.phase) + ", " + std::to_string(m.pending) + " of " + std::to_string(m.expected) +
         " arrivals pending, tx-count " + std::to_string(m.tx) + ", " + std::to_string(m.copies.size()) +
         " bulk copies in flight";
}

Block& hopper_block(const char* file, int line, const char* what, unsigned* t) {
  Block& b = current_block(file, line, what);
  *t = static_cast<unsigned>(cur_thread() - b.threads.data());
  require_sm90(b, *t, what, file, line);
  b.hopper.used = true;
  return b;
}

[[gnu::cold, gnu::noinline, noreturn]] void fail_at(Block& b, unsigned t, const char* what, const char* file, int line,
                                                    const std::string& why, cudaError_t e = cudaErrorLaunchFailure) {
  thread_fail(b, lane_str(b, t) + " at " + what + " at " + where_str(file, line) + ": " + why, e);
}

// An mbarrier operand must be 8-byte aligned and in this block's shared memory.
void mbar_addr_check(Block& b, unsigned t, const char* what, const char* file, int line, const uint64_t* bar) {
  const auto a = reinterpret_cast<uintptr_t>(bar);
  if (a & 7u)
    fail_at(b, t, what, file, line, "mbarrier " + hex(a) + " is not 8-byte aligned", cudaErrorMisalignedAddress);
  if (!in_shared(*b.w, bar, 8))
    fail_at(b, t, what, file, line, "mbarrier " + hex(a) + " " + not_shared_str(*b.w, b.threads[t], bar, 8),
            cudaErrorIllegalAddress);
}

// The live barrier at `bar`, after the address checks.
MBarrier& mbar_get(Block& b, unsigned t, const char* what, const char* file, int line, const uint64_t* bar) {
  mbar_addr_check(b, t, what, file, line, bar);
  for (MBarrier& m : b.hopper.mbars) {
    if (m.addr != reinterpret_cast<const char*>(bar)) continue;
    uint64_t now;
    std::memcpy(&now, m.addr, 8);
    if (now != tag_of(m))
      fail_at(b, t, what, file, line,
              bar_str(b, m) +
                  " was overwritten by an ordinary store (its 8 bytes belong to the barrier until "
                  "mbarrier.inval)");
    return m;
  }
  fail_at(b, t, what, file, line,
          "mbarrier at " + smem_where(*b.w, bar) + " is used before mbarrier.init (or after mbarrier.inval)");
}

// The phase completes: the copies whose bytes completed land, the phase advances,
// waiters resume. Copies not completed yet stay in flight (for a later phase).
// A tensor copy's box lands: element (i0, .., i4) of the box (dim 0 innermost, packed) at
// byte offset (linear index) x element size from dst, that offset's 16-byte chunk XORed with
// bits 7-9 of its shared address under the 128B swizzle (as wgmma's 128B descriptors read
// it); an element whose global coordinate is out of bounds is zero.
void tensor_land(const Worker& w, const BulkCopy& c) {
  const TensorMapDesc& t = c.map;
  const unsigned es = t.elem_bytes;
  const uintptr_t base = reinterpret_cast<uintptr_t>(w.smem_base);
  const uintptr_t d0 = reinterpret_cast<uintptr_t>(c.dst);
  const bool dyn = d0 >= base && d0 < base + w.smem_size;
  const uintptr_t sa0 = dyn ? d0 - base : d0;  // the shared address the swizzle reads
  int idx[5] = {0, 0, 0, 0, 0};
  const uint64_t n = c.bytes / es;
  for (uint64_t e = 0; e < n; ++e) {
    bool in = true;
    uint64_t off = 0;
    for (int d = 0; d < t.rank; ++d) {
      const int64_t g = static_cast<int64_t>(c.coord[d]) + idx[d];
      in = in && g >= 0 && static_cast<uint64_t>(g) < t.dim[d];
      off += static_cast<uint64_t>(g) * t.stride[d];
    }
    uintptr_t sa = sa0 + e * es;
    if (t.swizzle == 3) sa ^= ((sa >> 7) & 7u) << 4;
    char* to = reinterpret_cast<char*>(dyn ? base + sa : sa);
    if (in) std::memcpy(to, reinterpret_cast<const char*>(t.addr + off), es);
    else std::memset(to, 0, es);
    for (int d = 0; d < t.rank && ++idx[d] == t.box[d]; ++d) idx[d] = 0;
  }
}

void phase_complete(Block& b, MBarrier& m) {
  size_t kept = 0;
  for (BulkCopy& c : m.copies) {
    if (c.done) {
      if (c.src) std::memcpy(c.dst, c.src, c.bytes);
      else tensor_land(*b.w, c);
      racecheck_forget(c.dst, c.bytes);
      --b.w->bulk_in_flight;
    } else m.copies[kept++] = c;
  }
  m.copies.resize(kept);
  ++m.phase;
  m.pending = m.expected;
  m.tx = 0;
  tag_write(m);
  for (unsigned w : m.waiters) b.make_runnable(w);
  m.waiters.clear();
}

// After an arrival or a tx change: completes the phase when both counts are zero; the
// reason it cannot be ("" when none).
std::string phase_advance(Block& b, MBarrier& m) {
  if (m.tx > TX_LIMIT || m.tx < -TX_LIMIT)
    return bar_str(b, m) + ": the tx-count leaves the PTX ISA's range +-(2^20 - 1) (" + counts_str(m) + ")";
  if (m.pending != 0) return "";
  if (m.tx < 0)
    return bar_str(b, m) + ": every arrival of the phase is in but bulk copies completed " + std::to_string(-m.tx) +
           " bytes more than expect_tx announced (" + counts_str(m) +
           "); a GPU keeps the phase open until more bytes are expected";
  if (m.tx == 0) phase_complete(b, m);
  return "";
}
void phase_check(Block& b, unsigned t, MBarrier& m, const char* what, const char* file, int line) {
  std::string why = phase_advance(b, m);
  if (!why.empty()) fail_at(b, t, what, file, line, why);
}

// The bulk copies in flight on m finish (complete_tx): the engine lets them finish as
// late as it can, when a thread waits on the barrier or nothing else can run.
std::string copies_finish(Block& b, MBarrier& m) {
  bool any = false;
  for (BulkCopy& c : m.copies)
    if (!c.done) {
      c.done = true;
      m.tx -= static_cast<int32_t>(c.bytes);
      any = true;
    }
  return any ? phase_advance(b, m) : "";
}

uint64_t arrive(const char* file, int line, uint64_t* bar, uint32_t tx, const char* what) {
  unsigned t;
  Block& b = hopper_block(file, line, what, &t);
  MBarrier& m = mbar_get(b, t, what, file, line, bar);
  if (m.pending == 0)
    fail_at(b, t, what, file, line,
            bar_str(b, m) + ": one arrival more than the count in this phase (" + counts_str(m) + ")");
  const uint64_t state = tag_of(m);
  m.tx += static_cast<int32_t>(std::min<uint32_t>(tx, TX_LIMIT + 1));
  --m.pending;
  phase_check(b, t, m, what, file, line);
  return state;
}

void fence(const char* file, int line, const char* what) {
  unsigned t;
  Block& b = hopper_block(file, line, what, &t);
  for (MBarrier& m : b.hopper.mbars)
    if (m.init_t == t) m.fenced = true;
}

constexpr const char* BULK = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes";

// A bulk copy completes on m only after its initialising thread fenced the init for the
// async proxy.
void fence_check(Block& b, unsigned t, const char* what, const char* file, int line, const MBarrier& m) {
  if (!m.fenced)
    fail_at(b, t, what, file, line,
            bar_str(b, m) + " completes a bulk copy (the async proxy), but " + lane_str(b, m.init_t) +
                ", which initialised it, ran no fence.mbarrier_init.release.cluster or fence.proxy.async since");
}

// A destination may not overlap a copy still in flight (a GPU's result would depend on
// which lands last).
void overlap_check(Block& b, unsigned t, const char* what, const char* file, int line, const void* dst,
                   uint64_t bytes) {
  const auto d = reinterpret_cast<uintptr_t>(dst);
  for (const MBarrier& m : b.hopper.mbars)
    for (const BulkCopy& c : m.copies)
      if (d < reinterpret_cast<uintptr_t>(c.dst) + c.bytes && reinterpret_cast<uintptr_t>(c.dst) < d + bytes)
        fail_at(b, t, what, file, line,
                "its destination overlaps that of the bulk copy issued at " + where_str(c.file, c.line) +
                    ", still in flight on the " + bar_str(b, m));
}

void bulk_check(Block& b, unsigned t, const char* file, int line, void* dst, const void* src, uint32_t bytes) {
  if (bytes == 0 || bytes % 16)
    fail_at(b, t, BULK, file, line, "size " + std::to_string(bytes) + " is not a non-zero multiple of 16");
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d & 15u)
    fail_at(b, t, BULK, file, line, "shared destination " + hex(d) + " is not 16-byte aligned",
            cudaErrorMisalignedAddress);
  if (s & 15u)
    fail_at(b, t, BULK, file, line, "global source " + hex(s) + " is not 16-byte aligned", cudaErrorMisalignedAddress);
  if (!in_shared(*b.w, dst, bytes))
    fail_at(b, t, BULK, file, line,
            "shared destination " + hex(d) + " (" + std::to_string(bytes) + " bytes) " +
                not_shared_str(*b.w, b.threads[t], dst, bytes),
            cudaErrorIllegalAddress);
  const auto a = alloc_find(src, bytes);
  if (!a || a->pinned_host || a->device != b.launch->k->device)
    fail_at(b, t, BULK, file, line,
            "global source " + hex(s) + " (" + std::to_string(bytes) + " bytes) is not device memory of device " +
                std::to_string(b.launch->k->device) +
                " (host, pinned host, another device's or freed memory, or "
                "it runs past its allocation)",
            cudaErrorIllegalAddress);
  overlap_check(b, t, BULK, file, line, dst, bytes);
}

}  // namespace

// ----------------------------------------------------------------------------
void require_sm90(Block& b, unsigned t, const char* what, const char* file, int line, bool sm90a) {
  const rt::DeviceProfile* p = rt::device_profile();
  if (p && (sm90a ? p->major == 9 && p->minor == 0 : p->major >= 9)) return;
  const std::string dev = p ? std::string(p->name) + " (compute capability " + std::to_string(p->major) + "." +
                                  std::to_string(p->minor) + ")"
                            : "unknown";
  fail_at(b, t, what, file, line,
          (sm90a ? "an sm_90a instruction (compute capability 9.0 only), but the device is "
                 : "an sm_90 instruction, but the device is ") +
              dev + ": a GPU raises an illegal instruction",
          cudaErrorIllegalInstruction);
}

void hopper_block_start(Block& b) {
  b.w->bulk_in_flight = 0;
  if (!b.hopper.used) return;
  b.hopper.mbars.clear();
  b.hopper.wgs.clear();
  for (Thread& th : b.threads) th.mb_last = nullptr;
  b.hopper.used = false;
}

void bulk_in_flight_access(Block& b, const char* p, size_t n, bool write, uintptr_t pc) {
  if (b.cancel) return;
  for (const MBarrier& m : b.hopper.mbars)
    for (const BulkCopy& c : m.copies) {
      if (p >= c.dst + c.bytes || c.dst >= p + n) continue;
      const unsigned t = static_cast<unsigned>(cur_thread() - b.threads.data());
      b.cancel = true;  // the hook cannot throw: the thread unwinds at its next wait
      b.err = cudaErrorLaunchFailure;
      b.msg = lane_str(b, t) + (write ? " writes" : " reads") + " shared offset " + std::to_string(p - b.w->smem_base) +
              " at " + code_location(pc) + ", which the bulk copy issued at " + where_str(c.file, c.line) +
              " has not written yet (its " + bar_str(b, m) + " has not completed phase " + std::to_string(m.phase) +
              ": wait on the right parity)";
      return;
    }
}

bool hopper_progress(Block& b, std::string* why) {
  const size_t before = b.runnable.size();
  for (MBarrier& m : b.hopper.mbars) {
    *why = copies_finish(b, m);
    if (!why->empty()) return false;
  }
  return b.runnable.size() > before;
}

std::string hopper_block_end(Block& b) {
  for (const MBarrier& m : b.hopper.mbars)
    if (!m.copies.empty())
      return "the block exits with the bulk copy issued at " + where_str(m.copies[0].file, m.copies[0].line) +
             " still in flight: its " + bar_str(b, m) + " never completed the phase (" + counts_str(m) + ")";
  return wgmma_block_end(b);
}

std::string mbarrier_wait_str(const Block& b, const Thread& th) {
  for (const MBarrier& m : b.hopper.mbars)
    if (m.addr == th.io)
      return bar_str(b, m) + " waits for the phase of parity " + std::to_string(th.arg) + ": " + counts_str(m);
  return "mbarrier " + hex(reinterpret_cast<uintptr_t>(th.io));
}

// ----------------------------------------------------------------------------
// Device-side entry points (cuda_emu_device.h).
void mbarrier_init(const char* file, int line, uint64_t* bar, uint32_t count) {
  constexpr const char* what = "mbarrier.init.shared::cta.b64";
  unsigned t;
  Block& b = hopper_block(file, line, what, &t);
  if (count == 0 || count > TX_LIMIT)
    fail_at(b, t, what, file, line, "count " + std::to_string(count) + " (must be 1 to 2^20 - 1)");
  for (const MBarrier& m : b.hopper.mbars)
    if (m.addr == reinterpret_cast<const char*>(bar))
      fail_at(b, t, what, file, line, bar_str(b, m) + " is live: mbarrier.inval it before initialising it again");
  mbar_addr_check(b, t, what, file, line, bar);
  MBarrier m{reinterpret_cast<char*>(bar), count, count, 0, 0, file, line, t, false, {}, {}};
  tag_write(m);
  b.hopper.mbars.push_back(std::move(m));
}

void mbarrier_inval(const char* file, int line, uint64_t* bar) {
  constexpr const char* what = "mbarrier.inval.shared::cta.b64";
  unsigned t;
  Block& b = hopper_block(file, line, what, &t);
  MBarrier& m = mbar_get(b, t, what, file, line, bar);
  if (!m.copies.empty() || !m.waiters.empty())
    fail_at(b, t, what, file, line,
            bar_str(b, m) + " is invalidated while in use (" + counts_str(m) + ", " + std::to_string(m.waiters.size()) +
                " threads waiting)");
  const uint64_t zero = 0;
  std::memcpy(m.addr, &zero, 8);
  b.hopper.mbars.erase(b.hopper.mbars.begin() + (&m - b.hopper.mbars.data()));
}

uint64_t mbarrier_arrive(const char* file, int line, uint64_t* bar) {
  return arrive(file, line, bar, 0, "mbarrier.arrive.shared::cta.b64");
}
uint64_t mbarrier_arrive_expect_tx(const char* file, int line, uint64_t* bar, uint32_t tx) {
  return arrive(file, line, bar, tx, "mbarrier.arrive.expect_tx.shared::cta.b64");
}

bool mbarrier_try_wait_parity(const char* file, int line, uint64_t* bar, uint32_t parity) {
  constexpr const char* what = "mbarrier.try_wait.parity.shared::cta.b64";
  unsigned t;
  Block& b = hopper_block(file, line, what, &t);
  if (parity > 1) fail_at(b, t, what, file, line, "parity " + std::to_string(parity) + " (must be 0 or 1)");
  Thread& th = *cur_thread();
  for (;;) {
    MBarrier& m = mbar_get(b, t, what, file, line, bar);
    if ((m.phase & 1u) != parity) return true;
    const std::string why = copies_finish(b, m);
    if (!why.empty()) fail_at(b, t, what, file, line, why);
    if ((m.phase & 1u) != parity) return true;
    if (th.mb_last != bar || th.mb_phase_last != m.phase) {  // the first answer: not yet
      th.mb_last = bar;
      th.mb_phase_last = m.phase;
      return false;
    }
    m.waiters.push_back(t);
    th.op = OP_MBAR_WAIT;
    th.file = file;
    th.line = line;
    th.io = bar;
    th.arg = static_cast<int>(parity);
    thread_park(b, th);
  }
}

void fence_mbarrier_init(const char* file, int line) { fence(file, line, "fence.mbarrier_init.release.cluster"); }
void fence_proxy_async(const char* file, int line) { fence(file, line, "fence.proxy.async.shared::cta"); }

void tensor_copy_g2s(const char* file, int line, void* dst, const void* map, int rank, const int32_t* coord,
                     uint64_t* bar) {
  static constexpr const char* TBULK[] = {
      "",
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes",
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes",
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"};
  const char* what = TBULK[rank >= 1 && rank <= 5 ? rank : 0];
  unsigned t;
  Block& b = hopper_block(file, line, what, &t);
  MBarrier& m = mbar_get(b, t, what, file, line, bar);
  const TensorMapDesc* tm = tensor_map_decode(map);
  if (!tm)
    fail_at(b, t, what, file, line,
            "the tensor map at " + hex(reinterpret_cast<uintptr_t>(map)) +
                " is not one cuTensorMapEncodeTiled made (or not 64-byte aligned): a GPU's copy is undefined",
            cudaErrorIllegalAddress);
  if (tm->rank != rank)
    fail_at(b, t, what, file, line,
            "the tensor map has rank " + std::to_string(tm->rank) + ", the instruction " + std::to_string(rank) +
                " coordinates");
  uint64_t bytes = tm->elem_bytes;
  for (int d = 0; d < rank; ++d) bytes *= tm->box[d];
  const auto da = reinterpret_cast<uintptr_t>(dst);
  if (da % 128 != 0)
    fail_at(b, t, what, file, line, "shared destination " + hex(da) + " is not 128-byte aligned",
            cudaErrorMisalignedAddress);
  if (!in_shared(*b.w, dst, bytes))
    fail_at(b, t, what, file, line,
            "shared destination " + hex(da) + " (the box's " + std::to_string(bytes) + " bytes) " +
                not_shared_str(*b.w, b.threads[t], dst, bytes),
            cudaErrorIllegalAddress);
  overlap_check(b, t, what, file, line, dst, bytes);
  // Each row of the box (dim 0's run) that lies in bounds must be device memory of the
  // launch's device.
  int idx[5] = {0, 0, 0, 0, 0};
  const int64_t lo0 = std::max<int64_t>(coord[0], 0),
                hi0 = std::min<int64_t>(static_cast<int64_t>(coord[0]) + tm->box[0], static_cast<int64_t>(tm->dim[0]));
  for (bool more = true; more;) {
    bool in = hi0 > lo0;
    uint64_t off = static_cast<uint64_t>(lo0) * tm->elem_bytes;
    for (int d = 1; d < rank; ++d) {
      const int64_t g = static_cast<int64_t>(coord[d]) + idx[d];
      in = in && g >= 0 && static_cast<uint64_t>(g) < tm->dim[d];
      off += static_cast<uint64_t>(g) * tm->stride[d];
    }
    if (in) {
      const void* src = reinterpret_cast<const void*>(tm->addr + off);
      const size_t run = static_cast<size_t>(hi0 - lo0) * tm->elem_bytes;
      const auto a = alloc_find(src, run);
      if (!a || a->pinned_host || a->device != b.launch->k->device)
        fail_at(b, t, what, file, line,
                "the box reads global " + hex(reinterpret_cast<uintptr_t>(src)) + " (" + std::to_string(run) +
                    " bytes), which is not device memory of device " + std::to_string(b.launch->k->device) +
                    " (host, pinned host, another device's or freed memory, or past its allocation: check the "
                    "map's address, dims and strides)",
                cudaErrorIllegalAddress);
    }
    more = false;
    for (int d = 1; d < rank; ++d) {
      if (++idx[d] < tm->box[d]) {
        more = true;
        break;
      }
      idx[d] = 0;
    }
  }
  fence_check(b, t, what, file, line, m);
  BulkCopy c{static_cast<char*>(dst),
             nullptr,
             static_cast<uint32_t>(bytes),
             file,
             line,
             reinterpret_cast<uintptr_t>(__builtin_return_address(0)),
             false,
             *tm,
             {0, 0, 0, 0, 0}};
  for (int d = 0; d < rank; ++d) c.coord[d] = coord[d];
  m.copies.push_back(c);
  ++b.w->bulk_in_flight;
}

void bulk_copy_g2s(const char* file, int line, void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  unsigned t;
  Block& b = hopper_block(file, line, BULK, &t);
  MBarrier& m = mbar_get(b, t, BULK, file, line, bar);
  bulk_check(b, t, file, line, dst, src, bytes);
  fence_check(b, t, BULK, file, line, m);
  m.copies.push_back(BulkCopy{static_cast<char*>(dst),
                              static_cast<const char*>(src),
                              bytes,
                              file,
                              line,
                              reinterpret_cast<uintptr_t>(__builtin_return_address(0)),
                              false,
                              {},
                              {}});
  ++b.w->bulk_in_flight;
}

}  // namespace cuda_emu
