// communication.compression's 16-bit wire in the ZeRO engine, 2 Gloo ranks on loopback:
// at every stage bf16 / fp16 gradients train to losses within a bf16 tolerance of the
// fp32 wire, the bytes a rank sends for its gradients halve, and fp16's division by the
// world size before the sum keeps gradients whose sum overflows fp16 finite.
#include "config/train_config.h"
#include "core/error.h"
#include "temp_dir.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/zero_harness.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace zero_test;
using dtrain::DType;

namespace {

// One micro-batch through rank t: rows [first, first + rows) of step `step`'s batch,
// the gradients zeroed first, the backward scaled by `scale`.
void forward_backward(RankTrainer& t, const RunSpec& spec, int step, int first, int rows, float scale) {
  batch_rows(step, first, rows, spec.T, t.model->config().vocab_size, t.tok, t.tgt);
  t.engine->before_step();
  t.model->forward(t.tok.data(), t.tgt.data(), rows, spec.T);
  t.model->backward(scale);
}

struct WireRun {
  std::vector<double> losses;  // mean over the ranks, per step
  std::vector<uint64_t> sent;  // bytes each rank sent during the steps
  std::vector<float> weights;  // rank 0's final weights
};

WireRun wire_run(int stage, DType wire, int steps) {
  RunSpec spec;
  spec.world = 2;
  spec.steps = steps;
  spec.opts.stage = stage;
  spec.opts.reduce_bucket_size = 4000;  // several buckets, some with several buffers
  spec.opts.param_persistence_threshold = 500;
  spec.opts.grad_wire = wire;
  WireRun out;
  std::vector<std::vector<float>> losses(2);
  out.sent.resize(2);
  auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int r) {
    RankTrainer t(spec, comm, r);
    const uint64_t before = comm->bytes_sent();
    for (int s = 1; s <= steps; ++s) losses[static_cast<size_t>(r)].push_back(t.step(s));
    out.sent[static_cast<size_t>(r)] = comm->bytes_sent() - before;
    auto w = t.weights();
    if (r == 0) out.weights = std::move(w);
  });
  for (const auto& e : errors) REQUIRE(e == "");
  for (int s = 0; s < steps; ++s) out.losses.push_back(0.5 * (losses[0][s] + losses[1][s]));
  return out;
}

}  // namespace

TEST_CASE("16-bit wire: losses follow the fp32 wire at every ZeRO stage") {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const WireRun ref = wire_run(stage, DType::F32, 8);
    for (DType w : {DType::BF16, DType::F16}) {
      CAPTURE(dtrain::dtype_name(w));
      const WireRun got = wire_run(stage, w, 8);
      // bf16 keeps 8 bits of mantissa: a relative error of 2^-8 per gradient element,
      // which AdamW's normalisation turns into small weight differences.
      CHECK(max_rel_diff(got.losses, ref.losses) < 2e-2);
      // The wire was used: the weights are not the fp32 wire's bit for bit.
      CHECK(max_abs_diff(got.weights, ref.weights) > 0.0);
      CHECK(got.losses.back() < got.losses.front());
    }
  }
}

TEST_CASE("16-bit wire: a rank sends half the gradient bytes") {
  // Stage 0 sends only gradients (allreduce) and nothing else per step: exactly half.
  const WireRun f32 = wire_run(0, DType::F32, 3), bf16 = wire_run(0, DType::BF16, 3), f16 = wire_run(0, DType::F16, 3);
  for (int r = 0; r < 2; ++r) {
    CHECK(f32.sent[r] > 0);
    CHECK(2 * bf16.sent[r] == f32.sent[r]);
    CHECK(2 * f16.sent[r] == f32.sent[r]);
  }
  // Stages 1-3 also send the norm's agreement and the parameter all-gathers (in the
  // compute dtype, untouched by compression): fewer bytes, more than half.
  for (int stage = 1; stage <= 3; ++stage) {
    CAPTURE(stage);
    const WireRun a = wire_run(stage, DType::F32, 2), b = wire_run(stage, DType::BF16, 2);
    CHECK(b.sent[0] < a.sent[0]);
    CHECK(2 * b.sent[0] > a.sent[0]);
  }
}

