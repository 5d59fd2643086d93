// The one model of lib/model (GPT-2 / Llama, GQA, tied or untied head, LoRA with dropout,
// SFT masking, recompute) trained end to end on one CUDA device through lib/device: the
// model holds the compute copy, fp32 gradients and one activation arena; the trainer
// holds fp32 masters and AdamW moments. Built without CUDA, the factory throws DeviceError.
#pragma once

#include "core/dtype.h"
#include "model/model.h"
#include "ops/optim.h"
#include "train/loss_scaler.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::gpu {

struct GpuTrainOptions {
  int micro_batch = 1;          ///< B: the arena is sized for it
  int seq_len = 0;              ///< T (<= max_seq_len): the arena is sized for it
  int grad_accum = 1;           ///< the most micro-batches one step() may take
  DType compute = DType::BF16;  ///< parameters and activations: F32, BF16 or F16
  ops::AdamWConfig adamw;
  float max_grad_norm = 0.0f;   ///< global-norm clipping (0 = off)
  train::LossScalerConfig loss_scaler;  ///< used when compute == F16 (dynamic by default)
  int device = 0;
  bool recompute = false;       ///< activation checkpointing: keep layer inputs, recompute in backward
};

/// What one optimizer step did (the CPU trainer's per-step figures).
struct GpuStepResult {
  double loss = 0.0;        ///< mean cross-entropy over every unmasked target of the step
  double grad_norm = 0.0;   ///< global, unscaled, before clipping (inf/NaN on overflow)
  float loss_scale = 1.0f;  ///< the scale this step ran with
  bool skipped = false;     ///< fp16 overflow: weights, optimizer step count unchanged
  int64_t targets = 0;      ///< unmasked targets of the step
};

struct GpuMemory {
  size_t arena_bytes = 0;      ///< parameters, masters, gradients, AdamW state, activations
  size_t workspace_bytes = 0;  ///< cuBLASLt workspace (kernels/gemm.cuh: 32 MiB per device)
  size_t device_used_bytes = 0;   ///< cudaMemGetInfo: total - free (whole device, now)
  size_t device_total_bytes = 0;
};

/// A model on the device with its optimizer. Parameter buffers have exactly the CPU
/// model's layouts (model::layout_build, LoRA buffers), so weights copy across in both
/// directions. One CUDA stream; the host waits for the device when it uploads a
/// micro-batch's tokens and reads back its loss, and once per step for the gradient norm
/// and the overflow flag, which the clip coefficient and the loss scaler need before AdamW.
class GpuTrainer {
 public:
  virtual ~GpuTrainer() = default;

  virtual const model::ModelConfig& config() const = 0;
  virtual const GpuTrainOptions& options() const = 0;

  /// One optimizer step over `accum` micro-batches (inputs and targets: accum * B * T each,
  /// host memory; IGNORE_INDEX -100 masks a target), with the CPU trainer's math: the loss
  /// is token-weighted over the whole step, micro-batch i is back-propagated with weight
  /// n_i / n_step * loss_scale, then overflow check (fp16), global-norm clip, AdamW at lr.
  /// Tokens outside [0, vocab) throw UsageError (checked on the host).
  virtual GpuStepResult step(const int32_t* inputs, const int32_t* targets, int accum, float lr) = 0;

  /// Forward and backward of one micro-batch [B, T]: accumulates grad_scale * d(mean
  /// loss)/d(params) into the fp32 gradients (the adapters' only under LoRA) and returns
  /// the mean loss (0 when every target is masked). For tests and evaluation.
  virtual float forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale) = 0;
  /// Zeros the trainable gradients.
  virtual void zero_grad() = 0;
  /// The trainable gradients (model::Model::trainable_params() order), copied to the host.
  virtual std::vector<std::vector<float>> grads_to_host() = 0;
  /// Copies the fp32 master weights of the trainable buffers into m (same config; LoRA
  /// enabled with the same targets when it is on here). Frozen base weights are not
  /// copied: they never change on the device.
  virtual void weights_to_model(model::Model& m) = 0;

  virtual GpuMemory memory() const = 0;
  /// cudaDeviceProp::name of the device.
  virtual std::string device_name() const = 0;
  /// Optimizer steps applied so far (fp16 overflow steps excluded).
  virtual int64_t applied_steps() const = 0;
  /// Waits for every queued kernel (step() returns before its AdamW kernels finish).
  virtual void synchronize() = 0;
};

/// Builds the device model from init (its config, weights and LoRA adapters, copied
/// once). Throws DeviceError when built without CUDA or no device is visible, ConfigError
/// for seq_len outside [1, max_seq_len], UsageError for bad batch sizes.
std::unique_ptr<GpuTrainer> gpu_trainer_create(model::Model& init, const GpuTrainOptions& opts);

}  // namespace dtrain::gpu
