// The engine's stream capture and CUDA graphs against the CUDA Programming Guide's rules:
// captured work is recorded, not run; launches replay it in dependency order with the
// kernel arguments of capture time; events fork and join other streams into a capture,
// which must all be rejoined; synchronising and unsafe calls fail and invalidate it;
// graph allocations; NCCL collectives captured on two ranks replay as new collectives.
#include <cuda_emu_trace.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define LAUNCH(grid, block, smem, stream, ...) \
  ::cuda_emu::launch(#__VA_ARGS__, __FILE__, __LINE__, grid, block, smem, stream, __VA_ARGS__)

namespace {

__global__ void add_kernel(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}
__global__ void scale_kernel(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= v;
}
// out[i] = a[i] + b[i]: a join of two branches.
__global__ void sum_kernel(float* out, const float* a, const float* b, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

struct ClearErrors {
  ~ClearErrors() {
    cudaGetLastError();
    cuda_emu::test_clear_errors();
  }
};

std::vector<float> download(const float* d, int n, cudaStream_t s) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  return h;
}

struct Streams {
  cudaStream_t a = nullptr, b = nullptr;
  Streams() {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~Streams() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
};

cudaStreamCaptureStatus status(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  return st;
}

}  // namespace

TEST_CASE("cuda_emu graph: captured work is recorded, not run; each launch replays it with capture-time arguments") {
  ClearErrors clear;
  Streams s;
  const int n = 300;
  float* p = nullptr;
  REQUIRE(cudaMallocAsync(&p, n * sizeof(float), s.a) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(p, 0, n * sizeof(float), s.a) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.a) == cudaSuccess);

  cuda_emu::trace_begin();
  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(status(s.a) == cudaStreamCaptureStatusActive);
  CHECK(status(s.b) == cudaStreamCaptureStatusNone);
  float v = 1.0f;
  LAUNCH(2, 256, 0, s.a, add_kernel)(p, n, v);
  v = 100.0f;  // the kernel keeps the 1 it was launched with
  LAUNCH(2, 256, 0, s.a, scale_kernel)(p, n, 3.0f);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(s.a, &g) == cudaSuccess);
  REQUIRE(g != nullptr);
  CHECK(status(s.a) == cudaStreamCaptureStatusNone);
  // Nothing ran.
  CHECK(download(p, n, s.a) == std::vector<float>(n, 0.0f));

  cudaGraphExec_t x = nullptr;
  REQUIRE(cudaGraphInstantiate(&x, g, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(x, s.a) == cudaSuccess);
  CHECK(download(p, n, s.a) == std::vector<float>(n, 3.0f));  // (0 + 1) * 3
  REQUIRE(cudaGraphLaunch(x, s.a) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(x, s.a) == cudaSuccess);             // launches of one executable run in order
  CHECK(download(p, n, s.a) == std::vector<float>(n, 39.0f));  // ((3 + 1) * 3 + 1) * 3
  // Stream order around a launch: work before it is seen, work after it sees it.
  LAUNCH(2, 256, 0, s.a, add_kernel)(p, n, -39.0f);
  REQUIRE(cudaGraphLaunch(x, s.a) == cudaSuccess);
  LAUNCH(2, 256, 0, s.a, add_kernel)(p, n, 0.5f);
  CHECK(download(p, n, s.a) == std::vector<float>(n, 3.5f));
  const cuda_emu::Trace t = cuda_emu::trace_take();
  CHECK(t.graph_launches.size() == 4);
  CHECK(t.graph_launches[0].nodes == 2);
  CHECK(t.kernels.size() == 4);  // two captured, two direct: a replay is traced as its launch

  CHECK(cudaGraphExecDestroy(x) == cudaSuccess);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  CHECK(cudaGraphDestroy(g) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGraphLaunch(x, s.a) == cudaErrorInvalidResourceHandle);
  REQUIRE(cudaFreeAsync(p, s.a) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.a) == cudaSuccess);
}