TEST_CASE("fp16 wire: divided by the world size before the sum, so a sum past fp16's range stays finite") {
  // Both ranks train on the same rows, so their gradients are equal and the sum is twice
  // each. The loss scale puts the largest local gradient at 50000 (< 65504, fp16's max):
  // summed first it would overflow to inf and the step would be skipped.
  RunSpec spec;
  spec.world = 2;
  spec.opts.stage = 0;
  spec.opts.grad_wire = DType::F16;
  const int rows = 6;
  float biggest = 0.0f;
  {
    auto m = model_build(spec);
    std::vector<int32_t> tok, tgt;
    batch_rows(1, 0, rows, spec.T, m->config().vocab_size, tok, tgt);
    m->forward(tok.data(), tgt.data(), rows, spec.T);
    m->backward(1.0f);
    for (auto& pb : m->params())
      for (size_t i = 0; i < pb.size; ++i) biggest = std::max(biggest, std::fabs(pb.grad[i]));
  }
  REQUIRE(biggest > 0.0f);
  const float scale = 50000.0f / biggest;
  std::vector<int> applied(2, 0);
  std::vector<double> norms(2, 0.0);
  auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int r) {
    RankTrainer t(spec, comm, r);
    forward_backward(t, spec, 1, 0, rows, scale);
    applied[static_cast<size_t>(r)] = t.update(spec.lr, scale) ? 1 : 0;
    norms[static_cast<size_t>(r)] = t.engine->last_step().grad_norm;
  });
  for (const auto& e : errors) REQUIRE(e == "");
  CHECK(applied[0] == 1);
  CHECK(applied[1] == 1);
  CHECK(std::isfinite(norms[0]));
}

// ----------------------------------------------------------------------------
// Through the config and the trainer: communication.compression reaches the engine, and
// metrics.jsonl carries the bytes each step sent and the collectives' seconds.
namespace {

const char* kJob = R"(
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 1
steps_per_print: 1
optimizer: {type: AdamW, params: {lr: 3.0e-3}}
model: {architecture: llama, vocab_size: 264, n_layer: 1, n_head: 2, n_kv_head: 1, d_model: 32, d_ff: 64,
        max_seq_len: 32}
data: {train: configs/data/tasks/train.jsonl, format: alpaca, tokenizer: byte, seq_len: 32, neat_packing: false}
training: {max_steps: 4, seed: 5}
)";

struct JobRun {
  std::vector<double> losses, bytes, seconds;
};

JobRun job_run(const std::string& compression, std::vector<std::string> sets = {}) {
  sets.push_back("communication.compression=" + compression);
  dtrain::test::TempDir tmp;
  const auto errors = dtrain::test::run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
    auto cfg = dtrain::config::config_load_string(kJob, "job.yaml", sets).cfg;
    dtrain::config::config_resolve_batch(cfg, 2);
    dtrain::train::TrainerEnv env;
    env.print = false;
    env.run_dir = (tmp.path / "run").string();
    env.rank = rank;
    env.world_size = 2;
    env.comm = comm;
    dtrain::train::train_run(cfg, env);
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  JobRun out;
  std::ifstream in(tmp.path / "run" / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto r = nlohmann::json::parse(line);
    if (!r.contains("loss")) continue;
    out.losses.push_back(r["loss"].get<double>());
    REQUIRE(r.contains("comm_bytes_sent"));
    REQUIRE(r.contains("comm_seconds"));
    out.bytes.push_back(r["comm_bytes_sent"].get<double>());
    out.seconds.push_back(r["comm_seconds"].get<double>());
  }
  REQUIRE(out.losses.size() == 4);
  return out;
}

}  // namespace

TEST_CASE("communication.compression bf16 through the trainer: metrics.jsonl shows half the bytes per step") {
  const JobRun none = job_run("none"), bf16 = job_run("bf16");
  CHECK(max_rel_diff(bf16.losses, none.losses) < 2e-2);
  for (size_t i = 0; i < none.bytes.size(); ++i) {
    CAPTURE(i);
    CHECK(none.seconds[i] >= 0.0);
    // The gradients dominate; the step's few agreement values (norm, loss, targets, this
    // log's gather) are not compressed.
    CHECK(bf16.bytes[i] < 0.52 * none.bytes[i]);
    CHECK(bf16.bytes[i] > 0.48 * none.bytes[i]);
  }
  // PowerSGD (from the first step) and top-k through the config and the trainer.
  const JobRun psgd = job_run("powersgd", {"communication.powersgd.rank=2", "communication.powersgd.start_step=0"});
  const JobRun topk = job_run("topk", {"communication.topk.ratio=0.05"});
  for (const JobRun* r : {&psgd, &topk}) {
    CHECK(r->losses.back() < r->losses.front());
    CHECK(r->bytes.back() < 0.5 * none.bytes.back());
  }
}

