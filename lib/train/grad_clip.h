// Global-norm gradient clipping as torch.nn.utils.clip_grad_norm_ (L2 norm): the
// clip coefficient from the global norm (the local sum of squares of a shard is
// ops::grad_norm_sq).
// The trainer allreduces the per-rank sums and takes the square root in between.
#pragma once

#include <cstddef>

namespace dtrain::train {

/// min(1, max_norm / (total_norm + 1e-6)), torch's clip coefficient; 1 when max_norm <= 0
/// (clipping disabled). A non-finite total_norm gives 1 so that the overflow check, not
/// the clip, decides what happens to the step.
float clip_coefficient(double total_norm, float max_norm);

}  // namespace dtrain::train
