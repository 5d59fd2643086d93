// CUDA execution engine: devices, streams, events and the stream-ordered scheduler.
// Every operation is a node whose dependencies follow CUDA's rules (stream order, the
// legacy default stream's implicit synchronisation with blocking streams, event waits).
// Each device has an executor thread. By default the scheduler is adversarial: work is
// held back until something needs it (a host synchronisation, a query, an eager NCCL
// collective) and then run in a seeded random order among what the rules allow, so a
// missing synchronisation shows as a wrong result in a test instead of on a user's GPU.
#include "device_profile.h"
#include "engine.h"
#include "memory_internal.h"
#include "runtime_internal.h"

#include <cuda.h>

#include <cuda_emu_trace.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace cuda_emu {

namespace rt {

// The card's limits (CUDA_EMU_DEVICE, device_profile.cpp); st() creates no device
// without a valid profile, so these are read only where one exists.
const DeviceProfile& prof() { return *device_profile(); }

thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;

// CUDA_VISIBLE_DEVICES as the driver reads it: a comma list of indices; the list ends at
// the first entry that is not a valid index.
std::vector<int> visible_parse(const char* env, int physical) {
  std::vector<int> out;
  if (!env) {
    for (int i = 0; i < physical; ++i) out.push_back(i);
    return out;
  }
  std::string s(env);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    char* end = nullptr;
    const long v = tok.empty() ? -1 : std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || v < 0 || v >= physical) break;
    bool dup = false;
    for (int d : out) dup = dup || d == v;
    if (dup) break;
    out.push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

State& st() {
  static State* s = [] {
    auto* n = new State();
    if (const char* c = std::getenv("CUDA_EMU_DEVICE_COUNT")) n->physical = std::max(0, std::atoi(c));
    if (!device_profile()) n->physical = 0;
    n->visible = visible_parse(std::getenv("CUDA_VISIBLE_DEVICES"), n->physical);
    const char* sched = std::getenv("CUDA_EMU_SCHEDULE");
    n->fifo = sched && std::string(sched) == "fifo";
    uint64_t seed = 1;
    if (const char* e = std::getenv("CUDA_EMU_SEED")) seed = std::strtoull(e, nullptr, 10);
    for (size_t i = 0; i < n->visible.size(); ++i) {
      auto d = std::make_unique<Device>();
      d->legacy = std::make_shared<Stream>();
      d->legacy->device = static_cast<int>(i);
      d->legacy->legacy = true;
      d->rng.seed(seed * 1000003 + i);
      n->devices.push_back(std::move(d));
    }
    static struct Reaper {
      State* s;
      ~Reaper() { delete s; }
    } reaper{n};
    return n;
  }();
  return *s;
}

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

// ----------------------------------------------------------------------------
// Scheduling (st().mu held).
void demand_locked(const OpPtr& root) {
  std::vector<Op*> stack{root.get()};
  while (!stack.empty()) {
    Op* o = stack.back();
    stack.pop_back();
    if (o->demanded || o->done) continue;
    o->demanded = true;
    st().devices[o->device]->cv.notify_all();
    for (auto& d : o->deps) stack.push_back(d.get());
  }
}

bool ready_locked(const Op& o) {
  for (auto& d : o.deps)
    if (!d->done) return false;
  return true;
}

void executor_loop(int dev) {
  State& s = st();
  Device& d = *s.devices[dev];
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    std::vector<size_t> ready;
    for (;;) {
      if (s.stop) return;
      ready.clear();
      for (size_t i = 0; i < d.pending.size(); ++i) {
        const Op& o = *d.pending[i];
        if (o.demanded && ready_locked(o)) {
          ready.push_back(i);
          if (s.fifo) break;  // pending is in issue order
        }
      }
      if (!ready.empty()) break;
      d.cv.wait(lock);
    }
    const size_t pick = s.fifo ? ready.front() : ready[d.rng() % ready.size()];
    OpPtr op = d.pending[pick];
    d.pending.erase(d.pending.begin() + static_cast<long>(pick));
    lock.unlock();
    OpFault fault;  // a memory fault in the op becomes the device's sticky error
    t_op_fault = &fault;
    op->fn();
    t_op_fault = nullptr;
    if (fault.state.load() == 2) {
      guards_reprotect();
      sticky_error_set(
          dev, cudaErrorIllegalAddress,
          op->what + " (stream-ordered work on device " + std::to_string(dev) + ") " + op_fault_report(fault));
    }
    op->fn = nullptr;
    lock.lock();
    op->done = true;
    op->finished = Clock::now();
    op->deps.clear();
    s.done_cv.notify_all();
    for (auto& other : s.devices) other->cv.notify_all();
  }
}