// ----------------------------------------------------------------------------
// Top-k with error feedback (stages 0-1, the CPU device).
namespace {

RunSpec topk_spec(int stage, float ratio) {
  RunSpec spec;
  spec.world = 2;
  spec.opts.stage = stage;
  spec.opts.reduce_bucket_size = 4000;
  spec.opts.topk_ratio = ratio;
  return spec;
}

// Every trainable buffer's gradient in bucket order (zero_buckets_plan: layers
// n_layer down to -1, the model's buffer order within a layer), the order of the
// residuals' elements.
std::vector<dtrain::model::ParamBuffer*> bucket_order(dtrain::model::Model& m) {
  std::vector<dtrain::model::ParamBuffer*> out;
  for (int l = m.config().n_layer; l >= -1; --l)
    for (auto& pb : m.params())
      if (pb.layout.layer == l) out.push_back(&pb);
  return out;
}

}  // namespace

TEST_CASE("top-k at ratio 1.0 is the plain allreduce, bit for bit (2 ranks: one fp32 sum, one halving)") {
  for (int variant = 0; variant < 3; ++variant) {
    // Stage 0, stage 1, and stage 1 with overlap_comm (the buckets reduced on the
    // communication thread during backward).
    const int stage = variant == 0 ? 0 : 1;
    CAPTURE(variant);
    RunSpec plain = topk_spec(stage, 0.0f), topk = topk_spec(stage, 1.0f);
    plain.opts.overlap_comm = topk.opts.overlap_comm = variant == 2;
    plain.steps = topk.steps = 5;
    const RunResult a = train_run(plain), b = train_run(topk);
    REQUIRE_MESSAGE(a.ok(), a.error_text());
    REQUIRE_MESSAGE(b.ok(), b.error_text());
    CHECK(b.losses == a.losses);
    CHECK(b.weights == a.weights);
  }
}

TEST_CASE("top-k trains, sends fewer bytes, and is refused where it cannot run") {
  RunSpec spec = topk_spec(1, 0.05f);
  spec.steps = 12;
  const RunResult r = train_run(spec);
  REQUIRE_MESSAGE(r.ok(), r.error_text());
  CHECK(r.losses.back() < r.losses.front());
  // Every rank holds the same weights: the dense sums agree.
  CHECK(r.rank_weights[0] == r.rank_weights[1]);

  std::vector<uint64_t> sent(2);
  for (float ratio : {0.0f, 0.05f}) {
    RunSpec s = topk_spec(0, ratio);
    auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
      RankTrainer t(s, comm, rank);
      const uint64_t before = comm->bytes_sent();
      t.step(1);
      if (rank == 0) sent[ratio == 0.0f ? 0 : 1] = comm->bytes_sent() - before;
    });
    for (const auto& e : errors) REQUIRE(e == "");
  }
  // 5% of the values plus as many indices, gathered once, against the full gradient
  // reduced (sent twice over in a 2-rank ring): well under a fifth.
  CHECK(sent[1] * 5 < sent[0]);

  RunSpec stage2 = topk_spec(2, 0.1f);
  auto m = model_build(stage2);
  CHECK_THROWS_WITH_AS(dtrain::train::ZeroEngine(*m, nullptr, stage2.opts),
                       doctest::Contains("topk needs zero_optimization.stage 0 or 1, but the stage is 2"),
                       dtrain::ConfigError);
}

