// Flash attention at a long sequence (T = 1024, many key tiles, the online softmax's
// rescaling exercised) against the CPU reference on small heads, GQA and MQA, that the
// packed-documents check catches a kernel ignoring doc_start, and the launchers' argument
// checks.
#include "cases.h"

#include "core/error.h"
#include "kernels/attention.cuh"
#include "kernels/attention_internal.cuh"
#include "ops/attention.h"

#include <doctest/doctest.h>

#ifdef DTRAIN_CUDA_EMU
#include "cuda_emu/engine.h"
#endif

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::kernels::test;

TEST_CASE("attention: T=1024 matches the CPU reference (GQA, MQA; fp32 and bf16)") {
  DTK_SKIP_WITHOUT_GPU();
#ifdef DTRAIN_CUDA_EMU
  // The racecheck checks these kernels at the conformance table's shapes (on every card
  // profile) and in this suite's other cases; here it would re-check the same blocks'
  // accesses over 32 key tiles, 27 of this case's 40 CPU-s under the engine. This case is
  // about the arithmetic at T=1024 (the online softmax's rescaling over many tiles).
  const cuda_emu::ExecMode mode = cuda_emu::exec_mode();
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{false, mode.schedule});
  struct Restore {
    cuda_emu::ExecMode m;
    ~Restore() { cuda_emu::exec_mode_set(m); }
  } restore{mode};
#endif
  struct Run {
    DType t;
    int NH, NKV, HD;
    double tol;
  };
  for (Run run : {Run{DType::F32, 4, 2, 32, 1e-4}, Run{DType::BF16, 4, 2, 32, 1e-2}, Run{DType::F32, 2, 1, 64, 1e-4},
                  Run{DType::F16, 2, 1, 128, 2e-3}}) {
#ifdef DTRAIN_CUDA_EMU
    // Under another card's profile (CUDA_EMU_DEVICE, the engine's a100/l40s entries) a run
    // whose kernels are the largest variants repeats the default profile's run exactly (the
    // same kernels, inputs and seeded schedule): only the runs whose tiles this card changes
    // are repeated (on the L40S's 99 KB, head dim 128's backward).
    if (const char* card = std::getenv("CUDA_EMU_DEVICE");
        card && *card && kernels::detail::attention_largest_tiles(run.HD, run.t)) {
      std::printf("attention T=1024 HD=%d %-9s: this card runs the default profile's kernels, not repeated (%s)\n",
                  run.HD, dtype_name(run.t), card);
      continue;
    }
#endif
    const double e = attention_check(run.t, 1, 1024, run.NH, run.NKV, run.HD, 700 + run.HD);
    std::printf("attention T=1024 NH=%d NKV=%d HD=%d %-9s max err %.3e\n", run.NH, run.NKV, run.HD, dtype_name(run.t),
                e);
    INFO(dtype_name(run.t), " NH=", run.NH, " NKV=", run.NKV, " HD=", run.HD);
    CHECK(e <= run.tol);
  }
}

TEST_CASE("attention: the fa2 variant's kernels give the legacy variant's outputs bit for bit") {
  DTK_SKIP_WITHOUT_GPU();
  // Long rows (several 128-row query tiles, the online softmax rescaled over many key tiles,
  // warps of a 128-row tile whose rows all precede a key tile) at both head dims the 128-row
  // tiles are compiled for, with GQA, a sliding window (dK/dV tiles cut by the window, not the
  // diagonal), packed documents and the fused qkv layout. Under the l40s profile head dim 128
  // keeps the 64-row tiles (128 rows do not fit 99 KB), which this checks too.
  struct Run {
    DType t;
    int B, T, NH, NKV, HD;
    bool fused;
    int W;
    std::vector<int> docs;
  };
  for (const Run& run :
       {Run{DType::BF16, 1, 520, 4, 2, 64, false, 0, {}}, Run{DType::F16, 1, 400, 2, 1, 128, true, 0, {}},
        Run{DType::BF16, 2, 300, 2, 2, 40, false, 150, {}},
        Run{DType::BF16, 1, 390, 2, 1, 100, false, 0, {200, 1, 60, 129}}}) {
    const double e = attention_check_variants(run.t, run.B, run.T, run.NH, run.NKV, run.HD, 1100 + run.HD, run.fused,
                                              run.W, run.docs);
    std::printf("attention legacy=fa2 T=%d HD=%d %-9s W %d%s: max err %.3e%s\n", run.T, run.HD, dtype_name(run.t),
                run.W, run.docs.empty() ? "" : " packed", e, std::isinf(e) ? " (outputs differ)" : "");
    INFO(dtype_name(run.t), " T=", run.T, " HD=", run.HD);
    CHECK(e <= (run.t == DType::BF16 ? 1e-2 : 2e-3));
  }
  // The variant in effect is the hook's while set; the 128-row tiles fit the default card at
  // both head dims (a 99 KB card holds them at 64 only).
  kernels::detail::attention_variant_for_testing(static_cast<int>(kernels::detail::AttnVariant::FA2));
  CHECK(kernels::detail::attention_variant() == kernels::detail::AttnVariant::FA2);
  const bool wide64 = kernels::detail::attention_mma_wide_tiles(64, DType::BF16, true);
  const bool narrow32 = !kernels::detail::attention_mma_wide_tiles(32, DType::BF16, false);
  kernels::detail::attention_smem_cap_for_testing(101376);
  const bool small128 = !kernels::detail::attention_mma_wide_tiles(128, DType::F16, false);
  const bool small64 = kernels::detail::attention_mma_wide_tiles(64, DType::F16, true);
  kernels::detail::attention_smem_cap_for_testing(0);
  kernels::detail::attention_variant_for_testing(static_cast<int>(kernels::detail::AttnVariant::LEGACY));
  const bool legacy_narrow = !kernels::detail::attention_mma_wide_tiles(64, DType::BF16, true);
  kernels::detail::attention_variant_for_testing(0);
  CHECK(wide64);
  CHECK(narrow32);
  CHECK(small128);
  CHECK(small64);
  CHECK(legacy_narrow);
}

