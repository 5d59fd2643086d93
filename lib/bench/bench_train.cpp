// bench_train_run: builds the config's model as the trainer does (train::model_create:
// random init from training.seed or model.init_from's weights, LoRA when lora.r > 0, and
// its device copy), runs the trainer's own step (train::TrainStep: ZeRO engine at stage 0,
// one rank) on synthetic random tokens for warm-up + timed steps on CUDA or the CPU, and
// derives tokens/s, MFU and memory.
#include "bench/bench_train.h"

#include "train/memory_plan.h"

#include "core/check.h"
#include "device/cuda_workspace.h"
#include "device/device.h"
#include "train/metrics.h"
#include "train/model_factory.h"
#include "train/step_setup.h"
#include "train/step_shape.h"
#include "train/train_step.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#ifdef DTRAIN_HAVE_CUDA
#include "core/cuda_check.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#endif

namespace dtrain::bench {

namespace {

constexpr double NaN = std::numeric_limits<double>::quiet_NaN();

std::string gib(size_t b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1u << 30)); }

nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

}  // namespace

// ----------------------------------------------------------------------------
double gpu_peak_bf16_tflops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return H100_SXM_BF16_TFLOPS;  // the H100 SXM's tensor cores, more memory
  if (has("H100")) {
    if (has("PCIe")) return 756.0;
    if (has("SXM") || has("HBM3")) return H100_SXM_BF16_TFLOPS;  // "NVIDIA H100 80GB HBM3" is the SXM part
    return NaN;                                                  // NVL and other variants: not in the table
  }
  if (has("A100")) return 312.0;
  return NaN;
}

namespace {

using Clock = std::chrono::steady_clock;

// What the setup says of the run: its config, device, shape and dtype.
BenchTrainResult train_result_of(const BenchTrainOptions& o, const train::StepSetup& setup) {
  BenchTrainResult r;
  train::step_shape_set(r, o.config_path, setup);
  r.device = o.device;
  r.steps = o.steps;
  r.warmup = o.warmup;
  r.notes = setup.notes;
  return r;
}

// The trainer's model, built as the trainer builds it: on the CPU whole; on a GPU with
// deferred storage, each base buffer's values (the random init or model.init_from's
// tensors) made on the host one buffer at a time and taken by the engine (so.deferred_weights),
// so no host fp32 copy of the model exists (an 8B model's would be 32 GB, built on one
// thread's worth of memory bandwidth). The device outlives the model.
struct BenchModel {
  std::unique_ptr<device::Device> dev;
  std::unique_ptr<model::Model> model;
};
BenchModel bench_model(const train::StepSetup& setup, bool cuda, train::TrainStepOptions& so, BenchTrainResult& r) {
  BenchModel b;
  if (cuda) {
    b.dev = device::cuda_create(0);
    train::DeferredModel d = train::model_create_deferred(setup.cfg, *b.dev, setup.dtype);
    b.model = std::move(d.model);
    so.deferred_weights = std::move(d.fill);
    r.device_name = b.dev->name();
  } else {
    b.model = train::model_create(setup.cfg);
    r.device_name = "CPU (reference model, fp32)";
  }
  r.params = static_cast<int64_t>(b.model->num_params());
  r.trainable_params = static_cast<int64_t>(b.model->num_trainable_params());
  return b;
}

// The warm-up and timed steps over the batches, cycled: each step's loss and wall time into
// r. Returns when the timed steps started.
Clock::time_point run_steps(train::TrainStep& step, model::Model& tm, const std::vector<train::SyntheticBatch>& batches,
                            const train::StepSetup& setup, const BenchTrainOptions& o, BenchTrainResult& r) {
  [[maybe_unused]] const bool cuda = o.device == device::Kind::CUDA;
  train::StepTimer timer;  // the trainer's sections; the bench reads the wall clock
  Clock::time_point t0, ts = Clock::now();
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) {
      tm.device().synchronize();
      t0 = Clock::now();
#ifdef DTRAIN_HAVE_CUDA
      // A profiler started with "from start off" (ncu --profile-from-start off, as the GPU
      // check's speed stage does) records the timed steps only; without one, no effect.
      if (cuda) DT_CUDA_CHECK(cudaProfilerStart());
#endif
    }
    r.final_loss = step.run(s + 1, setup.lr, batches[static_cast<size_t>(s) % batches.size()].view(), timer).loss;
    r.losses.push_back(r.final_loss);
    // The step's loss is read back above, so the host clock has seen the step's work.
    const Clock::time_point te = Clock::now();
    r.step_ms_each.push_back(1e3 * std::chrono::duration<double>(te - ts).count());
    ts = te;
  }
  tm.device().synchronize();