TEST_CASE("top-k: any positive ratio sends at least one element per bucket, however small (issue 43, item 14)") {
  // k = ceil(ratio n), at least 1: a ratio below float's range (1e-300) is not "off" (it
  // was, rounded to a float's 0) but sends one value per bucket, as 1e-9 does.
  auto ratio_of = [](const std::string& text) {
    const auto cfg = dtrain::config::config_load_string(
                         kJob, "job.yaml", {"communication.compression=topk", "communication.topk.ratio=" + text})
                         .cfg;
    return dtrain::train::zero_options_from(cfg).topk_ratio;
  };
  CHECK(ratio_of("1e-300") > 0.0);
  std::vector<uint64_t> sent;
  for (const double ratio : {0.0, ratio_of("1e-9"), ratio_of("1e-300")}) {
    RunSpec s = topk_spec(0, 0.0f);
    s.opts.topk_ratio = ratio;
    uint64_t mine = 0;
    auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
      RankTrainer t(s, comm, rank);
      const uint64_t before = comm->bytes_sent();
      t.step(1);
      if (rank == 0) mine = comm->bytes_sent() - before;
    });
    for (const auto& e : errors) REQUIRE(e == "");
    sent.push_back(mine);
  }
  CHECK(sent[2] == sent[1]);      // one (value, index) pair per bucket either way
  CHECK(sent[2] * 20 < sent[0]);  // far from the uncompressed reduction
}

TEST_CASE("top-k error feedback conserves the gradient: W x the applied sum + the residuals == the raw sum") {
  const RunSpec spec = topk_spec(0, 0.03f);
  const int steps = 5;
  // Per rank, in bucket order: the sum over the steps of its raw gradients, of the
  // averaged gradients the engine applied, and its final residual.
  std::vector<std::vector<double>> raw(2), applied(2), residual(2);
  auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
    RankTrainer t(spec, comm, rank);
    const auto order = bucket_order(*t.model);
    size_t n = 0;
    for (auto* pb : order) n += pb->size;
    auto& mine_raw = raw[static_cast<size_t>(rank)];
    auto& mine_app = applied[static_cast<size_t>(rank)];
    mine_raw.assign(n, 0.0);
    mine_app.assign(n, 0.0);
    const int rows = spec.global_batch / spec.world;
    for (int s = 1; s <= steps; ++s) {
      forward_backward(t, spec, s, rank * rows, rows, 1.0f);
      size_t at = 0;
      for (auto* pb : order)
        for (size_t i = 0; i < pb->size; ++i) mine_raw[at++] += pb->grad[i];
      REQUIRE(t.update(spec.lr));
      at = 0;
      for (auto* pb : order)
        for (size_t i = 0; i < pb->size; ++i) mine_app[at++] += pb->grad[i];
    }
    const auto view = t.engine->checkpoint_view();
    for (const auto& [p, cnt] : view.rank_state)
      residual[static_cast<size_t>(rank)].insert(residual[static_cast<size_t>(rank)].end(), p, p + cnt);
  });
  for (const auto& e : errors) REQUIRE(e == "");
  REQUIRE(residual[0].size() == raw[0].size());
  double worst = 0.0, scale = 0.0, kept = 0.0;
  for (size_t i = 0; i < raw[0].size(); ++i) {
    CHECK(applied[0][i] == applied[1][i]);
    const double lhs = 2.0 * applied[0][i] + residual[0][i] + residual[1][i];
    const double rhs = raw[0][i] + raw[1][i];
    worst = std::max(worst, std::fabs(lhs - rhs));
    scale = std::max(scale, std::fabs(rhs));
    kept += std::fabs(residual[0][i]) + std::fabs(residual[1][i]);
  }
  CHECK(kept > 0.0);             // 3% sent: most of the gradient waits in the residuals
  CHECK(worst <= 1e-5 * scale);  // fp32 additions of a few steps' values
}

