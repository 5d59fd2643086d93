// The ZeRO step as the host sees it: what the last step read back (its loss, target count
// and gradient norm, ZeroEngine::last_step()) with the counts kept across steps, and the
// flags the step's calls set for the hooks and step_issue.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain::train {

/// The last step's read-back values and the engine's counts across steps.
struct ZeroStepResults {
  /// The last step's loss sum over its unmasked targets and their count, both over every
  /// rank (0 when step_targets was not called for it).
  double loss_sum = 0.0, target_count = 0.0;
  /// Global L2 norm of the last step's unscaled, unclipped gradient (inf/NaN on overflow).
  double grad_norm = 0.0;
  /// The micro-batch losses the last step_finish() read back from the loss slots.
  std::vector<float> losses;
  /// Applied updates so far (AdamW's bias-correction step); an overflowed step leaves it.
  int64_t step_count = 0;
  /// Gradient collectives queued on the communication thread during backward before its
  /// last layer ran (so they could overlap with the remaining compute); cumulative.
  uint64_t comm_issued_in_backward = 0;
};

/// The engine's step state: the results, and what the step's calls set.
struct ZeroStepState {
  ZeroStepResults results;
  float lr = 0.0f;             // step_prepare's
  bool last_micro = true;      // set_last_micro_batch
  bool grads_reduced = false;  // stages 0/1: this step's reduction already ran in backward

  /// The AdamW step the update in flight applies (counted only if it is applied).
  int64_t next_step() const { return results.step_count + 1; }
};

}  // namespace dtrain::train