State::~State() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    for (auto& d : devices) d->cv.notify_all();
  }
  for (auto& d : devices)
    if (d->executor.joinable()) d->executor.join();
}

// Resolves a stream handle for the calling thread; nullptr when invalid (st().mu held).
std::shared_ptr<Stream> stream_locked(cudaStream_t s) {
  State& g = st();
  if (s == nullptr || s == cudaStreamLegacy) {
    if (t_device < 0 || t_device >= static_cast<int>(g.devices.size())) return nullptr;
    return g.devices[t_device]->legacy;
  }
  auto it = g.streams.find(s);
  return it == g.streams.end() ? nullptr : it->second;
}

OpPtr enqueue_locked(const std::shared_ptr<Stream>& sp, const char* what, std::function<void()> fn, bool eager) {
  State& g = st();
  Device& d = *g.devices[sp->device];
  if (!d.executor.joinable()) d.executor = std::thread(executor_loop, sp->device);
  auto op = std::make_shared<Op>();
  op->id = g.next_id++;
  op->what = what;
  op->fn = std::move(fn);
  op->device = sp->device;
  auto add = [&](const OpPtr& p) {
    if (p && !p->done) op->deps.push_back(p);
  };
  add(sp->last);
  if (sp->legacy) {
    for (auto& [h, other] : g.streams)
      if (other->device == sp->device && other->blocking) add(other->last);
  } else if (sp->blocking) {
    add(d.legacy->last);
  }
  sp->last = op;
  d.pending.push_back(op);
  if (eager || g.fifo) demand_locked(op);
  return op;
}

void wait_locked(std::unique_lock<std::mutex>& lock, const OpPtr& op) {
  if (!op) return;
  demand_locked(op);
  st().done_cv.wait(lock, [&] { return op->done; });
}

void device_sync_locked(std::unique_lock<std::mutex>& lock, int dev) {
  State& g = st();
  std::vector<OpPtr> all = g.devices[dev]->pending;
  for (auto& o : all) demand_locked(o);
  for (auto& o : all) g.done_cv.wait(lock, [&] { return o->done; });
}

// Memory the pool handed out comes back (its free ran); other memory is not the pool's.
void pool_release_locked(const void* p, int dev) {
  auto it = st().pool_allocs.find(p);
  if (it == st().pool_allocs.end()) return;
  st().devices[dev]->pool.used -= it->second;
  st().pool_allocs.erase(it);
}

// What a synchronisation does to the pool of `dev`: release reserved memory beyond the
// threshold (never memory in use).
void pool_trim_locked(int dev) {
  if (dev < 0 || dev >= static_cast<int>(st().devices.size())) return;
  Pool& p = st().devices[dev]->pool;
  if (p.reserved > p.release_threshold) p.reserved = std::max(p.used, p.release_threshold);
}

// The pool a handle names (only the devices' default pools exist); nullptr otherwise.
Pool* pool_locked(cudaMemPool_t handle) {
  for (auto& d : st().devices)
    if (handle == &d->pool) return &d->pool;
  return nullptr;
}

cudaError_t sticky_locked(int dev) {
  State& g = st();
  if (dev < 0 || dev >= static_cast<int>(g.devices.size())) return cudaErrorInvalidDevice;
  return g.devices[dev]->sticky;
}

// Entry check of every device API call: the device exists and carries no sticky error.
cudaError_t api_check(int dev) {
  State& g = st();
  if (g.devices.empty()) return cudaErrorNoDevice;
  std::lock_guard<std::mutex> lock(g.mu);
  return sticky_locked(dev);
}

void report(const std::string& detail) {
  {
    std::lock_guard<std::mutex> lock(st().mu);
    st().detail = detail;
  }
  std::fprintf(stderr, "cuda_emu: %s\n", detail.c_str());
}

void report_locked(const std::string& detail) {
  st().detail = detail;
  std::fprintf(stderr, "cuda_emu: %s\n", detail.c_str());
}

}  // namespace rt