namespace {

// 6 steps in one go against 3, a checkpoint, a fresh engine loading it and 3 more: the
// losses after the resume are the uninterrupted run's, and differ once `drop` zeroes what
// the checkpoint restored into the rank state (so the restore is what makes them equal).
void check_resume_exact(const RunSpec& spec,
                        const std::function<void(const dtrain::train::ZeroCheckpointView&)>& drop) {
  const int steps = 6, half = 3;
  std::vector<std::vector<float>> whole(2), resumed(2), dropped(2);
  auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
    RankTrainer t(spec, comm, rank);
    for (int s = 1; s <= steps; ++s) whole[static_cast<size_t>(rank)].push_back(t.step(s));
  });
  for (const auto& e : errors) REQUIRE(e == "");
  dtrain::test::TempDir tmp;
  const std::string run = (tmp.path / "run").string();
  errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
    {
      RankTrainer t(spec, comm, rank);
      for (int s = 1; s <= half; ++s) t.step(s);
      dtrain::train::TrainState st;
      st.step = half;
      dtrain::train::checkpoint_save(run, t.engine->checkpoint_view(), st);
    }
    for (bool keep : {true, false}) {
      RankTrainer t(spec, comm, rank);
      const auto view = t.engine->checkpoint_view();
      REQUIRE(dtrain::train::checkpoint_load(run, view).loaded);
      if (!keep) drop(view);
      auto& out = (keep ? resumed : dropped)[static_cast<size_t>(rank)];
      for (int s = half + 1; s <= steps; ++s) out.push_back(t.step(s));
    }
  });
  for (const auto& e : errors) REQUIRE(e == "");
  for (size_t r = 0; r < 2; ++r) {
    const std::vector<float> tail(whole[r].begin() + half, whole[r].end());
    CHECK(resumed[r] == tail);
    CHECK(dropped[r] != tail);
  }
}

}  // namespace

TEST_CASE("top-k resumes bit-exactly: the residuals travel in the sharded checkpoint") {
  // What a checkpoint without the residuals would resume from.
  check_resume_exact(topk_spec(1, 0.05f), [](const dtrain::train::ZeroCheckpointView& view) {
    for (const auto& [p, cnt] : view.rank_state) std::fill(p, p + cnt, 0.0f);
  });
}

// ----------------------------------------------------------------------------
// PowerSGD (stages 0-1, the CPU device).
namespace {

RunSpec psgd_spec(int stage, int rank, int64_t start, bool ef = true) {
  RunSpec spec;
  spec.world = 2;
  spec.opts.stage = stage;
  spec.opts.reduce_bucket_size = 4000;
  spec.opts.powersgd_rank = rank;
  spec.opts.powersgd_start_step = start;
  spec.opts.powersgd_error_feedback = ef;
  return spec;
}

// The matrices PowerSGD compresses, in the engine's order (buckets, then each buffer's
// tensors): a tensor of 2+ dimensions, n = its first, m = the rest, r = min(n, m, rank),
// when the factors are at most half of it (PyTorch's min_compression_rate 2).
struct Mat {
  float* grad;
  size_t n, m, r;
};
std::vector<Mat> psgd_matrices(dtrain::model::Model& model, size_t rank) {
  std::vector<Mat> out;
  for (auto* pb : bucket_order(model))
    for (const auto& t : pb->layout.tensors) {
      if (t.shape.size() < 2) continue;
      const auto n = static_cast<size_t>(t.shape[0]), m = t.numel() / n, r = std::min({n, m, rank});
      if ((n + m) * r * 2 < n * m) out.push_back({pb->grad + t.offset, n, m, r});
    }
  return out;
}

// Gram-Schmidt on the columns of a (rows x cols) in double, the reference.
void gram_schmidt(std::vector<double>& a, size_t rows, size_t cols) {
  for (size_t i = 0; i < cols; ++i) {
    double sq = 0;
    for (size_t k = 0; k < rows; ++k) sq += a[k * cols + i] * a[k * cols + i];
    const double nrm = std::sqrt(sq);
    for (size_t k = 0; k < rows; ++k) a[k * cols + i] /= nrm;
    for (size_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (size_t k = 0; k < rows; ++k) dot += a[k * cols + i] * a[k * cols + j];
      for (size_t k = 0; k < rows; ++k) a[k * cols + j] -= dot * a[k * cols + i];
    }
  }
}

}  // namespace

