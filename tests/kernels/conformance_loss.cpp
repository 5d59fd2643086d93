// Conformance cases for the fused softmax cross-entropy: losses, mean and dlogits against
// lib/ops/cross_entropy.h with masked rows, odd vocabularies (unaligned rows), separate
// and in-place dlogits, the forward-only and backward-only entry points, the NaN row an
// invalid target produces, and padded rows (a row pitch past V) whose padding stays NaN.
#include "cases.h"

#include "kernels/cross_entropy.cuh"
#include "ops/cross_entropy.h"

namespace dtrain::kernels::test {

namespace {

enum class Mode { FUSED, FUSED_IN_PLACE, SEPARATE };

// masked_vocab: the first logits of every row are -inf (a masked or padded vocabulary),
// so the first value many threads see is -inf. ld > V: rows ld apart whose padding is NaN
// (the model's padded logits), never read nor written.
double ce_case(DType t, int V, int ld, Mode mode, uint64_t seed, bool masked_vocab = false) {
  Rng r(seed);
  const int N = 37;
  Floats logits = round_through(rand_floats(r, static_cast<size_t>(N) * V, 3.0f), t);
  const int masked = masked_vocab ? std::min(V - 1, 700) : 0;
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < masked; ++i) logits[static_cast<size_t>(n) * V + i] = -INFINITY;
  std::vector<int32_t> tgt(N);
  for (int n = 0; n < N; ++n)
    tgt[n] = n % 5 == 2 ? ops::IGNORE_INDEX : masked + static_cast<int32_t>(r.below(V - masked));
  const int count = ops::cross_entropy_count(tgt.data(), N);
  const float scale = 0.75f / count;
  Floats loss_ref(N), dl_ref(logits.size());
  const float mean_ref = ops::cross_entropy_forward(loss_ref.data(), logits.data(), tgt.data(), N, V, V);
  ops::cross_entropy_backward(dl_ref.data(), logits.data(), tgt.data(), N, V, V, scale);

  int32_t* dt = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&dt, N * sizeof(int32_t)));
  DT_CUDA_CHECK(cudaMemcpy(dt, tgt.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  const Floats padded = rows_pad(logits, N, V, ld);
  DevBuf dlog(padded, t), dgrad(padded.size(), t), dloss(N, DType::F32), dmean(1, DType::F32);
  dgrad.poison();
  dloss.poison();
  dmean.poison();
  // The gradient rows against the packed reference, and their padding still NaN.
  auto grad_err = [&](const DevBuf& b) {
    if (!b.guard_intact()) return static_cast<double>(INFINITY);
    const Floats g = b.download();
    return padding_nan(g, N, V, ld) ? max_err(rows_unpad(g, N, V, ld), dl_ref) : static_cast<double>(INFINITY);
  };
  double e = 0;
  switch (mode) {
    case Mode::FUSED:
      cross_entropy_forward_backward(dloss.f32(), dmean.f32(), dgrad.ptr(), dlog.ptr(), dt, N, V, ld, scale,
                                     ops::IGNORE_INDEX, t, nullptr);
      e = grad_err(dgrad);
      break;
    case Mode::FUSED_IN_PLACE:
      cross_entropy_forward_backward(dloss.f32(), dmean.f32(), dlog.ptr(), dlog.ptr(), dt, N, V, ld, scale,
                                     ops::IGNORE_INDEX, t, nullptr);
      e = grad_err(dlog);
      break;
    case Mode::SEPARATE:
      cross_entropy_forward(dloss.f32(), dmean.f32(), dlog.ptr(), dt, N, V, ld, ops::IGNORE_INDEX, t, nullptr);
      {
        // The scale read on the device: 0.75 / count, count in device memory.
        DevBuf dcount(Floats{static_cast<float>(count)}, DType::F32);
        cross_entropy_backward(dgrad.ptr(), dlog.ptr(), dt, N, V, ld, 0.75f, ops::IGNORE_INDEX, t, nullptr,
                               dcount.f32());
      }
      e = grad_err(dgrad);
      break;
  }
  e = std::max({e, buf_err(dloss, loss_ref), buf_err(dmean, Floats{mean_ref})});
  // An invalid target: NaN loss and NaN gradient row, the other rows unaffected.
  tgt[3] = V + 7;
  DT_CUDA_CHECK(cudaMemcpy(dt, tgt.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  DevBuf fresh(padded, t);
  cross_entropy_forward_backward(dloss.f32(), nullptr, fresh.ptr(), fresh.ptr(), dt, N, V, ld, scale, ops::IGNORE_INDEX,
                                 t, nullptr);
  const Floats l = dloss.download(), g = fresh.download();
  if (!std::isnan(l[3]) || !std::isnan(g[3 * static_cast<size_t>(ld)]) || std::isnan(l[4])) e = INFINITY;
  DT_CUDA_CHECK(cudaFree(dt));
  return e;
}

}  // namespace

std::vector<Case> cases_loss() {
  std::vector<Case> c;
  uint64_t seed = 400;
  for (DType t : ALL_DTYPES)
    for (int V : {1001, 1024, 5})
      for (Mode m : {Mode::FUSED, Mode::FUSED_IN_PLACE, Mode::SEPARATE}) {
        const char* mode = m == Mode::FUSED ? "fused" : m == Mode::FUSED_IN_PLACE ? "fused in place" : "fwd then bwd";
        c.push_back({"cross_entropy " + std::string(mode) + " V=" + std::to_string(V), t,
                     [=] { return ce_case(t, V, V, m, seed); }, tol_for(t, 1e-5)});
        ++seed;
      }
  for (DType t : ALL_DTYPES)
    for (int V : {1001, 5}) {
      c.push_back({"cross_entropy masked vocabulary (-inf) V=" + std::to_string(V), t,
                   [=] { return ce_case(t, V, V, Mode::FUSED, seed, true); }, tol_for(t, 1e-5)});
      ++seed;
    }
  // Rows padded to a multiple of 128 (1001 -> 1024), NaN in the padding.
  for (DType t : ALL_DTYPES)
    for (Mode m : {Mode::FUSED_IN_PLACE, Mode::SEPARATE}) {
      const char* mode = m == Mode::FUSED_IN_PLACE ? "fused in place" : "fwd then bwd";
      c.push_back({"cross_entropy " + std::string(mode) + " V=1001 ld 1024", t,
                   [=] { return ce_case(t, 1001, 1024, m, seed); }, tol_for(t, 1e-5)});
      ++seed;
    }
  return c;
}

}  // namespace dtrain::kernels::test
