// The ZeRO step's values in device memory, read back once per step: the agreement values
// (ZeroStepStats), the micro-batches' target counts and the loss slots Model::forward
// writes. Everything about the step is decided on the device; this is the one copy back.
#pragma once

#include "device/device.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::train {

// The step's agreement values, at the start of the buffer.
struct ZeroStepStats {
  double sq;       // the (agreed) gradient sum of squares
  double loss;     // this rank's loss sum (ops::step_loss_sum of the loss slots)
  float red[4];    // the (hi, lo, overflow) triple and the fp32 loss sum, summed over the ranks
  float scale[5];  // AdamW's gradient scale, skip flag, then adamw_step_values (step_prepare)
  float count;     // the step's target count: this rank's (step_targets), then all ranks' (targets_reduce)
};

class ZeroStepBuffer {
 public:
  explicit ZeroStepBuffer(device::Device& dev) : dev_(dev) {}

  /// The buffer without loss slots (the engine's construction).
  void allocate() { buf_ = device::DeviceBuffer(dev_, sizeof(ZeroStepStats)); }
  /// A field of ZeroStepStats (its offsetof) in device memory.
  float* at(size_t offset) { return reinterpret_cast<float*>(buf_.as<char>() + offset); }
  const float* at(size_t offset) const { return reinterpret_cast<const float*>(buf_.as<char>() + offset); }
  /// The micro-batches' target counts, then the loss slots (device memory).
  float* counts() { return at(sizeof(ZeroStepStats)); }
  float* losses() { return counts() + cap_; }
  size_t losses_n() const { return n_; }
  /// n loss slots; a growing n reallocates the buffer.
  float* loss_slots(size_t n);
  /// One upload: the counts' total (ZeroStepStats::count), then each slot's count.
  void targets_upload(const int64_t* counts, size_t n);
  /// targets_upload ran for the step in flight.
  bool targets_set() const { return targets_set_; }
  /// The step's one read-back: the agreement values, and the loss slots into `losses`;
  /// the step's targets are done with.
  ZeroStepStats read_back(std::vector<float>& losses);

 private:
  device::Device& dev_;
  device::DeviceBuffer buf_;
  size_t n_ = 0, cap_ = 0;
  bool targets_set_ = false;
};

}  // namespace dtrain::train