#ifdef DTRAIN_HAVE_CUDA
  if (cuda) DT_CUDA_CHECK(cudaProfilerStop());
#endif
  return t0;
}

// A GPU run's memory: the engine's and the arena's bytes, the allocator's pool, the memory
// plan's figure for this job on one GPU, and the device's own count.
void read_gpu_memory(BenchTrainResult& r, const train::TrainStep& step, const model::Model& tm,
                     const train::StepSetup& setup) {
  const train::ZeroMemory zm = step.engine().report().memory();
  r.offload_host_bytes = zm.host_bytes;
  r.arena_bytes = zm.total() + tm.activation_bytes();
  r.workspace_bytes = device::cuda_workspace_bytes();
  const device::Device::MemoryStats ms = tm.device().memory_stats();
  r.pool_peak_bytes = ms.used_peak;
  r.pool_reserved_bytes = ms.reserved;
  config::TrainConfig pc = setup.cfg;
  pc.training.device = "cuda";
  pc.resolved_micro_batch_size = setup.micro_batch;
  pc.resolved_grad_accum_steps = setup.grad_accum;
  r.planned_device_bytes = train::memory_plan(pc, 1).device_bytes();
#ifdef DTRAIN_HAVE_CUDA
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    r.device_used_bytes = total_b - free_b;
    r.device_total_bytes = total_b;
  }
#endif
}

}  // namespace

BenchTrainResult bench_train_run(const BenchTrainOptions& o) {
  DT_ENFORCE_GT(o.steps, 0, UsageError, "bench train: --steps");
  DT_ENFORCE_GE(o.warmup, 0, UsageError, "bench train: --warmup");
  const bool cuda = o.device == device::Kind::CUDA;
  if (cuda) device::cuda_require(0);  // before building a possibly large model
  const auto setup_t0 = Clock::now();

  const train::StepSetup setup = train::step_setup_from(o.config_path, o.sets, cuda);
  BenchTrainResult r = train_result_of(o, setup);
  train::TrainStepOptions so = setup.step_options();
  const BenchModel built = bench_model(setup, cuda, so, r);
  model::Model& tm = *built.model;

  // Synthetic data: a few different random batches, cycled.
  std::vector<train::SyntheticBatch> batches;
  for (uint64_t k = 0; k < 4; ++k) batches.push_back(train::synthetic_batch(setup, k));
  const size_t per_step = static_cast<size_t>(setup.grad_accum) * setup.micro_batch * setup.seq_len;

  train::TrainStep step(tm, nullptr, nullptr, setup.zero, so);
  so.deferred_weights = {};  // closes init_from's files: the engine holds the weights
  r.setup_s = std::chrono::duration<double>(Clock::now() - setup_t0).count();
  const Clock::time_point t0 = run_steps(step, tm, batches, setup, o, r);
  // The clock stops when the timed steps have finished (run_steps synchronizes): reading
  // the offload trace and the memory figures, and pricing the memory plan, are not steps.
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  r.offload_trace = step.engine().report().offload_trace();
  if (cuda) read_gpu_memory(r, step, tm, setup);
  r.step_ms = 1e3 * secs / o.steps;
  r.tokens_per_s = static_cast<double>(per_step) * o.steps / secs;
  r.flops_per_token = train::model_flops_per_token(setup.model, r.params, r.seq_len, setup.lora.has_value());
  r.flops_formula = train::model_flops_formula(r.params, r.n_layer, r.seq_len, r.d_model, setup.lora.has_value());
  r.achieved_tflops = r.flops_per_token * r.tokens_per_s / 1e12;
  r.peak_tflops = cuda ? gpu_peak_bf16_tflops(r.device_name) : NaN;
  r.mfu = r.achieved_tflops / r.peak_tflops;  // NaN when the peak is unknown
  return r;
}