TEST_CASE("cuda_emu graph: events fork other streams into the capture and join them back; unjoined work fails") {
  ClearErrors clear;
  Streams s;
  const int n = 64;
  float *a = nullptr, *b = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(&a, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&b, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, n * sizeof(float)) == cudaSuccess);
  cudaEvent_t fork = nullptr, join = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(a, 0, n * sizeof(float), s.a) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(b, 0, n * sizeof(float), s.a) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.a) == cudaSuccess);

  // a += 1 on the origin, b += 2 on the forked stream, out = a + b after the join.
  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, s.a) == cudaSuccess);
  CHECK(cudaEventQuery(fork) == cudaErrorCapturedEvent);  // marks no work that runs
  REQUIRE(cudaStreamWaitEvent(s.b, fork, 0) == cudaSuccess);
  CHECK(status(s.b) == cudaStreamCaptureStatusActive);  // joined the capture
  LAUNCH(1, 64, 0, s.b, add_kernel)(b, n, 2.0f);
  LAUNCH(1, 64, 0, s.a, add_kernel)(a, n, 1.0f);
  REQUIRE(cudaEventRecord(join, s.b) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s.a, join, 0) == cudaSuccess);
  LAUNCH(1, 64, 0, s.a, sum_kernel)(out, a, b, n);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(s.a, &g) == cudaSuccess);
  CHECK(status(s.b) == cudaStreamCaptureStatusNone);  // left with the origin
  cudaGraphExec_t x = nullptr;
  REQUIRE(cudaGraphInstantiate(&x, g, 0) == cudaSuccess);
  // Many launches under the adversarial scheduler: the join orders the sum after both.
  for (int i = 1; i <= 5; ++i) {
    REQUIRE(cudaGraphLaunch(x, s.a) == cudaSuccess);
    CHECK(download(out, n, s.a) == std::vector<float>(n, 3.0f * i));
  }
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);

  // A forked stream never joined back: EndCapture fails with Unjoined, no graph.
  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, s.a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s.b, fork, 0) == cudaSuccess);
  LAUNCH(1, 64, 0, s.b, add_kernel)(b, n, 2.0f);
  LAUNCH(1, 64, 0, s.a, add_kernel)(a, n, 1.0f);
  g = reinterpret_cast<cudaGraph_t>(&fork);
  CHECK(cudaStreamEndCapture(s.a, &g) == cudaErrorStreamCaptureUnjoined);
  CHECK(g == nullptr);
  CHECK(status(s.a) == cudaStreamCaptureStatusNone);
  CHECK(status(s.b) == cudaStreamCaptureStatusNone);

  // Ending on a stream that joined, not the origin: Unmatched (and the capture is dead).
  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, s.a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s.b, fork, 0) == cudaSuccess);
  CHECK(cudaStreamEndCapture(s.b, &g) == cudaErrorStreamCaptureUnmatched);
  CHECK(status(s.a) == cudaStreamCaptureStatusInvalidated);
  CHECK(cudaStreamEndCapture(s.a, &g) == cudaErrorStreamCaptureInvalidated);
  CHECK(g == nullptr);

  // A capturing stream may not wait on work outside its capture.
  REQUIRE(cudaEventRecord(join, s.b) == cudaSuccess);  // an ordinary record now
  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(s.a, join, 0) == cudaErrorStreamCaptureIsolation);
  CHECK(status(s.a) == cudaStreamCaptureStatusInvalidated);
  CHECK(cudaStreamEndCapture(s.a, &g) == cudaErrorStreamCaptureInvalidated);

  // Two captures may not merge.
  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s.b, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, s.a) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(s.b, fork, 0) == cudaErrorStreamCaptureMerge);
  CHECK(cudaStreamEndCapture(s.a, &g) == cudaErrorStreamCaptureInvalidated);
  CHECK(cudaStreamEndCapture(s.b, &g) == cudaErrorStreamCaptureInvalidated);
  // Beginning twice, ending what never began.
  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  REQUIRE(cudaStreamEndCapture(s.a, &g) == cudaSuccess);  // an empty graph is a graph
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  CHECK(cudaStreamEndCapture(s.a, &g) == cudaErrorIllegalState);
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);

  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaFree(a);
  cudaFree(b);
  cudaFree(out);
}

