// The hopper attention variant (DTRAIN_ATTN_VARIANT=hopper): its forward, the sm_90a wgmma
// kernel (kernels/attention_hopper.cu), against the CPU reference (out and the log-sum-exp;
// the backward, fa2's kernels, reads that lse and is checked too) at small shapes that reach
// each of its paths: GQA 4:1, head dims 64 and 128, bf16 and fp16, a tail query tile and a
// tail key tile (T not a multiple of 128 or 64), key tiles the causal diagonal cuts and
// tiles one consumer warpgroup skips, more key tiles than ring stages, packed documents
// (doc_start), a sliding window and the fused qkv rows. The attention is causal in every
// variant (kernels/attention.cuh): there is no non-causal mode to check. On a card where the
// kernel does not run (ctest runs this suite again as an A100), the variant falls back to
// fa2's forward: bit for bit fa2's outputs.
#include "cases.h"

#include "kernels/attention_internal.cuh"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace dtrain;
using namespace dtrain::kernels::test;
namespace kd = dtrain::kernels::detail;

namespace {
struct Run {
  DType t;
  int B, T, NH, NKV, HD;
  bool fused;
  int W;
  std::vector<int> docs;
};
}  // namespace

TEST_CASE("attention, hopper variant: the wgmma forward against the CPU reference, or fa2's where it does not run") {
  DTK_SKIP_WITHOUT_GPU();
  const int hopper = static_cast<int>(kd::AttnVariant::HOPPER), fa2 = static_cast<int>(kd::AttnVariant::FA2);
  const bool runs = kd::attention_hopper_runs(64, DType::BF16);
  CHECK(runs == kd::attention_hopper_runs(128, DType::F16));
  CHECK_FALSE(kd::attention_hopper_runs(32, DType::BF16));  // head dims 64 and 128 only
  CHECK_FALSE(kd::attention_hopper_runs(64, DType::F32));
#ifdef DTRAIN_CUDA_EMU
  {  // the engine's h100 runs it (an sm_90a device with the image); the a100 cannot
    const char* card = std::getenv("CUDA_EMU_DEVICE");
    CHECK(runs == (card == nullptr || *card == '\0' || std::strcmp(card, "h100") == 0));
  }
#endif
  if (!runs) {
    // The documented fall back: fa2's forward (and backward), bit for bit.
    std::vector<float> h, f;
    const double e = attention_check(DType::BF16, 1, 130, 4, 1, 64, 1500, false, 0, {}, true, hopper, &h);
    attention_check(DType::BF16, 1, 130, 4, 1, 64, 1500, false, 0, {}, true, fa2, &f);
    CHECK(e <= 1e-2);
    REQUIRE(h.size() == f.size());
    CHECK(std::memcmp(h.data(), f.data(), h.size() * sizeof(float)) == 0);
    return;
  }
  for (const Run& r :
       {Run{DType::BF16, 1, 200, 4, 1, 64, false, 0, {}}, Run{DType::F16, 1, 130, 2, 2, 128, false, 0, {}},
        Run{DType::BF16, 1, 256, 1, 1, 128, false, 0, {}},
        Run{DType::F16, 2, 150, 2, 1, 64, false, 0, {1, 70, 9, 46, 5}},
        Run{DType::BF16, 1, 140, 4, 2, 64, true, 17, {}}}) {
    const double e = attention_check(r.t, r.B, r.T, r.NH, r.NKV, r.HD, 1400 + r.T, r.fused, r.W, r.docs, true, hopper);
    std::printf("attention hopper B=%d T=%d NH=%d NKV=%d HD=%d %-9s%s W %d%s: max err %.3e\n", r.B, r.T, r.NH, r.NKV,
                r.HD, dtype_name(r.t), r.fused ? " qkv" : "", r.W, r.docs.empty() ? "" : " packed", e);
    INFO(dtype_name(r.t), " T=", r.T, " HD=", r.HD, " NKV=", r.NKV);
    CHECK(e <= (r.t == DType::BF16 ? 1e-2 : 2e-3));
  }
}
