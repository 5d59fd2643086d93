// The clip coefficient of global-norm clipping (the sum of squares is ops::grad_norm_sq).
#include "train/grad_clip.h"

#include <cmath>

namespace dtrain::train {

float clip_coefficient(double total_norm, float max_norm) {
  if (!(max_norm > 0.0f) || !std::isfinite(total_norm)) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (total_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace dtrain::train