using namespace rt;

// ----------------------------------------------------------------------------
// engine.h
int device_current() { return t_device; }
int device_count() { return static_cast<int>(st().devices.size()); }
int device_physical_count() { return st().physical; }
int device_of_physical(int physical) {
  const auto& v = st().visible;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == physical) return static_cast<int>(i);
  return -1;
}

int stream_device(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(st().mu);
  auto sp = stream_locked(s);
  return sp ? sp->device : -1;
}
bool stream_valid(cudaStream_t s) { return stream_device(s) >= 0; }

cudaError_t enqueue(cudaStream_t s, const char* what, std::function<void()> fn, bool eager) {
  std::lock_guard<std::mutex> lock(st().mu);
  auto sp = stream_locked(s);
  if (!sp) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
  if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
  if (sp->capture) capture_record_locked(*sp, what, std::move(fn), nullptr, eager);
  else enqueue_locked(sp, what, std::move(fn), eager);
  return cudaSuccess;
}

cudaError_t enqueue_replayable(cudaStream_t s, const char* what, std::function<std::function<void()>()> make,
                               bool eager) {
  {
    std::lock_guard<std::mutex> lock(st().mu);
    auto sp = stream_locked(s);
    if (!sp) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
    if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
    if (sp->capture) {
      capture_record_locked(*sp, what, nullptr, std::move(make), eager);
      return cudaSuccess;
    }
  }
  return enqueue(s, what, make(), eager);
}

void sticky_error_set(int device, cudaError_t err, const std::string& detail) {
  {
    std::lock_guard<std::mutex> lock(st().mu);
    if (device >= 0 && device < static_cast<int>(st().devices.size()) && st().devices[device]->sticky == cudaSuccess)
      st().devices[device]->sticky = err;
  }
  report(detail);
}

const char* last_error_detail() {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lock(st().mu);
  copy = st().detail;
  return copy.c_str();
}

void test_clear_errors() {
  std::lock_guard<std::mutex> lock(st().mu);
  for (auto& d : st().devices) d->sticky = cudaSuccess;
  st().detail.clear();
  t_last = cudaSuccess;
}

void launch_submit(const void* func, const LaunchSite& site, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   const void* const* pointers, int npointers, std::function<void()> body) {
  char buf[512];
  auto reject = [&](cudaError_t e, const std::string& why) {
    std::snprintf(buf, sizeof buf, "launch of %s at %s:%d rejected: %s", site.kernel, site.file, site.line,
                  why.c_str());
    report(buf);
    fail(e);
  };
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      threads > 1024) {
    std::snprintf(buf, sizeof buf,
                  "block (%u,%u,%u) exceeds the limits (x,y <= 1024, z <= 64, %llu threads > 1024 or 0)", block.x,
                  block.y, block.z, threads);
    return reject(cudaErrorInvalidConfiguration, buf);
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    std::snprintf(buf, sizeof buf, "grid (%u,%u,%u) exceeds the limits (x <= 2^31-1, y,z <= 65535, none 0)", grid.x,
                  grid.y, grid.z);
    return reject(cudaErrorInvalidConfiguration, buf);
  }
  State& g = st();
  std::unique_lock<std::mutex> lock(g.mu);
  auto sp = stream_locked(stream);
  if (!sp) {
    lock.unlock();
    return reject(cudaErrorInvalidResourceHandle, "invalid stream");
  }
  if (cudaError_t e = sticky_locked(sp->device)) {
    fail(e);
    return;
  }
  if (cudaError_t e = capture_gate_locked(sp)) {
    lock.unlock();
    return reject(e,
                  "the stream's capture was invalidated earlier, or the legacy stream was used while a blocking "
                  "stream captures");
  }
  Device& d = *g.devices[sp->device];
  int limit = static_cast<int>(prof().smem_per_block);
  if (auto it = d.smem_attr.find(func); it != d.smem_attr.end()) limit = std::max(limit, it->second);
  if (smem > static_cast<size_t>(limit)) {
    lock.unlock();
    std::snprintf(buf, sizeof buf,
                  "%zu bytes of dynamic shared memory exceed the %d allowed (48 KB unless "
                  "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) raised it, at most %zu on "
                  "the %s)",
                  smem, limit, prof().smem_per_block_optin, prof().name);
    return reject(cudaErrorInvalidValue, buf);
  }
  lock.unlock();
  for (int i = 0; i < npointers; ++i) {
    if (!pointers[i]) continue;
    auto a = alloc_find(pointers[i], 0);
    if (!a || (!a->pinned_host && a->device != sp->device)) {
      std::snprintf(buf, sizeof buf,
                    "pointer argument %d (%p) is not device memory of device %d (host memory, freed, or another "
                    "device's): the kernel would fault",
                    i + 1, pointers[i], sp->device);
      return reject(cudaErrorInvalidValue, buf);
    }
  }
  trace_kernel(site.kernel, grid, block, smem, sp->device);
  KernelLaunch k;
  k.name = site.kernel;
  k.file = site.file;
  k.line = site.line;
  k.func = func;
  k.grid = grid;
  k.block = block;
  k.dynamic_smem = smem;
  k.body = std::move(body);
  k.device = sp->device;
  lock.lock();
  sp = stream_locked(stream);
  if (!sp) return reject(cudaErrorInvalidResourceHandle, "invalid stream");
  auto run = [k = std::move(k)] {
    std::string detail;
    const auto t0 = std::chrono::steady_clock::now();
    const cudaError_t e = kernel_run(k, &detail);  // restores any guard page it opened
    device_busy_add(
        k.device, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    if (e != cudaSuccess) {
      sticky_error_set(k.device, e, detail);
      return;
    }
    const std::string over = mem_canaries_check();
    if (!over.empty())
      sticky_error_set(k.device, cudaErrorIllegalAddress,
                       "kernel " + k.name + " (launched at " + k.file + ":" + std::to_string(k.line) + "): " + over);
  };
  if (sp->capture) capture_record_locked(*sp, "kernel", std::move(run), nullptr, false);
  else enqueue_locked(sp, "kernel", std::move(run), false);
}

}  // namespace cuda_emu

