// The CUDA device's runtime half (cuda_device.cpp's CudaDevice adds the ops): one
// non-blocking compute stream per device, events, stream-ordered memory from the
// device's default pool, pinned host memory, copies and CUDA graphs. Every entry point
// makes its device current first (cudaSetDevice is per host thread, and ranks run as
// threads in the tests). Named cuda_rt, not cuda_runtime, beside the toolkit's
// <cuda_runtime.h>. Include only from CUDA-enabled translation units (core/cuda_check.h).
#pragma once

#include "device/device.h"

#include <cuda_runtime.h>

#include <string>

namespace dtrain::device {

class CudaRuntime : public Device {
 public:
  explicit CudaRuntime(int index);
  ~CudaRuntime() override;

  Kind kind() const override { return Kind::CUDA; }
  std::string name() const override { return name_; }
  void* stream() const override { return own_; }
  void* use_stream(void* stream) override;
  std::unique_ptr<Event> event_create() override;
  void event_record(Event& e, void* stream) override;
  void stream_wait(void* stream, Event& e) override;

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  MemoryStats memory_stats() override;
  void memory_peak_reset() override;
  void copy_h2d(void* dst, const void* src, size_t bytes) override;
  void copy_d2h(void* dst, const void* src, size_t bytes) override;
  void* host_alloc(size_t bytes, bool pinned) override;
  void host_free(void* p, bool pinned) override;
  void copy_h2d_async(void* dst, const void* src, size_t bytes) override;
  void copy_d2h_async(void* dst, const void* src, size_t bytes) override;
  void event_synchronize(Event& e) override;
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override;
  void copy_d2d(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void synchronize() override;

  bool graph_begin() override;
  std::unique_ptr<Graph> graph_end() override;
  void graph_launch(Graph& g) override;

 protected:
  void cur() const;

  int index_;
  cudaStream_t own_ = nullptr;  // the compute stream
  cudaStream_t s_ = nullptr;    // the current stream (use_stream)

 private:
  class CudaEvent final : public Event {
   public:
    cudaEvent_t e = nullptr;
    ~CudaEvent() override {
      if (e) (void)cudaEventDestroy(e);
    }
  };
  // Thread-local capture: other host threads (other ranks in the tests, NCCL's watchdog)
  // may keep making their own CUDA calls meanwhile.
  class CudaGraph final : public Graph {
   public:
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    ~CudaGraph() override {
      if (x) (void)cudaGraphExecDestroy(x);
      if (g) (void)cudaGraphDestroy(g);
    }
  };

  std::string name_;
};

}  // namespace dtrain::device