TEST_CASE("cuda_emu graph: synchronising and unsafe calls during capture fail and invalidate it") {
  ClearErrors clear;
  Streams s;
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 256) == cudaSuccess);
  float h[4] = {};
  cudaGraph_t g = nullptr;
  auto begin = [&](cudaStreamCaptureMode m) {
    REQUIRE(cudaStreamBeginCapture(s.a, m) == cudaSuccess);
    LAUNCH(1, 4, 0, s.a, add_kernel)(d, 4, 1.0f);
  };
  auto invalidated = [&] {
    CHECK(status(s.a) == cudaStreamCaptureStatusInvalidated);
    // Later work on the stream is refused, and the end reports the invalidation.
    CHECK(cudaMemsetAsync(d, 0, 16, s.a) == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaStreamEndCapture(s.a, &g) == cudaErrorStreamCaptureInvalidated);
    CHECK(g == nullptr);
    CHECK(status(s.a) == cudaStreamCaptureStatusNone);
  };
  SUBCASE("cudaStreamSynchronize") {
    begin(cudaStreamCaptureModeRelaxed);
    CHECK(cudaStreamSynchronize(s.a) == cudaErrorStreamCaptureUnsupported);
    invalidated();
  }
  SUBCASE("cudaStreamQuery") {
    begin(cudaStreamCaptureModeRelaxed);
    CHECK(cudaStreamQuery(s.a) == cudaErrorStreamCaptureUnsupported);
    invalidated();
  }
  SUBCASE("cudaDeviceSynchronize") {
    begin(cudaStreamCaptureModeRelaxed);
    CHECK(cudaDeviceSynchronize() == cudaErrorStreamCaptureUnsupported);
    invalidated();
  }
  SUBCASE("synchronous cudaMemcpy (global and thread-local modes)") {
    begin(cudaStreamCaptureModeThreadLocal);
    CHECK(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureUnsupported);
    invalidated();
  }
  SUBCASE("cudaMalloc in global mode, from another thread too") {
    begin(cudaStreamCaptureModeGlobal);
    cudaError_t other = cudaSuccess;
    std::thread([&] {
      void* p = nullptr;
      cudaSetDevice(0);
      other = cudaMalloc(&p, 16);
    }).join();
    CHECK(other == cudaErrorStreamCaptureUnsupported);
    invalidated();
  }
  SUBCASE("cudaMalloc in relaxed mode is allowed") {
    begin(cudaStreamCaptureModeRelaxed);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 16) == cudaSuccess);
    CHECK(status(s.a) == cudaStreamCaptureStatusActive);
    REQUIRE(cudaStreamEndCapture(s.a, &g) == cudaSuccess);
    cudaGraphDestroy(g);
    cudaFree(p);
  }
  SUBCASE("copies with pageable host memory (stricter than CUDA)") {
    begin(cudaStreamCaptureModeGlobal);
    CHECK(cudaMemcpyAsync(h, d, 16, cudaMemcpyDeviceToHost, s.a) == cudaErrorStreamCaptureUnsupported);
    invalidated();
  }
  SUBCASE("the legacy stream beside a blocking capturing stream") {
    cudaStream_t blocking = nullptr;
    REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaMemsetAsync(d, 0, 16, nullptr) == cudaErrorStreamCaptureImplicit);
    CHECK(cudaStreamEndCapture(blocking, &g) == cudaErrorStreamCaptureInvalidated);
    cudaStreamDestroy(blocking);
  }
  SUBCASE("a thread-local capture is ended by its thread only") {
    begin(cudaStreamCaptureModeThreadLocal);
    cudaError_t other = cudaSuccess;
    std::thread([&] {
      cudaSetDevice(0);
      cudaGraph_t og = nullptr;
      other = cudaStreamEndCapture(s.a, &og);
    }).join();
    CHECK(other == cudaErrorStreamCaptureWrongThread);
    REQUIRE(cudaStreamEndCapture(s.a, &g) == cudaSuccess);
    cudaGraphDestroy(g);
  }
  cudaFree(d);
}

