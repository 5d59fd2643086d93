// ZeroWeights: the engine's full weights materialized into the model and sharded again,
// and copied to a host fp32 model.
#include "train/zero_weights.h"

#include "core/check.h"
#include "core/dtype.h"
#include "train/zero_comm.h"
#include "train/zero_gather.h"
#include "train/zero_offload.h"
#include "train/zero_slot.h"

#include <cstddef>
#include <vector>

namespace dtrain::train {

void ZeroWeights::materialize() {
  if (materialized_) return;
  const DType mdt = model_.dtype();
  coll_.wait_all();
  gather_.release_all();
  coll_.join();
  if (opts_.stage == 0) {
    for (auto& s : slots_)
      if (s.own_master) dev_.cast(s.pb->data, mdt, s.master.get(), s.sdt, s.n);
  } else {
    model_.storage_restore(false, sharded_);  // the model's own storage takes the full values
    std::vector<size_t> list;
    // The same list on every rank (a rank may own nothing of a small buffer).
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].own_master) list.push_back(i);
    gather_.into_model(list, DType::F32);
    coll_.join();
  }
  materialized_ = true;
}

void ZeroWeights::restore() {
  if (!materialized_) return;
  model_.storage_release(false, sharded_);
  if (opts_.compute_dtype != DType::F32 && model_.dtype() == DType::F32)
    for (auto& s : slots_)
      if (!s.sharded) dev_.round_to(static_cast<float*>(s.pb->data), s.n, opts_.compute_dtype);
  materialized_ = false;
}

void ZeroWeights::to_host(model::Model& host) {
  DT_ENFORCE(host.on_host() && host.dtype() == DType::F32, UsageError, "ZeroWeights::to_host: a host fp32 model");
  std::vector<model::ParamBuffer*> dst;
  for (auto& pb : host.params()) dst.push_back(&pb);
  for (auto& pb : host.lora_params()) dst.push_back(&pb);
  DT_ENFORCE_EQ(dst.size(), slots_.size(), UsageError, "ZeroWeights::to_host: buffer count (LoRA on one model only?)");
  const DType mdt = model_.dtype();
  coll_.wait_all();
  coll_.join();
  const size_t W = static_cast<size_t>(place_.world);
  for (size_t i = 0; i < slots_.size(); ++i) {
    ZeroSlot& s = slots_[i];
    DT_ENFORCE_EQ(dst[i]->size, s.n, UsageError, "ZeroWeights::to_host: size of buffer {}", s.pb->layout.name);
    float* out = dst[i]->host_f32();
    if (!s.own_master) {  // resident without a master: the compute copy is the value
      offload_.host_from_device(out, s.pb->data, mdt, s.n);
    } else if (opts_.stage == 0 || coll_.comm() == nullptr) {
      offload_.shard_to_host(out, s);
    } else {
      device::DeviceBuffer full(dev_, W * s.s * sizeof(float));
      coll_.wait(coll_.submit([&] {
        offload_.shard_to_device(full.as<float>() + static_cast<size_t>(place_.rank) * s.s, DType::F32, s);
        coll_.all_gather(full.get(), s.s, DType::F32);
      }));
      coll_.join();
      offload_.host_from_device(out, full.get(), DType::F32, s.n);
    }
  }
}

}  // namespace dtrain::train
