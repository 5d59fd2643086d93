// CUDA execution engine: stream capture and CUDA graphs. Work issued to a capturing
// stream becomes graph nodes instead of running; events recorded there carry the capture
// to the streams that wait on them, which must all be rejoined before it ends. The calls
// the CUDA Programming Guide prohibits during capture fail and invalidate it. A launch
// replays the nodes with their recorded dependencies on the launch stream.
#include "engine.h"
#include "memory_internal.h"
#include "runtime_internal.h"

#include <cuda_emu_trace.h>

#include <algorithm>
#include <cstring>

namespace cuda_emu::rt {

GraphMemory::~GraphMemory() {
  for (void* p : blocks) mem_free(p, nullptr, nullptr);
}

void capture_invalidate_locked(Capture& c, cudaError_t why) {
  if (c.invalidated == cudaSuccess) c.invalidated = why;
}

namespace {

// Leaves capture mode on every stream of c and forgets c.
void capture_end_locked(const CapturePtr& c) {
  for (Stream* s : c->streams) {
    s->capture.reset();
    s->frontier.clear();
  }
  auto& all = st().captures;
  all.erase(std::remove(all.begin(), all.end(), c), all.end());
}

// Whether node `target` is `from` or one of its ancestors.
bool reaches(const Graph& g, size_t from, size_t target) {
  std::vector<size_t> stack{from};
  std::vector<bool> seen(g.nodes.size(), false);
  while (!stack.empty()) {
    const size_t n = stack.back();
    stack.pop_back();
    if (n == target) return true;
    if (n < target || seen[n]) continue;  // deps point to earlier nodes only
    seen[n] = true;
    for (size_t d : g.nodes[n].deps) stack.push_back(d);
  }
  return false;
}

// This thread's view of a capture: may it make potentially unsafe calls?
bool prohibits(const Capture& c) {
  if (c.invalidated != cudaSuccess) return false;
  if (c.thread == std::this_thread::get_id()) return c.mode != cudaStreamCaptureModeRelaxed;
  return c.mode == cudaStreamCaptureModeGlobal;
}

}  // namespace

cudaError_t capture_gate_locked(const std::shared_ptr<Stream>& sp) {
  if (sp->capture) return sp->capture->invalidated != cudaSuccess ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
  if (!sp->legacy) return cudaSuccess;
  // The legacy stream would wait for (or be waited on by) a capturing blocking stream.
  cudaError_t e = cudaSuccess;
  for (auto& c : st().captures)
    for (Stream* s : c->streams)
      if (s->device == sp->device && s->blocking) {
        capture_invalidate_locked(*c, cudaErrorStreamCaptureImplicit);
        e = cudaErrorStreamCaptureImplicit;
      }
  return e;
}

size_t capture_record_locked(Stream& sp, const char* what, std::function<void()> fn,
                             std::function<std::function<void()>()> make, bool eager) {
  Graph& g = *sp.capture->graph;
  GraphNode n;
  n.what = what;
  n.fn = std::move(fn);
  n.make = std::move(make);
  n.deps = sp.frontier;
  n.eager = eager;
  g.nodes.push_back(std::move(n));
  sp.frontier = {g.nodes.size() - 1};
  return g.nodes.size() - 1;
}

cudaError_t capture_sync_check_locked(Stream* stream, int device) {
  cudaError_t e = cudaSuccess;
  for (auto& c : st().captures) {
    bool concerned = false;
    if (stream) concerned = stream->capture == c;
    else
      for (Stream* s : c->streams) concerned = concerned || s->device == device;
    if (!concerned) continue;
    capture_invalidate_locked(*c, cudaErrorStreamCaptureUnsupported);
    e = cudaErrorStreamCaptureUnsupported;
  }
  return e;
}

cudaError_t capture_unsafe_check_locked() {
  cudaError_t e = cudaSuccess;
  for (auto& c : st().captures)
    if (prohibits(*c)) {
      capture_invalidate_locked(*c, cudaErrorStreamCaptureUnsupported);
      e = cudaErrorStreamCaptureUnsupported;
    }
  return e;
}

bool capture_event_record_locked(Stream& sp, Event& ev) {
  if (!sp.capture) {
    ev.captured = false;
    ev.capture.reset();
    ev.nodes.clear();
    return false;
  }
  ev.op = nullptr;
  ev.captured = true;
  ev.capture = sp.capture;
  ev.nodes = sp.frontier;
  return true;
}

cudaError_t capture_event_wait_locked(const std::shared_ptr<Stream>& sp, Event& ev, bool* handled) {
  *handled = false;
  CapturePtr ec = ev.captured ? ev.capture.lock() : nullptr;
  if (ev.captured && !ec) {
    // The capture that recorded it has ended: the event marks no work that will run.
    if (sp->capture) capture_invalidate_locked(*sp->capture, cudaErrorStreamCaptureIsolation);
    return cudaErrorStreamCaptureIsolation;
  }
  if (!ec) {
    if (!sp->capture) return cudaSuccess;  // plain stream, plain event: the runtime's business
    // A captured stream may not depend on work outside its capture.
    capture_invalidate_locked(*sp->capture, cudaErrorStreamCaptureIsolation);
    return cudaErrorStreamCaptureIsolation;
  }
  *handled = true;
  if (ec->invalidated != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
  if (sp->legacy) {
    capture_invalidate_locked(*ec, cudaErrorStreamCaptureImplicit);
    return cudaErrorStreamCaptureImplicit;
  }
  if (sp->capture && sp->capture != ec) {
    capture_invalidate_locked(*ec, cudaErrorStreamCaptureMerge);
    capture_invalidate_locked(*sp->capture, cudaErrorStreamCaptureMerge);
    return cudaErrorStreamCaptureMerge;
  }
  if (sp->device != ec->device) {
    capture_invalidate_locked(*ec, cudaErrorStreamCaptureUnsupported);
    return cudaErrorStreamCaptureUnsupported;  // the engine captures one device per graph
  }
  if (!sp->capture) {  // joins the capture, after the recorded nodes
    sp->capture = ec;
    sp->frontier = ev.nodes;
    ec->streams.push_back(sp.get());
    return cudaSuccess;
  }
  for (size_t n : ev.nodes)
    if (std::find(sp->frontier.begin(), sp->frontier.end(), n) == sp->frontier.end()) sp->frontier.push_back(n);
  return cudaSuccess;
}

cudaError_t capture_malloc_locked(Stream& sp, void** ptr, size_t size) {
  if (sp.capture->invalidated != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
  void* p = mem_alloc(size, sp.device, false);
  if (!p) return cudaErrorMemoryAllocation;
  sp.capture->graph->memory->blocks.push_back(p);
  sp.capture->allocs.push_back(p);
  // A graph allocation's contents are undefined whenever the node runs: poison them so a
  // read before a write shows.
  capture_record_locked(
      sp, "cudaMallocAsync (graph)", [p, size] { std::memset(p, 0xFF, size); }, nullptr, false);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t capture_free_locked(Stream& sp, void* ptr) {
  Capture& c = *sp.capture;
  if (c.invalidated != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
  auto it = std::find(c.allocs.begin(), c.allocs.end(), ptr);
  if (it == c.allocs.end()) {
    // Stricter than CUDA: only memory this capture allocated may be freed inside it.
    capture_invalidate_locked(c, cudaErrorStreamCaptureUnsupported);
    report_locked(
        "cudaFreeAsync during stream capture of memory not allocated in that capture (the engine allows only "
        "graph allocations to be freed in a graph)");
    return cudaErrorStreamCaptureUnsupported;
  }
  c.allocs.erase(it);
  capture_record_locked(
      sp, "cudaFreeAsync (graph)", [] {}, nullptr, false);
  return cudaSuccess;
}

}  // namespace cuda_emu::rt

// ----------------------------------------------------------------------------
// The CUDA runtime API.
using namespace cuda_emu;
using namespace cuda_emu::rt;

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(st().mu);
  auto sp = stream_locked(stream);
  if (!sp) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
  if (sp->legacy) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot be captured
  if (sp->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->device = sp->device;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = sp.get();
  c->streams.push_back(sp.get());
  c->graph = std::make_unique<Graph>();
  c->graph->device = sp->device;
  c->graph->memory = std::make_shared<GraphMemory>();
  sp->capture = c;
  sp->frontier.clear();
  st().captures.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (!graph) return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  std::lock_guard<std::mutex> lock(st().mu);
  auto sp = stream_locked(stream);
  if (!sp) return fail(cudaErrorInvalidResourceHandle);
  if (!sp->capture) return fail(cudaErrorIllegalState);
  CapturePtr c = sp->capture;
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  if (c->origin != sp.get()) {
    capture_invalidate_locked(*c, cudaErrorStreamCaptureUnmatched);
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (c->invalidated != cudaSuccess) {
    capture_end_locked(c);
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  // Every stream that joined must have been joined back: its last nodes precede the
  // origin's.
  for (Stream* s : c->streams) {
    if (s == sp.get()) continue;
    for (size_t n : s->frontier) {
      bool joined = false;
      for (size_t o : sp->frontier) joined = joined || reaches(*c->graph, o, n);
      if (!joined) {
        capture_end_locked(c);
        report_locked(
            "cudaStreamEndCapture: a stream that joined the capture through an event has work the origin "
            "stream does not wait for (record an event on it and cudaStreamWaitEvent the origin on it)");
        return fail(cudaErrorStreamCaptureUnjoined);
      }
    }
  }
  std::unique_ptr<Graph> g = std::move(c->graph);
  capture_end_locked(c);
  *graph = g.get();
  st().graphs[g.get()] = std::move(g);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (!status) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(st().mu);
  auto sp = stream_locked(stream);
  if (!sp) return fail(cudaErrorInvalidResourceHandle);
  if (sp->legacy)
    for (auto& c : st().captures)
      for (Stream* s : c->streams)
        if (s->device == sp->device && s->blocking) return fail(cudaErrorStreamCaptureImplicit);
  if (!sp->capture) *status = cudaStreamCaptureStatusNone;
  else
    *status =
        sp->capture->invalidated != cudaSuccess ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (!exec || flags != 0) return fail(cudaErrorInvalidValue);  // no instantiation flag is modelled
  std::lock_guard<std::mutex> lock(st().mu);
  auto it = st().graphs.find(graph);
  if (it == st().graphs.end()) return fail(cudaErrorInvalidResourceHandle);
  auto x = std::make_unique<GraphExec>();
  x->device = it->second->device;
  x->nodes = it->second->nodes;
  x->memory = it->second->memory;
  *exec = x.get();
  st().execs[x.get()] = std::move(x);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::vector<std::function<void()>> made;
  std::vector<GraphNode> nodes;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    auto it = st().execs.find(exec);
    auto sp = stream_locked(stream);
    if (it == st().execs.end() || !sp) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
    if (sp->device != it->second->device) return fail(cudaErrorInvalidValue);
    // Stricter than CUDA (which adds a child graph node): a graph launch is not captured.
    if (sp->capture) {
      capture_invalidate_locked(*sp->capture, cudaErrorStreamCaptureUnsupported);
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
    nodes = it->second->nodes;
  }
  // Per-launch work (NCCL: a new collective each launch), made in node order outside the
  // lock, as a sequence of API calls would be issued.
  made.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) made[i] = nodes[i].make ? nodes[i].make() : nodes[i].fn;

  std::lock_guard<std::mutex> lock(st().mu);
  auto it = st().execs.find(exec);
  auto sp = stream_locked(stream);
  if (it == st().execs.end() || !sp) return fail(cudaErrorInvalidResourceHandle);
  GraphExec& x = *it->second;
  trace_graph_launch(nodes.size(), sp->device);
  // The graph's start: after the stream's work and the executable's previous launch.
  auto mem = x.memory;
  OpPtr start = enqueue_locked(
      sp, "cudaGraphLaunch (start)", [] {}, false);
  if (x.last && !x.last->done) start->deps.push_back(x.last);
  std::vector<OpPtr> ops(nodes.size());
  std::vector<bool> has_dependent(nodes.size(), false);
  Device& d = *st().devices[sp->device];
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto op = std::make_shared<Op>();
    op->id = st().next_id++;
    op->what = nodes[i].what;
    op->fn = [fn = std::move(made[i]), mem] {
      if (fn) fn();
    };
    op->device = sp->device;
    if (nodes[i].deps.empty()) op->deps.push_back(start);
    for (size_t dep : nodes[i].deps) {
      op->deps.push_back(ops[dep]);
      has_dependent[dep] = true;
    }
    d.pending.push_back(op);
    if (nodes[i].eager || st().fifo) demand_locked(op);
    ops[i] = op;
  }
  // The graph's end joins every sink; later work on the stream follows it.
  OpPtr end = enqueue_locked(
      sp, "cudaGraphLaunch (end)", [] {}, false);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (!has_dependent[i]) end->deps.push_back(ops[i]);
  x.last = end;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().execs.erase(exec) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().graphs.erase(graph) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
