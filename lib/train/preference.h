// Preference objectives over pairwise batches (training.stage dpo): DPO's sigmoid loss
// with label smoothing, ORPO and SimPO as LLaMA-Factory and TRL define them, each a
// function of the rows' target log-probability sums, returning the loss, its gradient
// with respect to each row's sum and the rewards TRL logs.
#pragma once

#include "config/train_config.h"
#include "model/model.h"
#include "train/metrics.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::train {

enum class PrefLoss : uint8_t { SIGMOID, ORPO, SIMPO };
/// Where DPO's reference log-probabilities come from (ORPO and SimPO have none).
enum class PrefReference : uint8_t { NONE, ADAPTERS_OFF, PRECOMPUTED };

struct PrefOptions {
  PrefLoss loss = PrefLoss::SIGMOID;
  double beta = 0.1;
  double ftx = 0.0;              ///< weight of -mean log p(chosen tokens), added per pair
  double label_smoothing = 0.0;  ///< DPO only
  double simpo_gamma = 0.5;      ///< SimPO only
  PrefReference reference = PrefReference::NONE;
};

/// training.pref_* of cfg; `lora` picks pref_reference auto's meaning. ConfigError for
/// pref_reference adapters_off without LoRA.
PrefOptions pref_options_from(const config::TrainConfig& cfg, bool lora);

/// One row's target log-probability sum and its unmasked-target count.
struct RowLogp {
  double sum = 0.0;
  int64_t count = 0;
};

/// Row sums of a [B, T] micro-batch from its per-position losses (-log p, 0 where
/// masked) and targets (masked < 0).
std::vector<RowLogp> row_logps(const float* token_losses, const int32_t* targets, int B, int T);

/// The sums over a batch's pairs of each logged quantity (TRL's names).
struct PrefStats {
  double chosen_reward = 0, rejected_reward = 0, accuracy = 0, margin = 0, chosen_logp = 0, rejected_logp = 0;
  double pairs = 0;
  /// rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen,
  /// logps/rejected: the means over `pairs`.
  std::vector<std::pair<std::string, double>> means() const;
  void add(const PrefStats& o);
};

struct PrefResult {
  double loss_sum = 0.0;     ///< the sum of the pairs' losses
  std::vector<double> dsum;  ///< d loss_sum / d (row b's log-probability sum), per row
  PrefStats stats;
};

/// The objective of P pairs: policy holds 2P rows, the P chosen then the P rejected (the
/// batch order of lib/data's pairwise datasets); ref the reference sums in the same order
/// (DPO), empty otherwise. ORPO and SimPO use each row's mean log-probability per target.
PrefResult pref_evaluate(const PrefOptions& o, const std::vector<RowLogp>& policy, const std::vector<double>& ref);

/// One preference micro-batch on m, the trainer's step and parity tools alike: `rows`
/// sequences (rows / 2 pairs, the chosen then the rejected, targets < 0 masked) of T tokens;
/// the reference sums (under ADAPTERS_OFF a forward of the base alone, under PRECOMPUTED
/// `ref` as given); the policy's forward; the objective; and the backward of
/// grad_scale * loss_sum (row b weighted by grad_scale * -dsum[b]), accumulating into m's
/// gradient buffers. With a timer, the passes are timed as FORWARD and BACKWARD.
PrefResult pref_micro_batch(model::Model& m, const int32_t* inputs, const int32_t* targets, int rows, int T,
                            const PrefOptions& o, const std::vector<double>& ref, double grad_scale,
                            StepTimer* timer = nullptr);

}  // namespace dtrain::train