TEST_CASE("PowerSGD: P, Q, the approximation and the error match a double-precision reference") {
  // Both ranks train on the same rows: their gradients are equal, so the allreduced
  // factors are one rank's (P summed then orthogonalised; Q summed then halved).
  const RunSpec spec = psgd_spec(0, 2, 0);
  const int rows = 6;
  std::vector<std::string> fails(2);
  auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
    RankTrainer t(spec, comm, rank);
    const auto mats = psgd_matrices(*t.model, 2);
    REQUIRE(!mats.empty());
    auto view = t.engine->checkpoint_view();
    REQUIRE(view.rank_state.size() == 2);  // Q, then the errors
    const std::vector<float> q0(view.rank_state[0].first, view.rank_state[0].first + view.rank_state[0].second);
    forward_backward(t, spec, 1, 0, rows, 1.0f);
    std::vector<std::vector<float>> raw;
    for (const auto& x : mats) raw.emplace_back(x.grad, x.grad + x.n * x.m);
    REQUIRE(t.update(spec.lr));
    view = t.engine->checkpoint_view();
    const float* q1 = view.rank_state[0].first;
    const float* err = view.rank_state[1].first;
    size_t qo = 0, eo = 0;
    double worst_m = 0, worst_q = 0, worst_e = 0;
    for (size_t k = 0; k < mats.size(); ++k) {
      const Mat& x = mats[k];
      const auto& M = raw[k];
      std::vector<double> Q(q0.begin() + static_cast<ptrdiff_t>(qo),
                            q0.begin() + static_cast<ptrdiff_t>(qo + x.m * x.r));
      gram_schmidt(Q, x.m, x.r);
      std::vector<double> P(x.n * x.r, 0.0);
      for (size_t i = 0; i < x.n; ++i)
        for (size_t c = 0; c < x.r; ++c)
          for (size_t j = 0; j < x.m; ++j) P[i * x.r + c] += M[i * x.m + j] * Q[j * x.r + c];
      gram_schmidt(P, x.n, x.r);
      std::fill(Q.begin(), Q.end(), 0.0);
      for (size_t j = 0; j < x.m; ++j)
        for (size_t c = 0; c < x.r; ++c)
          for (size_t i = 0; i < x.n; ++i) Q[j * x.r + c] += M[i * x.m + j] * P[i * x.r + c];
      double big = 0;
      for (float v : M) big = std::max(big, std::fabs(static_cast<double>(v)));
      for (size_t i = 0; i < x.m * x.r; ++i) worst_q = std::max(worst_q, std::fabs(q1[qo + i] - Q[i]) / big);
      for (size_t i = 0; i < x.n; ++i)
        for (size_t j = 0; j < x.m; ++j) {
          double a = 0;
          for (size_t c = 0; c < x.r; ++c) a += P[i * x.r + c] * Q[j * x.r + c];
          worst_m = std::max(worst_m, std::fabs(x.grad[i * x.m + j] - a) / big);
          worst_e = std::max(worst_e, std::fabs(err[eo + i * x.m + j] - (M[i * x.m + j] - a)) / big);
        }
      qo += x.m * x.r;
      eo += x.n * x.m;
    }
    if (worst_m > 1e-4 || worst_q > 1e-4 || worst_e > 1e-4)
      fails[static_cast<size_t>(rank)] = "approximation " + std::to_string(worst_m) + ", Q " + std::to_string(worst_q) +
                                         ", error " + std::to_string(worst_e);
  });
  for (const auto& e : errors) REQUIRE(e == "");
  CHECK(fails[0] == "");
  CHECK(fails[1] == "");
}

TEST_CASE("PowerSGD: uncompressed until start_step, then trains with fewer bytes and the same weights everywhere") {
  RunSpec plain = psgd_spec(1, 0, 0), late = psgd_spec(1, 2, 3);
  plain.steps = late.steps = 10;
  plain.opts.overlap_comm = late.opts.overlap_comm = true;  // reduced on the communication thread
  const RunResult a = train_run(plain), b = train_run(late);
  REQUIRE_MESSAGE(a.ok(), a.error_text());
  REQUIRE_MESSAGE(b.ok(), b.error_text());
  // Steps 1-3 apply uncompressed updates: the losses of steps 1-4 are the plain run's.
  for (int s = 0; s < 4; ++s) CHECK(b.losses[static_cast<size_t>(s)] == a.losses[static_cast<size_t>(s)]);
  CHECK(b.losses[4] != a.losses[4]);
  CHECK(b.losses.back() < b.losses.front());
  CHECK(b.rank_weights[0] == b.rank_weights[1]);

  std::vector<uint64_t> sent(2);
  for (int r : {0, 1}) {
    RunSpec s = psgd_spec(0, r == 0 ? 0 : 1, 0);
    auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
      RankTrainer t(s, comm, rank);
      const uint64_t before = comm->bytes_sent();
      t.step(1);
      if (rank == 0) sent[static_cast<size_t>(r)] = comm->bytes_sent() - before;
    });
    for (const auto& e : errors) REQUIRE(e == "");
  }
  CHECK(sent[1] < sent[0]);

  RunSpec stage2 = psgd_spec(2, 2, 0);
  auto m = model_build(stage2);
  CHECK_THROWS_WITH_AS(dtrain::train::ZeroEngine(*m, nullptr, stage2.opts),
                       doctest::Contains("powersgd needs zero_optimization.stage 0 or 1, but the stage is 2"),
                       dtrain::ConfigError);
}