TEST_CASE("cuda_emu graph: stream-ordered allocations in a capture are graph memory with fixed addresses") {
  ClearErrors clear;
  Streams s;
  const int n = 128;
  float* out = nullptr;
  REQUIRE(cudaMalloc(&out, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(out, 0, n * sizeof(float), s.a) == cudaSuccess);
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess);
  uint64_t used0 = 0, used1 = 1;
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used0) == cudaSuccess);

  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  float* tmp = nullptr;
  REQUIRE(cudaMallocAsync(&tmp, n * sizeof(float), s.a) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(tmp, 0, n * sizeof(float), s.a) == cudaSuccess);
  LAUNCH(1, n, 0, s.a, add_kernel)(tmp, n, 2.0f);
  LAUNCH(1, n, 0, s.a, sum_kernel)(out, out, tmp, n);
  REQUIRE(cudaFreeAsync(tmp, s.a) == cudaSuccess);
  // Only memory the capture allocated may be freed in it (stricter than CUDA).
  CHECK(cudaFreeAsync(out, s.a) == cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s.a, &g) == cudaErrorStreamCaptureInvalidated);

  REQUIRE(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaMallocAsync(&tmp, n * sizeof(float), s.a) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(tmp, 0, n * sizeof(float), s.a) == cudaSuccess);
  LAUNCH(1, n, 0, s.a, add_kernel)(tmp, n, 2.0f);
  LAUNCH(1, n, 0, s.a, sum_kernel)(out, out, tmp, n);
  REQUIRE(cudaFreeAsync(tmp, s.a) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(s.a, &g) == cudaSuccess);
  cudaGraphExec_t x = nullptr;
  REQUIRE(cudaGraphInstantiate(&x, g, 0) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(g) == cudaSuccess);  // the executable keeps the graph's memory
  for (int i = 0; i < 3; ++i) REQUIRE(cudaGraphLaunch(x, s.a) == cudaSuccess);
  CHECK(download(out, n, s.a) == std::vector<float>(n, 6.0f));
  // Graph memory is not the pool's.
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used1) == cudaSuccess);
  CHECK(used1 == used0);
  REQUIRE(cudaGraphExecDestroy(x) == cudaSuccess);
  CHECK(cudaGraphInstantiate(&x, g, 0) == cudaErrorInvalidResourceHandle);
  cudaFree(out);
}

TEST_CASE("cuda_emu graph: NCCL collectives captured on two ranks replay as new collectives at every launch") {
  ClearErrors clear;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const int n = 256;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto need = [&](bool ok, const char* what) {
        if (!ok && errors[r].empty()) errors[r] = what;
        return ok;
      };
      cudaSetDevice(r);
      cudaStream_t s = nullptr, comm_s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      cudaStreamCreateWithFlags(&comm_s, cudaStreamNonBlocking);
      ncclComm_t comm = nullptr;
      if (!need(ncclCommInitRank(&comm, 2, id, r) == ncclSuccess, "init")) return;
      float* buf = nullptr;
      cudaMalloc(&buf, n * sizeof(float));
      cudaMemsetAsync(buf, 0, n * sizeof(float), s);
      cudaEvent_t ready = nullptr, reduced = nullptr;
      cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
      cudaEventCreateWithFlags(&reduced, cudaEventDisableTiming);
      // buf += r + 1 on the compute stream; allreduce on the communicator's stream
      // (forked and joined by events, as llm.c orders its NCCL stream); then buf *= 2.
      need(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin");
      LAUNCH(1, n, 0, s, add_kernel)(buf, n, static_cast<float>(r + 1));
      cudaEventRecord(ready, s);
      cudaStreamWaitEvent(comm_s, ready, 0);
      need(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, comm_s) == ncclSuccess, "allreduce");
      cudaEventRecord(reduced, comm_s);
      cudaStreamWaitEvent(s, reduced, 0);
      LAUNCH(1, n, 0, s, scale_kernel)(buf, n, 2.0f);
      cudaGraph_t g = nullptr;
      need(cudaStreamEndCapture(s, &g) == cudaSuccess, "end");
      cudaGraphExec_t x = nullptr;
      need(cudaGraphInstantiate(&x, g, 0) == cudaSuccess, "instantiate");
      // Reference: x -> ((x + 1) + (x + 2)) * 2 on both ranks.
      float want = 0.0f;
      for (int i = 0; i < 3; ++i) {
        need(cudaGraphLaunch(x, s) == cudaSuccess, "launch");
        want = (want + 1 + want + 2) * 2;
      }
      std::vector<float> h(n);
      cudaMemcpyAsync(h.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost, s);
      need(cudaStreamSynchronize(s) == cudaSuccess, "sync");
      need(h == std::vector<float>(n, want), "replayed values");
      need(ncclCommFinalize(comm) == ncclSuccess, "finalize");
      need(ncclCommDestroy(comm) == ncclSuccess, "destroy");
      cudaGraphExecDestroy(x);
      cudaGraphDestroy(g);
      cudaEventDestroy(ready);
      cudaEventDestroy(reduced);
      cudaFree(buf);
      cudaStreamDestroy(s);
      cudaStreamDestroy(comm_s);
    });
  for (auto& t : threads) t.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}
