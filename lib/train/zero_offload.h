// The ZeRO engine's optimizer state where it lives: a shard's values moved between the
// device, the host and the offloaded host state, and ZeRO-Offload itself (masters,
// moments and gradient shards in host memory, each bucket's reduced shard landing there
// and AdamW run by a host worker, the updated shards copied back), with its schedule.
#pragma once

#include "core/dtype.h"
#include "device/device.h"
#include "ops/optim.h"
#include "train/zero_fwd.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dtrain::train {

/// One entry of an offloaded step's schedule (ZeroReport::offload_trace): seconds since
/// the step's before_step(). "backward" = the compute thread finished issuing layer
/// `index`'s backward; "landed" = bucket `index`'s reduced gradient shard reached host
/// memory (the device had finished that bucket); "adamw" = the host update of bucket
/// `index` ran from t0 to t1 ("adamw" with index -1: the whole update after the backward).
struct OffloadTraceEntry {
  std::string what;
  int index = 0;
  double t0 = 0, t1 = 0;
};

class ZeroOffload {
 public:
  /// The engine's options, collectives, slots and buckets, borrowed for its lifetime.
  ZeroOffload(device::Device& dev, const ZeroOptions& opts, ZeroCollectives& coll, std::vector<ZeroSlot>& slots,
              std::vector<ZeroBucket>& buckets);
  ~ZeroOffload();

  /// Offload is on for a device model that asks for it (a CPU model holds everything in
  /// host memory already); starts the host worker.
  void configure(bool model_on_host, DType model_dtype);
  bool on() const { return on_; }
  bool on_param() const { return on_param_; }
  /// Each bucket's host AdamW runs during the backward (stages 2-3, no clipping, no fp16).
  bool eager() const { return eager_; }
  /// Finishes the host worker (the engine's teardown).
  void stop();

  // A shard's values (owned range) wherever they live.
  float* master_f32(ZeroSlot& s);
  void host_from_device(float* dst, const void* src, DType t, size_t n);
  void device_from_host(void* dst, DType t, const float* src, size_t n);
  /// As dtype t at dst (device memory), on the current stream.
  void shard_to_device(void* dst, DType t, ZeroSlot& s);
  void shard_to_host(float* dst, ZeroSlot& s);
  /// After a checkpoint load wrote the host master (or a resident buffer's full values).
  void shard_from_host(ZeroSlot& s, const float* src);

  /// Host storage and starting values of an offloaded slot (fp32: the whole buffer, or
  /// nullptr to read the model's).
  void slot_init(ZeroSlot& s, const float* fp32);
  /// before_step: the worker idle, the step's schedule started over.
  void step_begin();
  /// Stages 2-3, in bucket `index`'s communication task: its reduced segment at `mine` to
  /// the host; with update, the worker then runs its AdamW (lr, AdamW step `step`).
  void land(size_t index, const float* mine, bool update, float lr, int64_t step);
  /// step_issue's start: every gradient shard on the host.
  void grads_collect();
  /// step_issue's part once `scale_dev` (device memory) holds the agreed clip scale and
  /// skip flag: the host update (or the eager one's check) and the copies back.
  void step_issue(float loss_scale, const float* scale_dev, float lr, int64_t step);
  void trace_add(const char* what, int index, double t0, double t1);
  double now() const;
  std::vector<OffloadTraceEntry> trace() const;

 private:
  void bucket_update(size_t index, float lr, int64_t step);
  std::vector<ops::AdamWTensor> tensors(const std::vector<size_t>& slots);
  void copy_back(const std::vector<size_t>& slots);

  device::Device& dev_;
  const ZeroOptions& opts_;
  ZeroCollectives& coll_;
  std::vector<ZeroSlot>& slots_;
  std::vector<ZeroBucket>& buckets_;
  DType mdt_ = DType::F32;
  // The host worker waits for landed gradients, accumulates them and (eager) updates;
  // whether this step's update already ran there; the step's start and schedule.
  bool on_ = false, on_param_ = false, eager_ = false;
  std::unique_ptr<ZeroCommQueue> host_q_;
  std::atomic<bool> eager_applied_{false}, eager_poisoned_{false};
  std::chrono::steady_clock::time_point step_t0_{};
  mutable std::mutex trace_mu_;
  std::vector<OffloadTraceEntry> trace_;
};

}  // namespace dtrain::train