// ----------------------------------------------------------------------------
// The CUDA runtime API.
using namespace cuda_emu;

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    // clang-format off
#define NAME(x) case x: return #x;
    NAME(cudaSuccess)
    NAME(cudaErrorInvalidValue)
    NAME(cudaErrorMemoryAllocation)
    NAME(cudaErrorInitializationError)
    NAME(cudaErrorInvalidConfiguration)
    NAME(cudaErrorInvalidDevicePointer)
    NAME(cudaErrorInvalidMemcpyDirection)
    NAME(cudaErrorInvalidDeviceFunction)
    NAME(cudaErrorNoDevice)
    NAME(cudaErrorInvalidDevice)
    NAME(cudaErrorInvalidResourceHandle)
    NAME(cudaErrorNotReady)
    NAME(cudaErrorIllegalAddress)
    NAME(cudaErrorLaunchOutOfResources)
    NAME(cudaErrorAssert)
    NAME(cudaErrorHardwareStackError)
    NAME(cudaErrorIllegalInstruction)
    NAME(cudaErrorMisalignedAddress)
    NAME(cudaErrorLaunchFailure)
    NAME(cudaErrorNotSupported)
    NAME(cudaErrorStreamCaptureUnsupported)
    NAME(cudaErrorIllegalState)
    NAME(cudaErrorStreamCaptureInvalidated)
    NAME(cudaErrorStreamCaptureMerge)
    NAME(cudaErrorStreamCaptureUnmatched)
    NAME(cudaErrorStreamCaptureUnjoined)
    NAME(cudaErrorStreamCaptureIsolation)
    NAME(cudaErrorStreamCaptureImplicit)
    NAME(cudaErrorCapturedEvent)
    NAME(cudaErrorStreamCaptureWrongThread)
    NAME(cudaErrorUnknown)
    // clang-format on
