// Softmax cross-entropy over logits [N,V] with integer targets and an ignore index
// (-100 like PyTorch). The backward is fused with the softmax and WRITES dlogits (it
// does not accumulate: it is the start of the backward pass); dlogits may alias logits.
// Rows are ld >= V elements apart (a padded vocabulary); only the first V are read or
// written.
#pragma once

#include <cstdint>

namespace dtrain::ops {

inline constexpr int32_t IGNORE_INDEX = -100;

/// Number of rows whose target is not ignore_index.
int cross_entropy_count(const int32_t* targets, int N, int32_t ignore_index = IGNORE_INDEX);

/// losses[n] = logsumexp(logits[n]) - logits[n, targets[n]] (0 for ignored rows); returns
/// the mean over unmasked rows (0 when every row is masked). Throws UsageError when a
/// target is outside [0, V) and not ignore_index. When row_lse is given it receives each
/// row's logsumexp (NaN for ignored rows: not computed) for cross_entropy_backward.
float cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V, int ld,
                            int32_t ignore_index = IGNORE_INDEX, float* row_lse = nullptr);

/// dlogits[n] = (softmax(logits[n]) - onehot(targets[n])) * scale for unmasked rows, 0 for
/// masked rows. For the gradient of the mean loss times an upstream factor g (loss scale,
/// 1/grad_accum, ...) pass scale = g / cross_entropy_count(...). row_lse, when given, is
/// the forward's per-row logsumexp of these same logits: the backward then skips
/// recomputing it (the same bits either way; rows holding NaN are recomputed).
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V, int ld,
                            float scale, int32_t ignore_index = IGNORE_INDEX, const float* row_lse = nullptr);

}  // namespace dtrain::ops
