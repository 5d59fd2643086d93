// ZeroReport: the engine's memory measured and in theory, the launcher's lines about it,
// and its collectives' times.
#include "train/zero_report.h"

#include "core/dtype.h"
#include "train/zero_comm.h"
#include "train/zero_slot.h"
#include "train/zero_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <string>

namespace dtrain::train {

ZeroCommTimes ZeroReport::comm_times_take() {
  const ZeroCommQueue::Times t = coll_.times_take();
  return {t.busy_s, t.exposed_s};
}

ZeroMemory ZeroReport::memory() const {
  ZeroMemory r;
  const DType mdt = model_.dtype();
  const bool mixed = opts_.compute_dtype != DType::F32;
  // What the model must hold for training: full parameters of the resident buffers
  // (all while materialized), full gradients below stage 2. Its own bookkeeping says
  // what it does hold; the difference is idle. A master shard counts as a parameter
  // where it is the buffer's only copy between uses (stage 3 without mixed precision,
  // frozen stage-3 shards) and as optimizer state beside a compute copy.
  const size_t W = static_cast<size_t>(place_.world), msz = dtype_size(mdt);
  const int st = opts_.stage;
  const size_t K = mixed ? 12 : 8;
  size_t want_param = 0, want_grad = 0;
  for (const auto& s : slots_) {
    if (!s.sharded || weights_.materialized()) want_param += s.n * msz;
    const bool master_is_param = s.sharded && (!mixed || !s.trainable);
    (master_is_param ? r.param_bytes : r.optim_bytes) += s.master.bytes();
    if (s.trainable) {
      r.optim_bytes += s.m.bytes() + s.v.bytes();
      r.grad_bytes += s.gshard.bytes();
      if (st < 2) want_grad += s.n * sizeof(float);
    }
    // Theory, per buffer (n / W for a shard).
    const size_t n = s.n, nw = n / W, n1 = st == 0 ? n : nw;
    if (s.off || s.off_param) {
      // Host: master, m, v and the gradient shard (+ its landing buffer at stages 2-3, +
      // the 16-bit copy), or a frozen shard; device: the compute copy (resident, or the
      // stage-3 shard unless offload_param) and stage 1's full gradient.
      for (const device::HostBuffer* h : {&s.hmaster, &s.hm, &s.hv, &s.hgrad, &s.hland, &s.hcopy}) {
        r.host_bytes += h->bytes();
        if (h->pinned()) r.host_pinned_bytes += h->bytes();
      }
      r.param_bytes += s.dshard.bytes();
      if (s.off) {
        r.theory_host += (16 + (st >= 2 ? 4 : 0) + (mdt != DType::F32 ? 2 : 0)) * nw;
        if (st < 2) r.theory_grad += 4 * n;
      } else {
        r.theory_host += dtype_size(s.sdt) * nw;
      }
      if (!s.sharded) r.theory_param += msz * n;
      else if (!s.off_param) r.theory_param += msz * nw;
      continue;
    }
    if (!s.sharded) r.theory_param += msz * n;
    else r.theory_param += (s.trainable ? (mixed ? 0 : 4) : dtype_size(s.sdt)) * nw;
    if (s.trainable) {
      r.theory_grad += 4 * (st >= 2 ? nw : n);
      r.theory_optim += K * n1;
    } else if (mixed && mdt == DType::F32 && !s.sharded) {
      r.theory_optim += 4 * n1;  // the CPU's exact frozen masters
    }
  }
  const size_t have_param = model_.param_allocated_bytes(), have_grad = model_.grad_allocated_bytes();
  r.param_bytes += std::min(have_param, want_param);
  r.grad_bytes += std::min(have_grad, want_grad);
  r.model_idle_bytes = have_param - std::min(have_param, want_param) + have_grad - std::min(have_grad, want_grad);
  r.work_peak_bytes = work_.peak();
  return r;
}

std::string ZeroReport::memory_text() const {
  const ZeroMemory m = memory();
  auto mib = [](size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::string s =
      fmt::format("zero: stage {} on {} rank(s), {} compute on {}, overlap_comm {}\n", opts_.stage, place_.world,
                  dtype_name(opts_.compute_dtype), model_.device().name(), opts_.overlap_comm ? "on" : "off");
  // The CPU device computes in fp32: its bf16/fp16 is the optimizer rounding the fp32
  // compute copy, which saves neither memory nor time. Say so rather than let the line
  // above suggest 2-byte GEMMs.
  if (opts_.compute_dtype != DType::F32 && model_.device().kind() == device::Kind::CPU)
    s += fmt::format(
        "zero: {} on the CPU is fp32 compute on values rounded to {} (4-byte compute copies, fp32 "
        "GEMMs): no memory or time saved; 2-byte CPU GEMMs are not built\n",
        dtype_name(opts_.compute_dtype), dtype_name(opts_.compute_dtype));
  s += fmt::format(
      "zero: per rank  params {:.2f} MiB (theory {:.2f})  grads {:.2f} MiB (theory {:.2f})  "
      "optimizer {:.2f} MiB (theory {:.2f})  total {:.2f} MiB (theory {:.2f})\n",
      mib(m.param_bytes), mib(m.theory_param), mib(m.grad_bytes), mib(m.theory_grad), mib(m.optim_bytes),
      mib(m.theory_optim), mib(m.total()), mib(m.theory_total()));
  if (opts_.stage == 3) {
    size_t resident = 0;
    for (const auto& sl : slots_) resident += sl.sharded ? 0 : 1;
    if (resident)
      s += fmt::format(
          "zero: {} of {} parameter buffers are below stage3_param_persistence_threshold ({}) and stay "
          "resident (counted in params)\n",
          resident, slots_.size(), opts_.param_persistence_threshold);
  }
  if (offload_.on())
    s += fmt::format(
        "zero: offload_optimizer{}: host {:.2f} MiB (theory {:.2f}), {:.2f} MiB of it pinned; AdamW on the host {}\n",
        offload_.on_param() ? " + offload_param" : "", mib(m.host_bytes), mib(m.theory_host), mib(m.host_pinned_bytes),
        offload_.eager() ? "bucket by bucket during the backward"
                         : "after the backward (clipping or fp16 needs the whole gradient)");
  s += fmt::format("zero: transient peak {:.2f} MiB; model-owned storage left idle {:.2f} MiB\n",
                   mib(m.work_peak_bytes), mib(m.model_idle_bytes));
  return s;
}

}  // namespace dtrain::train
