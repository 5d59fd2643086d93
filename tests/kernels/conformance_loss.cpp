// Conformance cases for the fused softmax cross-entropy: losses, mean and dlogits against
// lib/ops/cross_entropy.h with masked rows, odd vocabularies (unaligned rows), separate
// and in-place dlogits, the forward-only and backward-only entry points, the NaN row an
// invalid target produces, and padded rows (a row pitch past V) whose padding stays NaN.
// The backward's kernel depends on the row length (kernels/cross_entropy.cu): one pass from
// registers, one pass with shared memory past them, two passes beyond; the rows at GPT-2's
// and Llama-3's vocabularies and at each edge say which they expect, and under the CPU
// execution engine check that it ran.
#include "cases.h"

#include "kernels/cross_entropy.cuh"
#include "ops/cross_entropy.h"

#ifdef DTRAIN_CUDA_EMU
#include <cuda_emu_trace.h>
#endif

namespace dtrain::kernels::test {

namespace {

// FUSED_SHIFTED: dlogits one element past a 16-byte boundary where the logits start on
// one, so its packs never line up with the logits' (element stores).
enum class Mode { FUSED, FUSED_IN_PLACE, SEPARATE, FUSED_SHIFTED };

// The backward's kernel a row of V elements of t takes on this device.
enum class Path { ANY, REGISTERS, SHARED, TWO_PASS };
const char* path_name(Path p) {
  return p == Path::REGISTERS ? "one pass" : p == Path::SHARED ? "one pass + smem" : "two passes";
}
// kernels/cross_entropy.cu: 8 packs of 16 bytes per thread of 1024 in registers.
int registers_max_vocab(DType t) { return 8 * 1024 * (16 / static_cast<int>(dtype_size(t))); }
Path path_of(DType t, int V) {
  const int packs = V / (16 / static_cast<int>(dtype_size(t)));
  if (packs <= 8 * 1024) return Path::REGISTERS;
  return V <= cross_entropy_onepass_max_vocab(t) ? Path::SHARED : Path::TWO_PASS;
}

// Whether the backward launches of `f` ran `want`'s kernel (the CPU execution engine
// traces them; a GPU build cannot tell and takes the case's numbers alone).
template <typename F>
bool ran_path(Path want, F&& f) {
#ifdef DTRAIN_CUDA_EMU
  cuda_emu::trace_begin();
  f();
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  const cuda_emu::Trace tr = cuda_emu::trace_take();
  if (want == Path::ANY) return true;
  const std::string k = want == Path::TWO_PASS ? "cross_entropy_kernel<T>" : "cross_entropy_onepass_kernel<T>";
  bool found = false;
  for (const auto& l : tr.kernels) {
    if (l.name.rfind("cross_entropy", 0) != 0) continue;
    if (l.name != k) return false;
    // Shared memory past the registers exactly when the row needs it.
    if (want != Path::TWO_PASS && (l.dynamic_smem > 0) != (want == Path::SHARED)) return false;
    found = true;
  }
  return found;
#else
  (void)want;
  f();
  return true;
#endif
}

// masked_vocab: the first logits of every row are -inf (a masked or padded vocabulary),
// so the first value many threads see is -inf. ld > V: rows ld apart whose padding is NaN
// (the model's padded logits), never read nor written.
double ce_case(DType t, int V, int ld, Mode mode, uint64_t seed, bool masked_vocab = false, int N = 37,
               Path path = Path::ANY) {
  Rng r(seed);
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
  DevBuf dlog(padded, t), dgrad(padded.size(), t, mode == Mode::FUSED_SHIFTED ? 1 : 0), dloss(N, DType::F32),
      dmean(1, DType::F32);
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
  bool ran = true;
  switch (mode) {
    case Mode::FUSED:
    case Mode::FUSED_SHIFTED:
      ran = ran_path(path, [&] {
        cross_entropy_forward_backward(dloss.f32(), dmean.f32(), dgrad.ptr(), dlog.ptr(), dt, N, V, ld, scale,
                                       ops::IGNORE_INDEX, t, nullptr);
      });
      e = grad_err(dgrad);
      break;
    case Mode::FUSED_IN_PLACE:
      ran = ran_path(path, [&] {
        cross_entropy_forward_backward(dloss.f32(), dmean.f32(), dlog.ptr(), dlog.ptr(), dt, N, V, ld, scale,
                                       ops::IGNORE_INDEX, t, nullptr);
      });
      e = grad_err(dlog);
      break;
    case Mode::SEPARATE:
      cross_entropy_forward(dloss.f32(), dmean.f32(), dlog.ptr(), dt, N, V, ld, ops::IGNORE_INDEX, t, nullptr);
      {
        // The scale read on the device: 0.75 / count, count in device memory.
        DevBuf dcount(Floats{static_cast<float>(count)}, DType::F32);
        ran = ran_path(path, [&] {
          cross_entropy_backward(dgrad.ptr(), dlog.ptr(), dt, N, V, ld, 0.75f, ops::IGNORE_INDEX, t, nullptr,
                                 dcount.f32());
        });
      }
      e = grad_err(dgrad);
      break;
  }
  if (!ran) return INFINITY;
  e = std::max({e, buf_err(dloss, loss_ref), buf_err(dmean, Floats{mean_ref})});
  // An invalid target: NaN loss and NaN gradient row, the other rows unaffected.
  tgt[3] = V + 7;
  DT_CUDA_CHECK(cudaMemcpy(dt, tgt.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  DevBuf fresh(padded, t);
  cross_entropy_forward_backward(dloss.f32(), nullptr, fresh.ptr(), fresh.ptr(), dt, N, V, ld, scale, ops::IGNORE_INDEX,
                                 t, nullptr);
  const Floats l = dloss.download(), g = fresh.download();
  if (!std::isnan(l[3]) || !std::isnan(g[3 * static_cast<size_t>(ld)]) ||
      !std::isnan(g[3 * static_cast<size_t>(ld) + V - 1]) || std::isnan(l[4]) ||
      std::isnan(g[4 * static_cast<size_t>(ld)]))
    e = INFINITY;
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
  // The backward's kernel at each row length (N = 6: row 2 masked, row 3 then invalid): a
  // tiny and an odd row; GPT-2's vocabulary packed (odd, unaligned rows), padded to 50304 and
  // with dlogits out of step with the logits; Llama-3's 128256; one pack past what the
  // registers hold (shared memory from there); the longest row the one-pass kernel takes on
  // this card, and one element more (two passes).
  for (DType t : ALL_DTYPES) {
    const int vec = 16 / static_cast<int>(dtype_size(t));
    const int reg1 = registers_max_vocab(t) + vec, top = cross_entropy_onepass_max_vocab(t);
    struct Row {
      const char* what;
      int V, ld;
      Mode m;
    };
    for (const Row& w :
         {Row{"tiny", 5, 5, Mode::FUSED_IN_PLACE}, Row{"odd", 1001, 1001, Mode::FUSED_SHIFTED},
          Row{"GPT-2", 50257, 50257, Mode::FUSED_IN_PLACE}, Row{"GPT-2", 50257, 50304, Mode::SEPARATE},
          Row{"GPT-2", 50257, 50304, Mode::FUSED_SHIFTED}, Row{"Llama-3", 128256, 128256, Mode::FUSED_IN_PLACE},
          Row{"registers + 1 pack", reg1 + 3, reg1 + 3, Mode::FUSED_IN_PLACE},
          Row{"one-pass max", top, top, Mode::FUSED_IN_PLACE},
          Row{"one-pass max + 1", top + 1, top + 1, Mode::FUSED_IN_PLACE}}) {
      const Path p = path_of(t, w.V);
      const char* mode = w.m == Mode::FUSED_IN_PLACE ? "in place"
                         : w.m == Mode::SEPARATE     ? "fwd then bwd"
                                                     : "dlogits shifted";
      c.push_back({"cross_entropy " + std::string(path_name(p)) + " " + w.what + " V=" + std::to_string(w.V) +
                       (w.ld != w.V ? " ld " + std::to_string(w.ld) : std::string()) + " " + mode,
                   t, [=] { return ce_case(t, w.V, w.ld, w.m, seed, w.V > 2000, 6, p); }, tol_for(t, 1e-5)});
      ++seed;
    }
  }
  return c;
}

}  // namespace dtrain::kernels::test
