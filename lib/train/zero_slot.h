// ZeroEngine's private state per model buffer (ZeroSlot: its shard, master, AdamW moments,
// stage-2/3 working buffers, offloaded host state) and per gradient bucket, shared by the
// engine's parts (lib/train/zero_*.cpp). Include only from there.
#pragma once

#include "core/dtype.h"
#include "device/device.h"
#include "train/zero_engine.h"
#include "train/zero_layout.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace dtrain::train {

// Element `elems` of a buffer of dtype t, and of an fp32 buffer.
inline char* zero_at(void* base, size_t elems, DType t) { return static_cast<char*>(base) + elems * dtype_size(t); }
inline float* zero_fat(void* base, size_t elems) { return static_cast<float*>(base) + elems; }

// One model buffer: its place (ZeroShard) and its state. The master shard is fp32 (`sdt`
// F32) except for a frozen buffer of a 16-bit device model, whose stage-3 shard stays in
// the compute dtype (it never changes).
struct ZeroSlot : ZeroShard {
  model::ParamBuffer* pb = nullptr;
  bool own_master = false;                       // a master apart from the model's buffer (the same on every rank)
  DType sdt = DType::F32;                        // dtype of `master`
  device::DeviceBuffer master, m, v, gshard;     // owned range [lo, hi)
  device::DeviceBuffer work;                     // stage 3: gathered parameters (W * s, model dtype)
  device::DeviceBuffer wgrad;                    // stages 2/3: the layer's full gradient during backward
  std::unique_ptr<device::Device::Event> ready;  // stage 3, stream-ordered: the gather is done
  bool gathered = false;                         // issued, maybe in flight
  uint64_t gather_ticket = 0;
  // ZeRO-Offload. off: a trainable buffer whose master, moments and gradient shard live on
  // the host (owned range); hland: where each micro-batch's reduced shard lands (stages
  // 2-3); hcopy: the updated shard in the model's 16-bit dtype (the h2d source), or with
  // off_param the frozen shard's value in `sdt`; dshard: the compute-dtype shard a stage-3
  // gather reads when the parameters stay on the device (off, not off_param).
  bool off = false, off_param = false;
  device::HostBuffer hmaster, hm, hv, hgrad, hland, hcopy;
  device::DeviceBuffer dshard;

  // The host shard a gather or the h2d copy reads, and its dtype.
  const void* host_shard() const { return hcopy.get() ? hcopy.get() : hmaster.get(); }
  DType host_shard_dtype(DType model_dtype) const { return hcopy.get() ? (trainable ? model_dtype : sdt) : DType::F32; }
};

// One gradient bucket: its plan and its buffers in flight.
struct ZeroBucket : ZeroBucketPlan {
  std::shared_ptr<device::DeviceBuffer> buf;
  size_t packed = 0;
  std::unique_ptr<device::Device::Event> landed_ev;  // offload: the d2h copy into the slots' hgrad / hland
  uint64_t host_ticket = 0;                          // offload: the host worker's task for the last landing
  bool landed = false;  // offload: this step's first micro-batch landed (straight into the host gradient)
};

}  // namespace dtrain::train
