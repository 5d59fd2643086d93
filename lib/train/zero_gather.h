// The ZeRO engine's parameter gathers: stage 3's just-in-time all-gather of each sharded
// buffer into a working buffer before its layer runs, the layers ahead prefetched within
// the window (zero_prefetch_window) and released after use; and the bucketed all-gather
// of the owned shards into the model's full buffers (after each update at stages 1-2,
// and to materialize the parameters).
#pragma once

#include "core/dtype.h"
#include "device/device.h"
#include "train/zero_fwd.h"
#include "train/zero_layout.h"

#include <cstddef>
#include <vector>

namespace dtrain::train {

class ZeroGather {
 public:
  /// The engine's parts and state, borrowed for its lifetime.
  ZeroGather(device::Device& dev, const ZeroOptions& opts, const ZeroPlacement& place, ZeroCollectives& coll,
             ZeroWorkMeter& work, ZeroOffload& offload, std::vector<ZeroSlot>& slots,
             const std::vector<std::vector<size_t>>& layer_slots)
      : dev_(dev), opts_(opts), place_(place), coll_(coll), work_(work), offload_(offload), slots_(slots),
        layer_slots_(layer_slots) {}

  /// The model's storage dtype and whether its head reads the embeddings (the slots
  /// are built).
  void configure(DType model_dtype, bool tied);
  /// Stage 3, before layer `layer` runs in direction dir (+1 forward, -1 backward): its
  /// buffers gathered and waited for, the window ahead issued, the rest released.
  void visit(int layer, int dir);
  /// Stage 3: one buffer's gathered parameters released (after its layer ran).
  void release(ZeroSlot& s);
  void release_all();
  /// After an update at stages 1-3: the resident trainable buffers' owned shards
  /// all-gathered into the model in the compute dtype (stage 0's AdamW wrote them), as
  /// zero_post_update_gathers groups them.
  void resident_refresh();
  /// Bucketed all-gather of the owned shards of `list` (slots with a master, stages >= 1)
  /// into the model's full buffers, on the wire as `t`.
  void into_model(const std::vector<size_t>& list, DType t);

 private:
  void issue(ZeroSlot& s);
  void wait(ZeroSlot& s);
  void groups_into_model(const std::vector<ZeroGatherGroup>& groups, DType t);
  std::vector<const ZeroShard*> shards() const;  ///< the slots as the layout's rules take them

  device::Device& dev_;
  const ZeroOptions& opts_;
  const ZeroPlacement& place_;
  ZeroCollectives& coll_;
  ZeroWorkMeter& work_;
  ZeroOffload& offload_;
  std::vector<ZeroSlot>& slots_;
  const std::vector<std::vector<size_t>>& layer_slots_;
  DType mdt_ = DType::F32;
  bool tied_ = false;
};

}  // namespace dtrain::train