#undef NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorHardwareStackError: return "hardware stack error";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetLastError() {
  if (!st().devices.empty()) {
    std::lock_guard<std::mutex> lock(st().mu);
    if (cudaError_t e = sticky_locked(t_device); e != cudaSuccess && e != cudaErrorInvalidDevice) return e;
  }
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  if (!st().devices.empty()) {
    std::lock_guard<std::mutex> lock(st().mu);
    if (cudaError_t e = sticky_locked(t_device); e != cudaSuccess && e != cudaErrorInvalidDevice) return e;
  }
  return t_last;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count())
    return fail(device_count() == 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  const DeviceProfile& c = prof();
  std::snprintf(p->name, sizeof p->name, "%s (cuda_emu CPU execution engine), device %d", c.name, device);
  p->totalGlobalMem = c.total_mem;
  p->sharedMemPerBlock = c.smem_per_block;
  p->sharedMemPerBlockOptin = c.smem_per_block_optin;
  p->sharedMemPerMultiprocessor = c.smem_per_sm;
  p->regsPerBlock = c.regs_per_block;
  p->regsPerMultiprocessor = c.regs_per_sm;
  p->warpSize = 32;
  p->maxThreadsPerBlock = c.max_threads_per_block;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = c.major;
  p->minor = c.minor;
  p->multiProcessorCount = c.sm_count;
  p->maxThreadsPerMultiProcessor = c.max_threads_per_sm;
  p->maxBlocksPerMultiProcessor = c.max_blocks_per_sm;
  p->l2CacheSize = c.l2_bytes;
  p->memoryBusWidth = c.memory_bus_width;
  p->clockRate = c.clock_khz;
  p->memoryClockRate = c.memory_clock_khz;
  p->pciBusID = 0x18 + device;
  p->totalConstMem = 65536;
  p->memPitch = 2147483647;
  p->textureAlignment = 512;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  const DeviceProfile& c = prof();
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = c.max_threads_per_block; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(c.smem_per_block); break;
    case cudaDevAttrMaxRegistersPerBlock: *value = c.regs_per_block; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = c.sm_count; break;
    case cudaDevAttrComputeCapabilityMajor: *value = c.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = c.minor; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = c.max_threads_per_sm; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = static_cast<int>(c.smem_per_sm); break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = c.regs_per_sm; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(c.smem_per_block_optin); break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = c.max_blocks_per_sm; break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
  if (!v) return fail(cudaErrorInvalidValue);
  *v = 12040;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) { return cudaDriverGetVersion(v); }

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  if (!symbol || !fn || flags != cudaEnableDefault) return fail(cudaErrorInvalidValue);
  *fn = nullptr;
  cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
  if (std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0) {
    r = version >= 12000 ? cudaDriverEntryPointSuccess : cudaDriverEntryPointVersionNotSufficent;
    if (r == cudaDriverEntryPointSuccess) *fn = reinterpret_cast<void*>(&cuTensorMapEncodeTiled);
  }
  if (status) *status = r;
  return cudaSuccess;  // as the runtime: a symbol not found is *fn = null and the status
}

cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = api_check(t_device)) return fail(e);
  std::unique_lock<std::mutex> lock(st().mu);
  if (cudaError_t e = capture_sync_check_locked(nullptr, t_device)) return fail(e);
  device_sync_locked(lock, t_device);
  pool_trim_locked(t_device);
  return fail(sticky_locked(t_device));
}

