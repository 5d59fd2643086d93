// The clip coefficient of global-norm clipping (the sum of squares is ops::grad_norm_sq).
#include "train/grad_clip.h"

#include "ops/step_scale.h"

namespace dtrain::train {

float clip_coefficient(double total_norm, float max_norm) { return ops::clip_coefficient(total_norm, max_norm); }

}  // namespace dtrain::train