TEST_CASE("PowerSGD error feedback conserves the gradient: W x the applied sum + the errors == the raw sum") {
  const RunSpec spec = psgd_spec(0, 1, 0);
  const int steps = 4;
  std::vector<std::vector<double>> raw(2), applied(2), error(2);
  auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
    RankTrainer t(spec, comm, rank);
    const auto mats = psgd_matrices(*t.model, 1);
    size_t n = 0;
    for (const auto& x : mats) n += x.n * x.m;
    auto& mr = raw[static_cast<size_t>(rank)];
    auto& ma = applied[static_cast<size_t>(rank)];
    mr.assign(n, 0.0);
    ma.assign(n, 0.0);
    const int rows = spec.global_batch / spec.world;
    for (int s = 1; s <= steps; ++s) {
      forward_backward(t, spec, s, rank * rows, rows, 1.0f);
      size_t at = 0;
      for (const auto& x : mats)
        for (size_t i = 0; i < x.n * x.m; ++i) mr[at++] += x.grad[i];
      REQUIRE(t.update(spec.lr));
      at = 0;
      for (const auto& x : mats)
        for (size_t i = 0; i < x.n * x.m; ++i) ma[at++] += x.grad[i];
    }
    const auto view = t.engine->checkpoint_view();
    REQUIRE(view.rank_state.size() == 2);
    error[static_cast<size_t>(rank)].assign(view.rank_state[1].first,
                                            view.rank_state[1].first + view.rank_state[1].second);
  });
  for (const auto& e : errors) REQUIRE(e == "");
  REQUIRE(error[0].size() == raw[0].size());
  double worst = 0, scale = 0, kept = 0;
  for (size_t i = 0; i < raw[0].size(); ++i) {
    CHECK(applied[0][i] == applied[1][i]);
    const double rhs = raw[0][i] + raw[1][i];
    worst = std::max(worst, std::fabs(2.0 * applied[0][i] + error[0][i] + error[1][i] - rhs));
    scale = std::max(scale, std::fabs(rhs));
    kept += std::fabs(error[0][i]) + std::fabs(error[1][i]);
  }
  CHECK(kept > 0.0);
  CHECK(worst <= 1e-5 * scale);
}

TEST_CASE("PowerSGD resumes bit-exactly: Q and the errors travel in the sharded checkpoint") {
  // The errors lost (Q kept): what a checkpoint without them would resume from.
  check_resume_exact(psgd_spec(1, 2, 1), [](const dtrain::train::ZeroCheckpointView& view) {
    std::fill(view.rank_state[1].first, view.rank_state[1].first + view.rank_state[1].second, 0.0f);
  });
}

TEST_CASE("top-k and PowerSGD recover from an overflowed step: its inf/NaN do not stay in their state") {
  for (bool topk : {true, false}) {
    CAPTURE(topk);
    const RunSpec spec = topk ? topk_spec(0, 0.05f) : psgd_spec(0, 1, 0);
    std::vector<int> applied(2, 0);
    auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int rank) {
      RankTrainer t(spec, comm, rank);
      const int rows = spec.global_batch / spec.world;
      // Step 1: gradients that overflow (inf), as fp16 dynamic scaling meets early on.
      forward_backward(t, spec, 1, rank * rows, rows, std::numeric_limits<float>::infinity());
      CHECK_FALSE(t.update(spec.lr));
      for (int s = 2; s <= 4; ++s) {
        bool ok = false;
        t.step(s, &ok);
        applied[static_cast<size_t>(rank)] += ok ? 1 : 0;
      }
    });
    for (const auto& e : errors) REQUIRE(e == "");
    CHECK(applied[0] == 3);
    CHECK(applied[1] == 3);
  }
}
