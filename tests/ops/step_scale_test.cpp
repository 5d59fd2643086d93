// The step values of ops/step_scale.h that the host and the device share: the
// cross-entropy backward's per-target scale from a target count, and the step's loss sum
// from the micro-batches' mean losses and counts.
#include "ops/step_scale.h"

#include <doctest/doctest.h>

#include <cmath>

using namespace dtrain::ops;

TEST_CASE("step scale: cross-entropy backward scale = factor / count, 0 without targets") {
  CHECK(ce_backward_scale(2.0f, 8.0f) == 0.25f);
  CHECK(ce_backward_scale(1024.0f * 2.0f, 3.0f) == 2048.0f / 3.0f);
  CHECK(ce_backward_scale(1.0f, 0.0f) == 0.0f);
  CHECK(ce_backward_scale(0.0f, 5.0f) == 0.0f);
}

TEST_CASE("step scale: loss sum over micro-batches skips those without targets") {
  const float means[3] = {2.5f, NAN, 0.5f};  // the middle slot was never written
  const float counts[3] = {4.0f, 0.0f, 6.0f};
  CHECK(step_loss_sum(means, counts, 3) == 2.5 * 4.0 + 0.5 * 6.0);
  CHECK(step_loss_sum(means, counts, 0) == 0.0);
  const float one[1] = {0.1f};
  const float c[1] = {3.0f};
  CHECK(step_loss_sum(one, c, 1) == static_cast<double>(0.1f) * 3.0);
}