namespace {

nlohmann::json train_json(const BenchTrainResult& r) {
  nlohmann::json j = train::step_shape_json(r);
  j.update(nlohmann::json{{"device", device::kind_name(r.device)},
                          {"device_name", r.device_name},
                          {"warmup", r.warmup},
                          {"steps", r.steps},
                          {"step_ms", r.step_ms},
                          {"tokens_per_s", r.tokens_per_s},
                          {"flops_per_token", r.flops_per_token},
                          {"flops_formula", r.flops_formula},
                          {"achieved_tflops", r.achieved_tflops},
                          {"peak_tflops", num(r.peak_tflops)},
                          {"mfu", num(r.mfu)},
                          {"offload_host_bytes", r.offload_host_bytes},
                          {"setup_s", r.setup_s},
                          {"final_loss", num(r.final_loss)},
                          {"losses", r.losses},
                          {"step_ms_each", r.step_ms_each},
                          {"notes", r.notes}});
  if (r.device == device::Kind::CUDA) {
    j["arena_bytes"] = r.arena_bytes;
    j["workspace_bytes"] = r.workspace_bytes;
    j["peak_memory_bytes"] = r.arena_bytes + r.workspace_bytes;
    j["device_used_bytes"] = r.device_used_bytes;
    j["device_total_bytes"] = r.device_total_bytes;
    j["planned_device_bytes"] = r.planned_device_bytes;
    j["pool_peak_bytes"] = r.pool_peak_bytes;
    j["pool_reserved_bytes"] = r.pool_reserved_bytes;
  }
  if (!r.offload_trace.empty()) {
    nlohmann::json t = nlohmann::json::array();
    for (const auto& e : r.offload_trace)
      t.push_back({{"what", e.what}, {"index", e.index}, {"t0", e.t0}, {"t1", e.t1}});
    j["offload_trace"] = t;
  }
  return j;
}

// The last step's offload schedule: how much of the host update ran during the backward.
std::string offload_line(const BenchTrainResult& r) {
  double last_landed = 0, adamw_s = 0;
  int buckets = 0, early = 0;
  for (const auto& e : r.offload_trace)
    if (e.what == "landed") last_landed = std::max(last_landed, e.t0);
  for (const auto& e : r.offload_trace)
    if (e.what == "adamw") {
      adamw_s += e.t1 - e.t0;
      if (e.index >= 0) {
        ++buckets;
        if (e.t0 < last_landed) ++early;
      }
    }
  return fmt::format(
      "offload      host {} ({}); host AdamW {:.2f} ms per step{}\n", gib(r.offload_host_bytes),
      "masters, moments, gradient shards", 1e3 * adamw_s,
      buckets ? fmt::format(", {} of {} buckets updated before the last bucket's gradient landed", early, buckets)
              : " after the backward (clipping or fp16: the update needs the whole gradient)");
}

std::string train_text(const BenchTrainResult& r) {
  const bool gpu = r.device == device::Kind::CUDA;
  std::string s;
  s += fmt::format("bench train: {} on {}\n", r.config, r.device_name);
  s += fmt::format("model        {} {:.2f}M params ({:.2f}M trainable{}), L={} d_model={}, {}\n", r.arch,
                   r.params / 1e6, r.trainable_params / 1e6, r.lora_rank ? fmt::format(", LoRA r={}", r.lora_rank) : "",
                   r.n_layer, r.d_model, r.dtype);
  s += fmt::format("batch        micro {} x seq {} x accum {} = {} tokens/step; {} warm-up + {} timed steps\n",
                   r.micro_batch, r.seq_len, r.grad_accum,
                   static_cast<int64_t>(r.micro_batch) * r.seq_len * r.grad_accum, r.warmup, r.steps);
  s += fmt::format("setup        {:.2f} s (model build, device copy, engine)\n", r.setup_s);
  s += fmt::format("step time    {:.2f} ms\n", r.step_ms);
  s += fmt::format("tokens/s     {:.0f}\n", r.tokens_per_s);
  s += fmt::format("model FLOPs  {:.3f} GFLOP/token ({})\n", r.flops_per_token / 1e9, r.flops_formula);
  s += fmt::format("achieved     {:.2f} TFLOPS\n", r.achieved_tflops);
  if (std::isfinite(r.mfu))
    s += fmt::format("MFU          {:.1f}% of {:.0f} TFLOPS dense bf16 peak\n", 100.0 * r.mfu, r.peak_tflops);
  else s += fmt::format("MFU          N/A ({})\n", gpu ? "device not in the peak table" : "CPU run");
  if (gpu)
    s += fmt::format("peak memory  {} (arena {} + cuBLASLt workspace {}); device in use {} of {}\n",
                     gib(r.arena_bytes + r.workspace_bytes), gib(r.arena_bytes), gib(r.workspace_bytes),
                     gib(r.device_used_bytes), gib(r.device_total_bytes));
  if (gpu)
    s += fmt::format("memory plan  {} planned (--dry-run, one GPU); the allocator's peak in use {}, held {}\n",
                     gib(static_cast<size_t>(r.planned_device_bytes)), gib(r.pool_peak_bytes),
                     gib(r.pool_reserved_bytes));
  s += fmt::format("final loss   {:.4f}\n", r.final_loss);
  if (!r.offload_trace.empty()) s += offload_line(r);
  for (const auto& n : r.notes) s += "note         " + n + "\n";
  return s;
}

}  // namespace

std::string bench_train_format(const BenchTrainResult& r, bool json) {
  return json ? train_json(r).dump() + "\n" : train_text(r);
}

}  // namespace dtrain::bench