TEST_CASE("attention: a kernel ignoring doc_start fails the packed-documents check") {
  DTK_SKIP_WITHOUT_GPU();
  // The conformance table's packed-document rows hand doc_start to the reference and the
  // kernels; withheld from the kernels only (what a kernel ignoring it computes: attention
  // across the documents), the same check must fail by far on both paths, and pass with it.
  for (DType t : {DType::F32, DType::BF16}) {
    const double tol = t == DType::F32 ? 1e-4 : 1e-2;
    const double good = attention_check(t, 2, 70, 2, 1, 16, 800, false, 0, {20, 45, 1}, true);
    const double bad = attention_check(t, 2, 70, 2, 1, 16, 800, false, 0, {20, 45, 1}, false);
    std::printf("attention docs %-9s: max err %.3e with doc_start, %.3e without\n", dtype_name(t), good, bad);
    INFO(dtype_name(t));
    CHECK(good <= tol);
    CHECK(bad > 10 * tol);
  }
}

TEST_CASE("attention: bad shapes are UsageErrors") {
  DTK_SKIP_WITHOUT_GPU();
  DevBuf buf(1 << 16, DType::F32), lse(1024, DType::F32);
  CHECK_THROWS_AS(kernels::attention_forward(buf.ptr(), lse.f32(), buf.ptr(), buf.ptr(), buf.ptr(), 1, 4, 3, 2, 16, 48,
                                             32, DType::F32, nullptr),
                  UsageError);
  CHECK_THROWS_AS(kernels::attention_forward(buf.ptr(), lse.f32(), buf.ptr(), buf.ptr(), buf.ptr(), 1, 4, 1, 1, 300,
                                             300, 300, DType::F32, nullptr),
                  UsageError);
  // Strides shorter than the heads they must cover.
  CHECK_THROWS_AS(kernels::attention_forward(buf.ptr(), lse.f32(), buf.ptr(), buf.ptr(), buf.ptr(), 1, 4, 2, 1, 16, 16,
                                             16, DType::BF16, nullptr),
                  UsageError);
}

