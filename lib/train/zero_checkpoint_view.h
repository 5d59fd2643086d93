// The ZeRO engine's checkpoint side: per-buffer views of masters, moments and resident
// full values in host memory (on a device staged through host copies, offloaded state
// pointed at directly) and the rank's compression state, and the staged copies taken back
// into the device state after a load.
#pragma once

#include "core/dtype.h"
#include "device/device.h"
#include "train/zero_fwd.h"

#include <cstddef>
#include <utility>
#include <vector>

namespace dtrain::train {

class ZeroCheckpointStage {
 public:
  /// The engine's parts and slots, borrowed for its lifetime.
  ZeroCheckpointStage(device::Device& dev, const ZeroOptions& opts, ZeroCollectives& coll, ZeroGather& gather,
                      ZeroOffload& offload, ZeroCompression& compress, std::vector<ZeroSlot>& slots)
      : dev_(dev), opts_(opts), coll_(coll), gather_(gather), offload_(offload), compress_(compress), slots_(slots) {}

  /// Where the model lives (a host model's state is viewed in place) and its dtype.
  void configure(bool model_on_host, DType model_dtype);
  /// Once the collectives in flight are done: one view per buffer, base buffers first
  /// then adapters (on a device: staged now).
  std::vector<ZeroBufferView> buffers();
  /// The compression state per rank, in compress.rank_state()'s order (on a device: the
  /// copies buffers() staged).
  std::vector<std::pair<float*, size_t>> rank_state();
  /// After a checkpoint wrote masters (and resident full buffers' fp32 values): stale
  /// gathered layers dropped, and the state taken back (on a device: the staged copies
  /// into the device state; on the host: the resident buffers' masters and compute copies
  /// from their full values).
  void loaded();

 private:
  void stage_out();
  void take_back();

  device::Device& dev_;
  const ZeroOptions& opts_;
  ZeroCollectives& coll_;
  ZeroGather& gather_;
  ZeroOffload& offload_;
  ZeroCompression& compress_;
  std::vector<ZeroSlot>& slots_;
  bool host_ = true;
  DType mdt_ = DType::F32;
  struct Staged {
    std::vector<float> master, m, v, full;
  };
  std::vector<Staged> staged_;                   // device models: the views' host copies
  std::vector<std::vector<float>> staged_rank_;  // ... and of the compression state
};

}  // namespace dtrain::train
