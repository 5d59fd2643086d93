// INTERNAL to the engine's runtime (runtime.cpp, copy.cpp, graph.cpp): the scheduler's state,
// streams, events and stream capture. Every member is guarded by State::mu; the
// *_locked helpers expect it held.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

struct CUstream_st {};
struct CUevent_st {};
struct CUmemPoolHandle_st {};
struct CUgraph_st {};
struct CUgraphExec_st {};

namespace cuda_emu::rt {

using Clock = std::chrono::steady_clock;

struct Op {
  uint64_t id = 0;
  std::string what;
  std::function<void()> fn;
  std::vector<std::shared_ptr<Op>> deps;
  int device = 0;
  bool demanded = false;
  bool done = false;
  Clock::time_point finished{};
};
using OpPtr = std::shared_ptr<Op>;

// ----------------------------------------------------------------------------
// Stream capture (graph.cpp). A node is recorded work: its function is copied for every
// launch of the instantiated graph, or made anew per launch by `make` (NCCL: each launch
// is a new collective with its own sequence number).
struct GraphNode {
  std::string what;
  std::function<void()> fn;
  std::function<std::function<void()>()> make;
  std::vector<size_t> deps;  // earlier nodes
  bool eager = false;
};

// Memory a captured cudaMallocAsync reserved: fixed for the graph's life (and its
// executables'), released when the last of them goes.
struct GraphMemory {
  std::vector<void*> blocks;
  ~GraphMemory();
};

struct Graph : CUgraph_st {
  int device = 0;
  std::vector<GraphNode> nodes;
  std::shared_ptr<GraphMemory> memory;
};

struct GraphExec : CUgraphExec_st {
  int device = 0;
  std::vector<GraphNode> nodes;
  std::shared_ptr<GraphMemory> memory;
  OpPtr last;  // the previous launch's end: launches of one executable run in order
};

struct Stream;

struct Capture {
  int device = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // the thread that began it
  Stream* origin = nullptr;
  std::vector<Stream*> streams;  // origin first, then every stream that joined
  std::unique_ptr<Graph> graph;
  std::vector<void*> allocs;              // captured cudaMallocAsync pointers not yet freed in the capture
  cudaError_t invalidated = cudaSuccess;  // why, once invalidated
};
using CapturePtr = std::shared_ptr<Capture>;

struct Stream : CUstream_st {
  int device = 0;
  bool blocking = true;  // synchronises with the legacy default stream
  bool legacy = false;
  OpPtr last;
  CapturePtr capture;            // the capture this stream records into
  std::vector<size_t> frontier;  // its last nodes in that capture (the next one's deps)
};

struct Event : CUevent_st {
  int device = 0;
  bool timing = true;
  OpPtr op;  // the latest record; null: never recorded (complete)
  // Recorded in a capturing stream: the capture and the nodes the record marks.
  std::weak_ptr<Capture> capture;
  bool captured = false;
  std::vector<size_t> nodes;
};

// A device's default memory pool, which serves cudaMallocAsync: `used` is what it has
// handed out and not yet had back, `reserved` what it holds from the OS (used plus freed
// memory kept for reuse). A stream, event or device synchronisation releases what is
// reserved beyond max(used, release threshold), as the driver does.
struct Pool : CUmemPoolHandle_st {
  uint64_t release_threshold = 0;
  int reuse[3] = {1, 1, 1};  // FollowEventDependencies, AllowOpportunistic, AllowInternalDependencies
  uint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
};

struct Device {
  std::shared_ptr<Stream> legacy;
  Pool pool;
  std::vector<OpPtr> pending;  // not yet run
  std::thread executor;
  std::condition_variable cv;
  std::mt19937_64 rng;
  cudaError_t sticky = cudaSuccess;
  std::unordered_map<const void*, int> smem_attr;
};

struct State {
  std::mutex mu;  // everything below and every Op's flags
  std::condition_variable done_cv;
  std::vector<std::unique_ptr<Device>> devices;
  std::map<CUstream_st*, std::shared_ptr<Stream>> streams;
  std::map<CUevent_st*, std::unique_ptr<Event>> events;
  std::vector<CapturePtr> captures;  // active (begun, not ended)
  std::map<CUgraph_st*, std::unique_ptr<Graph>> graphs;
  std::map<CUgraphExec_st*, std::unique_ptr<GraphExec>> execs;
  uint64_t next_id = 1;
  bool stop = false;
  bool fifo = false;                                    // CUDA_EMU_SCHEDULE=fifo: run everything at once in issue order
  int physical = 8;                                     // devices of the emulated machine (CUDA_EMU_DEVICE_COUNT)
  std::vector<int> visible;                             // after CUDA_VISIBLE_DEVICES
  std::string detail;                                   // last reported engine error
  std::unordered_map<const void*, size_t> pool_allocs;  // live cudaMallocAsync allocations -> bytes
  ~State();
};

State& st();
extern thread_local int t_device;

cudaError_t fail(cudaError_t e);  // sets the thread's last error
void report(const std::string& detail);
void report_locked(const std::string& detail);  // the same, st().mu held
cudaError_t sticky_locked(int dev);
void demand_locked(const OpPtr& root);
std::shared_ptr<Stream> stream_locked(cudaStream_t s);
// Enqueues on a stream that is not capturing (callers check capture_gate_locked first).
OpPtr enqueue_locked(const std::shared_ptr<Stream>& sp, const char* what, std::function<void()> fn, bool eager);
// Runs op (and what it depends on) and waits, releasing st().mu meanwhile.
void wait_locked(std::unique_lock<std::mutex>& lock, const OpPtr& op);

// ---- capture rules (graph.cpp)
// Whether work may be issued to sp now: cudaSuccess (then it is recorded when sp
// captures, else enqueued), cudaErrorStreamCaptureInvalidated (sp's capture was
// invalidated earlier), cudaErrorStreamCaptureImplicit (sp is the legacy stream and a
// blocking stream of its device captures: that capture is invalidated).
cudaError_t capture_gate_locked(const std::shared_ptr<Stream>& sp);
// Records a node on capturing stream sp after its frontier; returns its index.
size_t capture_record_locked(Stream& sp, const char* what, std::function<void()> fn,
                             std::function<std::function<void()>()> make, bool eager);
// A call that synchronises with or queries the host would wait on work that does not
// exist yet: invalidates the capture(s) concerned and returns
// cudaErrorStreamCaptureUnsupported. `stream`: that stream's capture; otherwise every
// capture on `device` (device-wide calls); cudaSuccess when no capture is concerned.
cudaError_t capture_sync_check_locked(Stream* stream, int device);
// "Potentially unsafe" calls (cudaMalloc, cudaFree, synchronous copies and memsets,
// cudaMallocHost, cudaFreeHost) while this thread has a non-relaxed capture, or another
// thread has a global-mode capture: invalidates those and returns
// cudaErrorStreamCaptureUnsupported.
cudaError_t capture_unsafe_check_locked();
// Invalidates a capture (the first reason sticks).
void capture_invalidate_locked(Capture& c, cudaError_t why);
// cudaEventRecord on sp: true when sp captures (ev now marks sp's frontier in the
// capture); false when it does not (ev's capture marks are cleared, the caller records).
bool capture_event_record_locked(Stream& sp, Event& ev);
// cudaStreamWaitEvent(sp, ev) where capture is involved: *handled = true when the wait
// was recorded (sp joined ev's capture, or its frontier grew by ev's nodes); errors for
// the combinations CUDA forbids (isolation, merge, the legacy stream).
cudaError_t capture_event_wait_locked(const std::shared_ptr<Stream>& sp, Event& ev, bool* handled);
// cudaMallocAsync / cudaFreeAsync on capturing stream sp: graph allocation nodes.
cudaError_t capture_malloc_locked(Stream& sp, void** ptr, size_t size);
cudaError_t capture_free_locked(Stream& sp, void* ptr);

}  // namespace cuda_emu::rt