TEST_CASE("attention: the variants an A100 or a 99 KB card picks match the reference") {
  DTK_SKIP_WITHOUT_GPU();
  // Caps at the opt-in shared memory of an A100 (163 KB) and of sm_86/sm_89 cards (99 KB), by
  // the CUDA C++ Programming Guide's table: at head dim 256 the forward and the backward, and
  // at 128 on the smaller card the backward, no longer fit two stages. At 256 on the smaller
  // card the backward takes the CUDA-core kernels' 16-row tiles (fp32, and bf16 where the
  // tensor-core backward does not fit even with one stage).
  struct Run {
    size_t cap;
    DType t;
    int HD;
    double tol;
  };
  int dev = 0;
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
  REQUIRE(cudaGetDeviceProperties(&prop, dev) == cudaSuccess);
  for (Run run :
       {Run{166912, DType::BF16, 256, 1e-2}, Run{101376, DType::F16, 128, 2e-3}, Run{101376, DType::BF16, 72, 1e-2},
        Run{101376, DType::BF16, 256, 1e-2}, Run{101376, DType::F32, 256, 1e-4}}) {
    if (run.cap > prop.sharedMemPerBlockOptin) {  // a card smaller than the one imitated
      std::printf("attention T=130 HD=%d: cap %zu B is above this GPU's %zu B, not run\n", run.HD, run.cap,
                  static_cast<size_t>(prop.sharedMemPerBlockOptin));
      continue;
    }
    kernels::detail::attention_smem_cap_for_testing(run.cap);
    double e = 1e9;
    try {
      e = attention_check(run.t, 1, 130, 2, 1, run.HD, 900 + run.HD);
    } catch (...) {
      kernels::detail::attention_smem_cap_for_testing(0);
      throw;
    }
    kernels::detail::attention_smem_cap_for_testing(0);
    std::printf("attention T=130 HD=%d %-9s opt-in cap %zu B: max err %.3e\n", run.HD, dtype_name(run.t), run.cap, e);
    INFO(dtype_name(run.t), " HD=", run.HD, " cap=", run.cap);
    CHECK(e <= run.tol);
  }
  // What the T=1024 case skips by under another card's profile: on a 99 KB card head dim
  // 128's tensor-core backward drops to one stage, the smaller head dims keep every tile.
  if (101376 <= prop.sharedMemPerBlockOptin) {
    kernels::detail::attention_smem_cap_for_testing(101376);
    const bool hd128 = kernels::detail::attention_largest_tiles(128, DType::F16);
    const bool hd64 = kernels::detail::attention_largest_tiles(64, DType::F32);
    const bool hd32 = kernels::detail::attention_largest_tiles(32, DType::BF16);
    const bool hd256 = kernels::detail::attention_largest_tiles(256, DType::F32);
    kernels::detail::attention_smem_cap_for_testing(0);
    CHECK(!hd128);
    CHECK(hd64);
    CHECK(hd32);
    CHECK(!hd256);
  }
  // A card below every profile (64 KB, as sm_75) cannot hold head dim 256's tiles at all: a
  // DeviceError that names its limit rather than a launch failure.
  kernels::detail::attention_smem_cap_for_testing(65536);
  bool threw = false;
  try {
    attention_check(DType::BF16, 1, 70, 1, 1, 256, 77);
  } catch (const DeviceError& e) {
    threw = true;
    CHECK(std::string(e.what()).find("this GPU allows 65536") != std::string::npos);
  } catch (...) {
    kernels::detail::attention_smem_cap_for_testing(0);
    throw;
  }
  kernels::detail::attention_smem_cap_for_testing(0);
  CHECK(threw);
}

TEST_CASE("attention: every split of a KV head's query heads over dK/dV blocks matches the reference") {
  DTK_SKIP_WITHOUT_GPU();
  // The split the kernels pick follows the grid (ops::attention_dkdv_split): small test shapes
  // take G, large ones 1. Forced here: 1 (each block walks the whole group, no partials), a
  // proper divisor, and G (fp32 partials per head), on GQA rows with a window and packed
  // documents crossing the 64-row tiles, where a head walk that ended or started a tile off
  // would show.
#ifdef DTRAIN_CUDA_EMU
  // The split is the same on every card; the default profile's run covers it.
  if (const char* card = std::getenv("CUDA_EMU_DEVICE"); card && *card) return;
#endif
  struct Run {
    int B, T, NH, NKV, HD, W;
    std::vector<int> docs;
  };
  for (const Run& run :
       {Run{2, 130, 4, 1, 64, 0, {}}, Run{1, 200, 8, 2, 32, 40, {}}, Run{2, 150, 6, 1, 128, 0, {70, 9, 46, 25}}})
    for (int split : {1, 2, 3, 4, 6}) {
      if ((run.NH / run.NKV) % split != 0) continue;
      kernels::detail::attention_dkdv_split_for_testing(split);
      double e = 1e9;
      try {
        e = attention_check(DType::BF16, run.B, run.T, run.NH, run.NKV, run.HD, 950 + split, false, run.W, run.docs);
      } catch (...) {
        kernels::detail::attention_dkdv_split_for_testing(0);
        throw;
      }
      kernels::detail::attention_dkdv_split_for_testing(0);
      std::printf("attention dK/dV split %d of G=%d (B %d T %d HD %d W %d%s): max err %.3e\n", split, run.NH / run.NKV,
                  run.B, run.T, run.HD, run.W, run.docs.empty() ? "" : ", packed", e);
      INFO("split ", split, " G ", run.NH / run.NKV, " HD ", run.HD);
      CHECK(e <= 1e-2);
    }
}

TEST_CASE("attention: the dK/dV split follows the grid (small grids share a group among blocks)") {
  // H100/H200: 132 SMs; head dim 128: 2 blocks per SM.
  const int bps = ops::attention_dkdv_blocks_per_sm(128);
  CHECK(bps == 2);
  CHECK(ops::attention_dkdv_split(2, 8, 4, 2048, 132, bps) == 1);  // Llama-3-8B, B 2: 528 rows of tiles, enough
  CHECK(ops::attention_dkdv_split(1, 8, 4, 2048, 132, bps) == 2);  // B 1: half the group per block
  CHECK(ops::attention_dkdv_split(1, 4, 7, 2048, 132, bps) == 7);  // Qwen2.5-7B, B 1: G 7 has no middle divisor
  CHECK(ops::attention_dkdv_split(8, 8, 4, 8192, 132, bps) == 1);
  CHECK(ops::attention_dkdv_split(1, 1, 1, 64, 132, bps) == 1);  // no group to split
  CHECK(ops::attention_dkdv_split(1, 2, 4, 128, 132, 3) == 4);   // a tiny grid: one head per block
}
