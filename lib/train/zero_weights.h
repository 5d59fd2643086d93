// The ZeRO engine's full weights for its callers: materialized into the model's own
// storage (stage 3: all-gathered from the master shards) for export, evaluation and tests,
// sharded again by restore(), and copied into a host fp32 model for a device run's export.
#pragma once

#include "device/device.h"
#include "model/model.h"
#include "train/zero_fwd.h"

#include <cstddef>
#include <vector>

namespace dtrain::train {

class ZeroWeights {
 public:
  /// The engine's parts, slots and sharded slots (stage 3), borrowed for its lifetime.
  ZeroWeights(model::Model& model, const ZeroOptions& opts, const ZeroPlacement& place, ZeroCollectives& coll,
              ZeroGather& gather, ZeroOffload& offload, std::vector<ZeroSlot>& slots,
              const std::vector<size_t>& sharded)
      : model_(model), dev_(model.device()), opts_(opts), place_(place), coll_(coll), gather_(gather),
        offload_(offload), slots_(slots), sharded_(sharded) {}

  /// Puts the full master weights into every model buffer (stage 3: all-gathers them into
  /// the model's own storage; collective), as fp32 on the CPU and as the compute copy on
  /// a 16-bit device model. For export, evaluation and tests; backward and step_issue()
  /// refuse to run until restore().
  void materialize();
  /// Undoes materialize(): compute copies back in the model, stage-3 buffers sharded again.
  void restore();
  /// Between materialize() and restore(): every buffer is resident and whole.
  bool materialized() const { return materialized_; }
  /// Copies the full fp32 weights of every buffer (masters; a frozen buffer without one:
  /// its compute copy widened) into `host`, a host fp32 model with the same buffers
  /// (LoRA enabled alike). Collective at stages 1-3. For the fp32 export of a device run.
  void to_host(model::Model& host);

 private:
  model::Model& model_;
  device::Device& dev_;
  const ZeroOptions& opts_;
  const ZeroPlacement& place_;
  ZeroCollectives& coll_;
  ZeroGather& gather_;
  ZeroOffload& offload_;
  std::vector<ZeroSlot>& slots_;
  const std::vector<size_t>& sharded_;
  bool materialized_ = false;
};

}  // namespace dtrain::train
