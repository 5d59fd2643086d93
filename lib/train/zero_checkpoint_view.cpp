// ZeroEngine's checkpoint side (train/checkpoint.h reads and writes through it):
// ZeroCheckpointStage's views and staging, and the engine's checkpoint view and taking a
// loaded checkpoint back.
#include "train/zero_checkpoint_view.h"

#include "train/zero_comm.h"
#include "train/zero_compression.h"
#include "train/zero_engine.h"
#include "train/zero_gather.h"
#include "train/zero_offload.h"

#include "core/check.h"
#include "core/dtype.h"
#include "train/zero_slot.h"

#include <vector>

namespace dtrain::train {

void ZeroCheckpointStage::configure(bool model_on_host, DType model_dtype) {
  host_ = model_on_host;
  mdt_ = model_dtype;
}

// The top-k residuals, or PowerSGD's Q factors then (error feedback) its errors: the
// buffers themselves on the CPU device, their host copies on a device (stage_out).
std::vector<std::pair<float*, size_t>> ZeroCheckpointStage::rank_state() {
  std::vector<std::pair<float*, size_t>> out;
  const std::vector<device::DeviceBuffer*> state = compress_.rank_state();
  for (size_t i = 0; i < state.size(); ++i) {
    const size_t n = state[i]->bytes() / sizeof(float);
    out.emplace_back(host_ ? state[i]->as<float>() : staged_rank_[i].data(), n);
  }
  return out;
}

// On a device the view points at host copies (stage_out); a load writes them and
// loaded() takes them back (take_back).
void ZeroCheckpointStage::stage_out() {
  staged_.assign(slots_.size(), Staged{});
  const std::vector<device::DeviceBuffer*> state = compress_.rank_state();
  staged_rank_.assign(state.size(), {});
  for (size_t i = 0; i < state.size(); ++i) {
    staged_rank_[i].resize(state[i]->bytes() / sizeof(float));
    offload_.host_from_device(staged_rank_[i].data(), state[i]->get(), DType::F32, staged_rank_[i].size());
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    ZeroSlot& s = slots_[i];
    Staged& h = staged_[i];
    if (!s.sharded) h.full.assign(s.n, 0.0f);
    if (s.off) continue;  // the view points at the host master and moments themselves
    h.master.resize(s.owned());
    offload_.shard_to_host(h.master.data(), s);
    if (s.trainable) {
      h.m.resize(s.owned());
      h.v.resize(s.owned());
      offload_.host_from_device(h.m.data(), s.m.get(), DType::F32, s.owned());
      offload_.host_from_device(h.v.data(), s.v.get(), DType::F32, s.owned());
    }
  }
}

void ZeroCheckpointStage::loaded() {
  coll_.wait_all();
  gather_.release_all();
  coll_.join();
  if (!host_) {
    take_back();
    return;
  }
  for (auto& s : slots_) {
    if (s.sharded) continue;
    if (s.own_master && s.owned()) dev_.copy_d2d(s.master.get(), zero_fat(s.pb->data, s.lo), s.owned() * sizeof(float));
    if (opts_.compute_dtype != DType::F32) dev_.round_to(static_cast<float*>(s.pb->data), s.n, opts_.compute_dtype);
  }
}

void ZeroCheckpointStage::take_back() {
  DT_CHECK(staged_.size() == slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    ZeroSlot& s = slots_[i];
    Staged& h = staged_[i];
    if (s.off || s.off_param) {  // host state: the load wrote the master (or the full values)
      if (!s.sharded) offload_.device_from_host(s.pb->data, mdt_, h.full.data(), s.n);
      offload_.shard_from_host(s, !s.sharded ? h.full.data() + s.lo : s.off ? s.hmaster.as<float>() : h.master.data());
      continue;
    }
    if (!s.sharded) {  // a resident buffer: its full values were read
      offload_.device_from_host(s.pb->data, mdt_, h.full.data(), s.n);
      if (s.own_master) offload_.device_from_host(s.master.get(), s.sdt, h.full.data() + s.lo, s.owned());
    } else {
      offload_.device_from_host(s.master.get(), s.sdt, h.master.data(), s.owned());
    }
    if (s.trainable) {
      offload_.device_from_host(s.m.get(), DType::F32, h.m.data(), s.owned());
      offload_.device_from_host(s.v.get(), DType::F32, h.v.data(), s.owned());
    }
  }
  const std::vector<device::DeviceBuffer*> state = compress_.rank_state();
  DT_CHECK(staged_rank_.size() == state.size());
  for (size_t i = 0; i < state.size(); ++i)
    offload_.device_from_host(state[i]->get(), DType::F32, staged_rank_[i].data(), staged_rank_[i].size());
  staged_.clear();
  staged_rank_.clear();
}

std::vector<ZeroBufferView> ZeroCheckpointStage::buffers() {
  coll_.wait_all();
  coll_.join();
  const bool host = host_;
  if (!host) stage_out();
  std::vector<ZeroBufferView> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    ZeroSlot& s = slots_[i];
    ZeroBufferView v;
    v.buffer = s.pb;
    v.trainable = s.trainable;
    v.resident = !s.sharded;
    v.lo = s.lo;
    v.hi = s.hi;
    if (host) {
      v.master = s.owned() ? offload_.master_f32(s) : nullptr;
      v.m = s.trainable ? s.m.as<float>() : nullptr;
      v.v = s.trainable ? s.v.as<float>() : nullptr;
      v.full = v.resident ? s.pb->host_f32() : nullptr;
    } else if (s.off) {
      v.master = s.owned() ? s.hmaster.as<float>() : nullptr;
      v.m = s.hm.as<float>();
      v.v = s.hv.as<float>();
      v.full = v.resident ? staged_[i].full.data() : nullptr;
    } else {
      Staged& h = staged_[i];
      v.master = s.owned() ? h.master.data() : nullptr;
      v.m = s.trainable ? h.m.data() : nullptr;
      v.v = s.trainable ? h.v.data() : nullptr;
      v.full = v.resident ? h.full.data() : nullptr;
    }
    out.push_back(v);
  }
  return out;
}

// ----------------------------------------------------------------------------
ZeroCheckpointView ZeroEngine::checkpoint_view() {
  ZeroCheckpointView v;
  v.buffers = views_.buffers();
  v.comm = coll_.comm();
  v.world_comm = job_comm_;
  v.rank = place_.rank;
  v.world = place_.world;
  v.stage = opts_.stage;
  v.compute_dtype = opts_.compute_dtype;
  v.step_count = step_.results.step_count;
  v.rank_state = views_.rank_state();
  v.loaded = [this](int64_t step_count) {
    step_.results.step_count = step_count;
    views_.loaded();
  };
  return v;
}

}  // namespace dtrain::train