cudaError_t cudaDeviceReset() {
  if (st().devices.empty()) return fail(cudaErrorNoDevice);
  std::unique_lock<std::mutex> lock(st().mu);
  device_sync_locked(lock, t_device);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  if (cudaError_t e = api_check(t_device)) return fail(e);
  if (!free_bytes || !total) return fail(cudaErrorInvalidValue);
  *total = prof().total_mem;
  *free_bytes = *total - std::min(*total, mem_used(t_device));
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = api_check(t_device)) return fail(e);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  {
    std::lock_guard<std::mutex> lock(st().mu);
    if (cudaError_t e = capture_unsafe_check_locked()) return fail(e);
  }
  const size_t total = prof().total_mem;
  if (size > total - std::min(total, mem_used(t_device))) return fail(cudaErrorMemoryAllocation);
  *ptr = mem_alloc(size, t_device, false);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto a = alloc_find(ptr, 0);
  if (!a || a->pinned_host || a->base != ptr) return fail(cudaErrorInvalidValue);
  {
    // Freeing waits for the device to finish the work that may still use the memory.
    std::unique_lock<std::mutex> lock(st().mu);
    if (cudaError_t e = capture_unsafe_check_locked()) return fail(e);
    if (cudaError_t e = capture_sync_check_locked(nullptr, a->device)) return fail(e);
    device_sync_locked(lock, a->device);
    pool_release_locked(ptr, a->device);
  }
  mem_free(ptr, nullptr, nullptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  if (st().devices.empty()) return fail(cudaErrorNoDevice);
  {
    std::lock_guard<std::mutex> lock(st().mu);
    if (cudaError_t e = capture_unsafe_check_locked()) return fail(e);
  }
  *ptr = mem_alloc(size, -1, true);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto a = alloc_find(ptr, 0);
  if (!a || !a->pinned_host || a->base != ptr) return fail(cudaErrorInvalidValue);
  {
    std::unique_lock<std::mutex> lock(st().mu);
    if (cudaError_t e = capture_unsafe_check_locked()) return fail(e);
    for (int d = 0; d < static_cast<int>(st().devices.size()); ++d)
      if (cudaError_t e = capture_sync_check_locked(nullptr, d)) return fail(e);
    for (int d = 0; d < static_cast<int>(st().devices.size()); ++d) device_sync_locked(lock, d);
  }
  mem_free(ptr, nullptr, nullptr);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  const int dev = stream_device(stream);
  if (dev < 0) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = api_check(dev)) return fail(e);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  {
    std::lock_guard<std::mutex> lock(st().mu);
    auto sp = stream_locked(stream);
    if (!sp) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
    if (sp->capture) return fail(capture_malloc_locked(*sp, ptr, size));
  }
  *ptr = mem_alloc(size, dev, false);
  if (!*ptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(st().mu);
  Pool& p = st().devices[dev]->pool;
  p.used += size;
  p.used_high = std::max(p.used_high, p.used);
  p.reserved = std::max(p.reserved, p.used);  // reuses what the pool holds, else grows
  p.reserved_high = std::max(p.reserved_high, p.reserved);
  st().pool_allocs[*ptr] = size;
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (!ptr) return cudaSuccess;
  auto a = alloc_find(ptr, 0);
  if (!a || a->pinned_host || a->base != ptr) return fail(cudaErrorInvalidValue);
  // Freed when the stream reaches this point; later use faults (quarantine). The memory
  // returns to the pool, which keeps it reserved until a synchronisation trims it.
  const int dev = a->device;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    auto sp = stream_locked(stream);
    if (!sp) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
    if (sp->capture) return fail(capture_free_locked(*sp, ptr));
  }
  return enqueue(stream, "cudaFreeAsync", [ptr, dev] {
    {
      std::lock_guard<std::mutex> lock(st().mu);
      pool_release_locked(ptr, dev);
    }
    mem_free(ptr, nullptr, nullptr);
  });
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (!pool) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = api_check(device)) return fail(e);
  *pool = &st().devices[device]->pool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  std::lock_guard<std::mutex> lock(st().mu);
  Pool* p = pool_locked(pool);
  if (!p || !value) return fail(cudaErrorInvalidValue);
  auto u64 = [value] { return *static_cast<const uint64_t*>(value); };
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
      p->reuse[attr - cudaMemPoolReuseFollowEventDependencies] = *static_cast<const int*>(value);
      return cudaSuccess;
    case cudaMemPoolAttrReleaseThreshold: p->release_threshold = u64(); return cudaSuccess;
    // "It is illegal to set this attribute to a non-zero value": zero resets the mark.
    case cudaMemPoolAttrReservedMemHigh:
      if (u64() != 0) return fail(cudaErrorInvalidValue);
      p->reserved_high = p->reserved;
      return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh:
      if (u64() != 0) return fail(cudaErrorInvalidValue);
      p->used_high = p->used;
      return cudaSuccess;
    case cudaMemPoolAttrReservedMemCurrent:  // read-only
    case cudaMemPoolAttrUsedMemCurrent: break;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  std::lock_guard<std::mutex> lock(st().mu);
  Pool* p = pool_locked(pool);
  if (!p || !value) return fail(cudaErrorInvalidValue);
  uint64_t v = 0;
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
      *static_cast<int*>(value) = p->reuse[attr - cudaMemPoolReuseFollowEventDependencies];
      return cudaSuccess;
    case cudaMemPoolAttrReleaseThreshold: v = p->release_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent: v = p->reserved; break;
    case cudaMemPoolAttrReservedMemHigh: v = p->reserved_high; break;
    case cudaMemPoolAttrUsedMemCurrent: v = p->used; break;
    case cudaMemPoolAttrUsedMemHigh: v = p->used_high; break;
    default: return fail(cudaErrorInvalidValue);
  }
  *static_cast<uint64_t*>(value) = v;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream || (flags & ~1u)) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = api_check(t_device)) return fail(e);
  auto s = std::make_shared<Stream>();
  s->device = t_device;
  s->blocking = !(flags & cudaStreamNonBlocking);
  std::lock_guard<std::mutex> lock(st().mu);
  st().streams[s.get()] = s;
  *stream = s.get();
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  // Pending work still runs; the handle is invalid from now on.
  std::lock_guard<std::mutex> lock(st().mu);
  if (stream == nullptr || stream == cudaStreamLegacy || !st().streams.erase(stream))
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::unique_lock<std::mutex> lock(st().mu);
  auto sp = stream_locked(stream);
  if (!sp) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = capture_sync_check_locked(sp.get(), -1)) return fail(e);
  if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
  if (sp->legacy) {
    // The legacy stream's next op waits for every blocking stream: synchronising it
    // means the same as enqueueing a marker there and waiting for it.
    wait_locked(lock, enqueue_locked(
                          sp, "sync marker", [] {}, false));
  } else {
    wait_locked(lock, sp->last);
  }
  pool_trim_locked(sp->device);
  return fail(sticky_locked(sp->device));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::unique_lock<std::mutex> lock(st().mu);
  auto sp = stream_locked(stream);
  if (!sp) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
  if (cudaError_t e = capture_sync_check_locked(sp.get(), -1)) return fail(e);
  if (!sp->last || sp->last->done) return cudaSuccess;
  demand_locked(sp->last);  // the work runs; a later query sees it done
  return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (flags != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(st().mu);
  auto sp = stream_locked(stream);
  auto it = st().events.find(event);
  if (!sp || it == st().events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
  bool handled = false;
  if (cudaError_t e = capture_event_wait_locked(sp, *it->second, &handled)) return fail(e);
  if (handled) return cudaSuccess;
  if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
  OpPtr rec = it->second->op;
  auto w = enqueue_locked(
      sp, "cudaStreamWaitEvent", [] {}, false);
  if (rec && !rec->done) w->deps.push_back(rec);  // captured now: later records do not count
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~3u)) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = api_check(t_device)) return fail(e);
  auto ev = std::make_unique<Event>();
  ev->device = t_device;
  ev->timing = !(flags & cudaEventDisableTiming);
  std::lock_guard<std::mutex> lock(st().mu);
  *event = ev.get();
  st().events[ev.get()] = std::move(ev);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().events.erase(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(st().mu);
  auto sp = stream_locked(stream);
  auto it = st().events.find(event);
  if (!sp || it == st().events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (it->second->device != sp->device) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
  if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
  if (capture_event_record_locked(*sp, *it->second)) return cudaSuccess;
  it->second->op = enqueue_locked(
      sp, "cudaEventRecord", [] {}, false);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::unique_lock<std::mutex> lock(st().mu);
  auto it = st().events.find(event);
  if (it == st().events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (it->second->captured) return fail(cudaErrorCapturedEvent);
  OpPtr op = it->second->op;
  const int dev = it->second->device;
  wait_locked(lock, op);
  pool_trim_locked(dev);
  return fail(sticky_locked(dev));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(st().mu);
  auto it = st().events.find(event);
  if (it == st().events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (it->second->captured) return fail(cudaErrorCapturedEvent);
  OpPtr op = it->second->op;
  if (!op || op->done) return cudaSuccess;
  demand_locked(op);
  return cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(st().mu);
  auto a = st().events.find(start), b = st().events.find(end);
  if (a == st().events.end() || b == st().events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (!a->second->timing || !b->second->timing) return fail(cudaErrorInvalidResourceHandle);
  if (!a->second->op || !b->second->op) return fail(cudaErrorInvalidResourceHandle);
  if (!a->second->op->done || !b->second->op->done) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->second->op->finished - a->second->op->finished).count();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (cudaError_t e = api_check(t_device)) return fail(e);
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > prof().smem_per_block_optin) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(st().mu);
    st().devices[t_device]->smem_attr[func] = value;
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
    return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
  return fail(cudaErrorInvalidValue);
}
