// The training loop: model (model_factory) + data (data_loader) + AdamW, LR schedule,
// gradient accumulation, ZeRO data parallelism over a Communicator, bf16/fp16 mixed
// precision with fp32 master weights, fp16 loss scaling, global-norm clipping,
// metrics.jsonl, periodic validation, sharded checkpoints with exact resume (also at
// another world size or ZeRO stage) and the final HF export.
#pragma once

#include "comm/communicator.h"
#include "config/train_config.h"
#include "device/device.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace dtrain::train {

struct TrainerEnv {
  int rank = 0;
  int world_size = 1;
  /// metrics.jsonl and final/ go here (rank 0 writes them); "" = write no files.
  std::string run_dir;
  /// nullptr or size 1 = single rank; otherwise rank()/size() must match rank/world_size.
  comm::Communicator* comm = nullptr;
  /// Train over `comm` even at size 1 (its buckets, streams and events: the GPU check runs
  /// NCCL's path on one card this way); false drops a size-1 communicator.
  bool single_rank_comm = false;
  /// Where the model, its gradients and the ZeRO engine's state live: nullptr = the CPU.
  /// A CUDA device needs a communicator whose buffers live on it (NCCL) when world_size > 1.
  device::Device* device = nullptr;
  /// false: rank 0 prints no progress lines (tests).
  bool print = true;
  /// Rank 0 prints its progress as record lines (report/progress_record.h) for the
  /// launcher, which reads them and writes the human line into the rank's log, instead of
  /// the human progress line (dtrain launch's workers; not `dtrain run`).
  bool progress_records = false;
  /// false: start from scratch even when run_dir holds a checkpoint (it is then
  /// overwritten by this run's checkpoints).
  bool resume = true;
  /// Training progress for a watchdog (the launcher's step timeout): called on entering
  /// the step loop with the step it continues after (0 = fresh start) and after every
  /// optimizer step (its evaluation and checkpoint included) with that step's index.
  std::function<void(int64_t step)> on_step;
  /// Called once when the step loop is over (before the final evaluation, checkpoint and
  /// export), so a watchdog stops expecting steps.
  std::function<void()> on_steps_done;
  /// Asked on every rank after each periodic checkpoint (not the final one): true on any
  /// rank stops every rank right there, with the checkpoint complete and nothing trained
  /// past it (the launcher regrows an elastic job this way). No final evaluation,
  /// checkpoint or export follows; TrainResult::stopped_at_checkpoint says so.
  std::function<bool(int64_t step)> stop_after_save;
};

/// What a run did. Per-step vectors have one entry per optimizer step attempted by THIS
/// call (skipped fp16 overflow steps included): after a resume from step K they start
/// at step K + 1. The counters (steps, applied/skipped steps, tokens) count from step 1.
struct TrainResult {
  int64_t steps = 0;                   ///< attempted optimizer steps (the last step's index)
  int64_t applied_steps = 0;           ///< steps that updated the weights (= scheduler/optimizer step count)
  int64_t skipped_steps = 0;           ///< fp16 overflow steps
  bool stopped_at_checkpoint = false;  ///< stop_after_save stopped the run after its checkpoint at `steps`
  int64_t graph_steps = 0;             ///< steps replayed from a CUDA graph (training.cuda_graph)
  int64_t resumed_step = -1;           ///< the checkpoint step this call continued from; -1 = fresh start
  std::string resumed_dir;             ///< that checkpoint's directory
  int resumed_world_size = 0;          ///< world size and ZeRO stage it was saved at
  int resumed_stage = 0;
  /// Newer checkpoints that were unusable and skipped, one line each naming the bad file.
  std::vector<std::string> checkpoints_skipped;
  std::string last_checkpoint;   ///< the directory of the last checkpoint this call wrote ("" = none)
  double final_loss = 0.0;       ///< loss of the last step
  double final_eval_loss = 0.0;  ///< NaN when there is no validation set
  double final_eval_ppl = 0.0;
  /// training.stage dpo with data.valid: the held-out pairs whose chosen answer the final
  /// model ranks above the rejected one (NaN otherwise).
  double final_pref_accuracy = std::numeric_limits<double>::quiet_NaN();
  double final_loss_scale = 1.0;
  int64_t tokens = 0;               ///< input tokens of steps 1..steps over all ranks (this run's batch)
  double elapsed_s = 0.0;           ///< wall time of the loop (model build and export excluded)
  std::vector<double> losses;       ///< mean loss per step over all micro-batches and ranks
  std::vector<double> lrs;          ///< lr used by each step (skipped steps: the lr they would have used)
  std::vector<double> grad_norms;   ///< pre-clip global norm (unscaled); NaN/inf on overflow
  std::vector<double> loss_scales;  ///< loss scale each step ran with (1 without fp16)
  std::vector<char> skipped;        ///< 1 where the step was skipped
};

/// Trains cfg to the end. cfg must have been through config_resolve_batch for
/// env.world_size. Every rank calls it with the same cfg.
///
/// Loss normalisation: the step loss is the mean cross-entropy over ALL unmasked target
/// tokens of the step (every micro-batch on every rank), so micro 4 x accum 1, micro 2 x
/// accum 2 and 2 ranks x micro 2 give the same loss and gradient: the unmasked-token
/// counts are summed over micro-batches and allreduced before backward, and micro-batch
/// i on a rank is back-propagated with weight world_size * n_i / N_step (n_i its
/// unmasked tokens, N_step the global count) before the gradient AVG across ranks.
///
/// Mixed precision (bf16.enabled or fp16.enabled): fp32 master weights are kept apart
/// and are what AdamW updates; the model's own parameter buffers hold the compute copy,
/// the master values rounded to bf16/fp16 (round to nearest even) and stored as fp32,
/// which forward and backward read (AdamW's compute-copy variant writes it after each
/// update). Activations and the cross-entropy stay fp32 on the CPU. Under fp16 the
/// gradient buffers are rounded to fp16 after each micro-batch's backward, as fp16
/// gradient storage would hold them, so a too-large loss scale overflows to inf; the
/// overflow decision is allreduced (MAX) so every rank skips together, and a skipped
/// step advances neither the scheduler nor the optimizer step count. bf16 gradients
/// stay fp32. final/ holds the fp32 master weights.
///
/// Checkpoints (env.run_dir set): every training.save_steps steps (when > 0) and at the
/// end, a sharded checkpoint (train/checkpoint.h) with the loop's whole state: step,
/// scheduler step, loss-scaler state, the global sampler position, the model's forward
/// count (LoRA dropout masks) and the resolved config; training.keep_last are kept. At
/// start, with env.resume, the latest complete checkpoint is loaded (resharded when it
/// was written at another world size or stage) and the loop continues after its step:
/// at the same world size and stage the continuation is bit-identical to an
/// uninterrupted run on the CPU (losses and weights); at another one it differs only by
/// fp32 reduction order, provided the global batch (train_batch_size) is the same.
/// metrics.jsonl is then continued: records of steps after the checkpoint's (a re-run)
/// are dropped first. Every metrics record carries "time_ms" (unix ms).
/// A checkpoint at or beyond the configured last step trains nothing: the final
/// weights are exported again (raise training.max_steps to train on).
///
/// Throws ConfigError for configs it cannot run, TrainError when the loss becomes
/// non-finite without fp16 or the fp16 scale cannot go lower, CommError from the
/// collectives, CheckpointError when run_dir's checkpoints exist but none is usable or
/// they do not fit the model.
TrainResult train_run(const config::TrainConfig& cfg, const TrainerEnv& env);

}  // namespace dtrain::train
