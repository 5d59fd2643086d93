// Gradient norm and clip coefficient. Four double accumulators break the add
// dependency chain so the loop runs near memory speed.
#include "train/grad_clip.h"

#include <cmath>

namespace dtrain::train {

double grad_norm_sq(const float* g, size_t n) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t k = 0; k < 4; ++k) {
      const double x = g[i + k];
      acc[k] += x * x;
    }
  }
  for (; i < n; ++i) {
    const double x = g[i];
    acc[0] += x * x;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

float clip_coefficient(double total_norm, float max_norm) {
  if (!(max_norm > 0.0f) || !std::isfinite(total_norm)) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (total_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace dtrain::train
