// ZeRO engine features: bf16/fp16 mixed precision against the single-rank run, fp16
// overflow skipped by every rank together, LoRA under stages 2 and 3, clipping by the
// true global norm, overlap_comm identical to the inline path, stage-3 persistence,
// per-rank memory against the theoretical figure (with the stage-2/3 savings measured),
// the model really freeing the arrays the engine shards (Model::allocated_bytes), and
// the memory report's line on what bf16/fp16 on the CPU is.
#include "zero_harness.h"

#include <doctest/doctest.h>

#include "core/error.h"

#include <fmt/format.h>

using namespace zero_test;
using dtrain::DType;

namespace {

RunSpec spec_for(int stage, int world, bool llama = false) {
  RunSpec s;
  s.llama = llama;
  s.world = world;
  s.opts.stage = stage;
  s.opts.param_persistence_threshold = 0;
  s.opts.reduce_bucket_size = 10000;
  s.opts.allgather_bucket_size = 10000;
  s.opts.prefetch_bucket_size = 20000;
  s.steps = 12;
  return s;
}

void check_close(const RunResult& ref, const RunResult& got, double loss_tol, double w_tol) {
  REQUIRE_MESSAGE(ref.ok(), ref.error_text());
  REQUIRE_MESSAGE(got.ok(), got.error_text());
  const double dl = max_rel_diff(got.losses, ref.losses);
  const double dw = max_abs_diff(got.weights, ref.weights);
  INFO("max loss rel diff " << dl << ", max weight diff " << dw);
  CHECK(dl <= loss_tol);
  CHECK(dw <= w_tol);
  for (size_t r = 1; r < got.rank_weights.size(); ++r) CHECK(got.rank_weights[r] == got.rank_weights[0]);
  CHECK(got.losses.back() < got.losses.front() - 0.05);
}

}  // namespace

TEST_CASE("bf16: stages 0-3 agree with the single-rank bf16 run within bf16 precision") {
  RunSpec base = spec_for(0, 1);
  base.opts.compute_dtype = DType::BF16;
  const RunResult ref = train_run(base);
  REQUIRE_MESSAGE(ref.ok(), ref.error_text());
  for (auto [stage, world] : std::vector<std::pair<int, int>>{{0, 2}, {1, 2}, {2, 3}, {3, 2}, {3, 3}}) {
    CAPTURE(stage);
    CAPTURE(world);
    RunSpec s = spec_for(stage, world);
    s.opts.compute_dtype = DType::BF16;
    check_close(ref, train_run(s), 1e-2, 2e-2);
  }
  // And bf16 is really in use: the fp32 run differs by more than fp32 noise.
  const RunResult f32 = train_run(spec_for(0, 1));
  CHECK(max_rel_diff(f32.losses, ref.losses) > 1e-4);
}

TEST_CASE("the memory report says what bf16 on the CPU is (fp32 GEMMs on rounded values), and only then") {
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    RunSpec s = spec_for(1, 1);
    s.opts.compute_dtype = dt;
    RankTrainer t(s, nullptr, 0);
    const std::string rep = t.engine->report().memory_text();
    INFO(rep);
    CHECK((rep.find("no memory or time saved") != std::string::npos) == (dt != DType::F32));
  }
}

TEST_CASE("bf16 compute copy: the model's resident buffers hold bf16 values, the masters do not") {
  RunSpec s = spec_for(2, 2);
  s.opts.compute_dtype = DType::BF16;
  s.steps = 3;
  auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int r) {
    RankTrainer t(s, comm, r);
    for (int k = 1; k <= s.steps; ++k) t.step(k);
    size_t off_grid = 0, n = 0;
    for (auto& pb : t.model->params())
      for (size_t i = 0; i < pb.size; ++i, ++n)
        if (dtrain::bf16_to_f32(dtrain::f32_to_bf16(pb.host_f32()[i])) != pb.host_f32()[i]) ++off_grid;
    if (off_grid != 0) throw std::runtime_error(fmt::format("{} of {} compute values are not bf16", off_grid, n));
    const auto w = t.weights();  // fp32 masters
    size_t master_off_grid = 0;
    for (float x : w) master_off_grid += dtrain::bf16_to_f32(dtrain::f32_to_bf16(x)) != x;
    if (master_off_grid < w.size() / 2) throw std::runtime_error("the masters look rounded to bf16");
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("fp16: loss-scaled stage 2 matches single rank; an overflow is skipped by every rank") {
  RunSpec base = spec_for(0, 1);
  base.opts.compute_dtype = DType::F16;
  base.loss_scale = 1024.0f;
  const RunResult ref = train_run(base);
  RunSpec s = spec_for(2, 3);
  s.opts.compute_dtype = DType::F16;
  s.loss_scale = 1024.0f;
  check_close(ref, train_run(s), 1e-2, 2e-2);

  // A scale that overflows fp16 gradients: no rank applies the step.
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    RunSpec o = spec_for(stage, 2);
    o.opts.compute_dtype = DType::F16;
    o.loss_scale = 1e9f;
    std::vector<int> applied(2, -1);
    std::vector<std::vector<float>> before(2), after(2);
    auto errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int r) {
      RankTrainer t(o, comm, r);
      before[static_cast<size_t>(r)] = t.weights();
      bool ok = true;
      t.step(1, &ok);
      applied[static_cast<size_t>(r)] = ok ? 1 : 0;
      after[static_cast<size_t>(r)] = t.weights();
      if (t.engine->last_step().step_count != 0) throw std::runtime_error("step count advanced on overflow");
      if (std::isfinite(t.engine->last_step().grad_norm)) throw std::runtime_error("finite norm on overflow");
    });
    for (const auto& e : errors) CHECK(e == "");
    CHECK(applied == std::vector<int>{0, 0});
    CHECK(before[0] == after[0]);
    CHECK(before[1] == after[1]);
  }
}

TEST_CASE("LoRA under stages 2 and 3 matches single-rank LoRA; the frozen base does not move") {
  for (bool llama : {false, true}) {
    CAPTURE(llama);
    RunSpec base = spec_for(0, 1, llama);
    base.lora = true;
    const RunResult ref = train_run(base);
    REQUIRE_MESSAGE(ref.ok(), ref.error_text());
    for (auto [stage, world] : std::vector<std::pair<int, int>>{{2, 2}, {3, 3}}) {
      CAPTURE(stage);
      CAPTURE(world);
      RunSpec s = spec_for(stage, world, llama);
      s.lora = true;
      const RunResult got = train_run(s);
      REQUIRE_MESSAGE(got.ok(), got.error_text());
      CHECK(max_rel_diff(got.losses, ref.losses) <= 2e-5);
      CHECK(max_abs_diff(got.weights, ref.weights) <= 5e-5);
      // Base weights are the initial ones.
      auto m0 = model_build(s);
      size_t nb = 0;
      for (auto& pb : m0->params()) nb += pb.size;
      std::vector<float> init;
      for (auto& pb : m0->params()) init.insert(init.end(), pb.host_f32(), pb.host_f32() + pb.size);
      CHECK(std::vector<float>(got.weights.begin(), got.weights.begin() + static_cast<long>(nb)) == init);
      CHECK(got.losses.back() < got.losses.front());
    }
  }
}

TEST_CASE("clipping uses the true global norm at every stage") {
  RunSpec base = spec_for(0, 1);
  base.opts.gradient_clipping = 0.3f;
  const RunResult ref = train_run(base);
  REQUIRE_MESSAGE(ref.ok(), ref.error_text());
  size_t clipped = 0;
  for (double n : ref.norms) clipped += n > 0.3;
  CHECK(clipped > 0);  // the clip is active
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    RunSpec s = spec_for(stage, 3);
    s.opts.gradient_clipping = 0.3f;
    const RunResult got = train_run(s);
    check_close(ref, got, 2e-5, 5e-5);
    for (size_t i = 0; i < ref.norms.size(); ++i) CHECK(got.norms[i] == doctest::Approx(ref.norms[i]).epsilon(1e-5));
  }
}

TEST_CASE("overlap_comm gives results identical to the inline path") {
  for (auto [stage, world] :
       std::vector<std::pair<int, int>>{{0, 2}, {0, 4}, {1, 3}, {1, 4}, {2, 3}, {2, 4}, {3, 3}, {3, 4}}) {
    CAPTURE(stage);
    CAPTURE(world);
    RunSpec s = spec_for(stage, world);
    s.steps = 8;
    s.opts.reduce_bucket_size = 3000;  // several buckets in flight during backward
    const RunResult off = train_run(s);
    s.opts.overlap_comm = true;
    const RunResult on = train_run(s);
    REQUIRE_MESSAGE(off.ok(), off.error_text());
    REQUIRE_MESSAGE(on.ok(), on.error_text());
    CHECK(on.losses == off.losses);
    CHECK(on.weights == off.weights);
  }
}

TEST_CASE("overlap_comm at stages 0-2 issues gradient collectives while backward still runs") {
  for (int stage : {0, 1, 2})
    for (bool overlap : {false, true}) {
      CAPTURE(stage);
      CAPTURE(overlap);
      RunSpec s = spec_for(stage, 3);
      s.opts.reduce_bucket_size = 3000;
      s.opts.overlap_comm = overlap;
      std::vector<uint64_t> issued(3, 0);
      const auto errors = run_ranks(3, [&](dtrain::comm::Communicator* comm, int r) {
        RankTrainer t(s, comm, r);
        for (int k = 1; k <= 2; ++k) t.step(k);
        issued[static_cast<size_t>(r)] = t.engine->last_step().comm_issued_in_backward;
      });
      for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
      // Several buckets per step, all but the embeddings' complete before layer -1 runs.
      for (uint64_t n : issued) CHECK(overlap ? n >= 4 : n == 0);
    }
}

TEST_CASE("overlap_comm with gradient accumulation: reduced once, in the last micro-batch, identical to inline") {
  for (auto [stage, world] : std::vector<std::pair<int, int>>{{0, 2}, {1, 3}, {2, 3}}) {
    CAPTURE(stage);
    std::vector<std::vector<float>> weights(2);
    for (bool overlap : {false, true}) {
      RunSpec s = spec_for(stage, world);
      s.opts.reduce_bucket_size = 3000;
      s.opts.overlap_comm = overlap;
      std::vector<float> w0;
      const auto errors = run_ranks(world, [&](dtrain::comm::Communicator* comm, int r) {
        RankTrainer t(s, comm, r);
        const int rows = s.global_batch / world / 2;
        for (int step = 1; step <= 4; ++step) {
          t.engine->before_step();
          for (int a = 0; a < 2; ++a) {
            batch_rows(step * 10 + a, r * rows, rows, s.T, t.model->config().vocab_size, t.tok, t.tgt);
            t.model->forward(t.tok.data(), t.tgt.data(), rows, s.T);
            t.engine->set_last_micro_batch(a == 1);
            t.model->backward(0.5f);
          }
          if (overlap && stage <= 1 && step == 4) {
            // The last micro-batch reduced the gradients: one more backward would add
            // unreduced gradients to them.
            t.model->forward(t.tok.data(), t.tgt.data(), rows, s.T);
            CHECK_THROWS_AS(t.model->backward(0.5f), dtrain::UsageError);
          }
          t.update(s.lr);
        }
        std::vector<float> w = t.weights();
        if (r == 0) w0 = w;
      });
      for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
      weights[overlap ? 1 : 0] = w0;
    }
    REQUIRE(!weights[0].empty());
    CHECK(weights[1] == weights[0]);
  }
}

TEST_CASE("stage 3 persistence threshold: small buffers stay resident, results unchanged") {
  const RunResult ref = train_run(spec_for(0, 1));
  RunSpec s = spec_for(3, 3);
  s.opts.param_persistence_threshold = 5000;  // embeddings (2560) and head (64) stay resident
  const RunResult got = train_run(s);
  check_close(ref, got, 2e-5, 5e-5);
  RunSpec all = spec_for(3, 3);
  const RunResult sharded = train_run(all);
  REQUIRE(sharded.ok());
  CHECK(got.memory[0].param_bytes > sharded.memory[0].param_bytes);
}

TEST_CASE("per-rank memory matches the theoretical figure within 10% and the stages save it") {
  const int W = 4;
  std::vector<dtrain::train::ZeroMemory> mem;
  size_t full_grad = 0;
  for (int stage : {0, 1, 2, 3}) {
    RunSpec s = spec_for(stage, W);
    s.n_layer = 6;
    s.steps = 2;
    s.opts.reduce_bucket_size = 9000;  // about one layer per gradient bucket
    s.opts.prefetch_bucket_size = 9000;
    // The model's own bookkeeping: what it holds before the engine, during training,
    // while materialized and once the engine is gone.
    const size_t phi = model_build(s)->num_params(), full = model_build(s)->allocated_bytes();
    REQUIRE(full == 2 * 4 * phi);
    std::vector<size_t> training(W), materialized(W), after(W);
    std::vector<dtrain::train::ZeroMemory> ranks(W);
    auto errors = run_ranks(W, [&](dtrain::comm::Communicator* comm, int r) {
      RankTrainer t(s, comm, r);
      for (int k = 1; k <= s.steps; ++k) t.step(k);
      training[static_cast<size_t>(r)] = t.model->allocated_bytes();
      ranks[static_cast<size_t>(r)] = t.engine->report().memory();
      t.engine->weights().materialize();
      materialized[static_cast<size_t>(r)] = t.model->allocated_bytes();
      std::vector<float> w;
      for (auto& pb : t.model->params()) w.insert(w.end(), pb.host_f32(), pb.host_f32() + pb.size);
      t.engine.reset();  // materialized: the model keeps the full fp32 weights
      after[static_cast<size_t>(r)] = t.model->allocated_bytes();
      std::vector<float> w2;
      for (auto& pb : t.model->params()) w2.insert(w2.end(), pb.host_f32(), pb.host_f32() + pb.size);
      if (w2 != w) throw std::runtime_error("weights changed when the engine was destroyed");
    });
    for (const auto& e : errors) REQUIRE(e == "");
    const auto& m = ranks[0];
    MESSAGE(
        fmt::format("stage {} W {}: params {} (theory {}) grads {} (theory {}) optim {} (theory {}) "
                    "transient peak {} model-idle {}; model holds {} of {} bytes",
                    stage, W, m.param_bytes, m.theory_param, m.grad_bytes, m.theory_grad, m.optim_bytes, m.theory_optim,
                    m.work_peak_bytes, m.model_idle_bytes, training[0], full));
    for (int r = 0; r < W; ++r) {
      CAPTURE(r);
      const auto& x = ranks[static_cast<size_t>(r)];
      CHECK(x.model_idle_bytes == 0);
      CHECK(static_cast<double>(x.total()) >= 0.9 * static_cast<double>(x.theory_total()));
      CHECK(static_cast<double>(x.total()) <= 1.1 * static_cast<double>(x.theory_total()));
      CHECK(static_cast<double>(x.grad_bytes) <= 1.1 * static_cast<double>(x.theory_grad));
      CHECK(static_cast<double>(x.optim_bytes) <= 1.1 * static_cast<double>(x.theory_optim));
      // Stage 2 frees every full gradient array, stage 3 every parameter array too (the
      // threshold is 0: everything is sharded).
      const size_t want = stage <= 1 ? full : stage == 2 ? full - 4 * phi : 0;
      CHECK(training[static_cast<size_t>(r)] == want);
      CHECK(materialized[static_cast<size_t>(r)] == (stage == 3 ? 4 * phi : want));
      CHECK(after[static_cast<size_t>(r)] == full);
    }
    if (stage == 0) full_grad = m.grad_bytes;
    // Transients: the full gradients never exist at once, only one working layer (plus
    // the tied embeddings, written by the head) and one bucket of about a layer; stage 3
    // adds the gathered current layer and embeddings (the prefetch budget is below a
    // layer, so nothing is gathered ahead).
    const size_t emb = sizeof(float) * (64 * 32 + 16 * 32);  // wte + wpe
    const size_t layer = sizeof(float) * 12704;
    if (stage == 2) {
      CHECK(m.work_peak_bytes <= emb + 2 * layer);
      CHECK(m.grad_bytes + m.work_peak_bytes < full_grad * 65 / 100);
    }
    if (stage == 3) CHECK(m.work_peak_bytes <= 2 * emb + 3 * layer);
    mem.push_back(m);
  }
  CHECK(mem[1].total() < mem[0].total());
  CHECK(mem[2].total() < mem[1].total());
  CHECK(mem[3].total() < mem[2].total());
}

TEST_CASE("the model frees exactly what the engine shards (persistence threshold, LoRA, Llama) and is whole after") {
  struct Case {
    bool llama, lora;
    int stage;
    size_t threshold;
  };
  for (const Case c : {Case{false, false, 2, 0}, Case{false, false, 3, 5000}, Case{true, false, 3, 0},
                       Case{true, true, 3, 0}, Case{false, true, 2, 0}, Case{true, true, 3, 1000}}) {
    CAPTURE(c.llama);
    CAPTURE(c.lora);
    CAPTURE(c.stage);
    CAPTURE(c.threshold);
    RunSpec s = spec_for(c.stage, 3, c.llama);
    s.lora = c.lora;
    s.steps = 2;
    s.opts.param_persistence_threshold = c.threshold;
    auto m0 = model_build(s);
    // Expected: resident parameter arrays (all at stage 2; below the threshold at stage
    // 3), no gradient arrays at all.
    size_t want = 0;
    for (auto* list : {&m0->params(), &m0->lora_params()})
      for (auto& pb : *list)
        if (c.stage == 2 || pb.size < c.threshold) want += 4 * pb.size;
    const size_t full = m0->allocated_bytes();
    REQUIRE(want < full);
    const RunResult ref = [&] {
      RunSpec r = s;
      r.world = 1;
      r.opts.stage = 0;
      return train_run(r);
    }();
    REQUIRE_MESSAGE(ref.ok(), ref.error_text());
    auto errors = run_ranks(3, [&](dtrain::comm::Communicator* comm, int r) {
      RankTrainer t(s, comm, r);
      for (int k = 1; k <= s.steps; ++k) t.step(k);
      if (t.model->allocated_bytes() != want || t.model->grad_allocated_bytes() != 0)
        throw std::runtime_error(fmt::format("model holds {} bytes ({} of gradients), expected {} and 0",
                                             t.model->allocated_bytes(), t.model->grad_allocated_bytes(), want));
      if (t.engine->report().memory().model_idle_bytes != 0) throw std::runtime_error("idle model storage");
      const auto w = t.weights();
      if (max_abs_diff(w, ref.weights) > 5e-5) throw std::runtime_error("weights differ from the single-rank run");
      // Destroyed while not materialized: whole storage again, usable without an engine.
      t.engine.reset();
      if (t.model->allocated_bytes() != full) throw std::runtime_error("storage not restored by the destructor");
      // Stage 2 keeps every weight; stage 3 keeps this rank's shard, zeros elsewhere.
      size_t at = 0, kept = 0;
      for (auto* list : {&t.model->params(), &t.model->lora_params()})
        for (auto& pb : *list)
          for (size_t i = 0; i < pb.size; ++i, ++at) {
            if (pb.host_f32()[i] == w[at]) ++kept;
            else if (c.stage == 2 || pb.host_f32()[i] != 0.0f)
              throw std::runtime_error("weights changed by the destructor");
            pb.host_f32()[i] = w[at];
          }
      if (c.stage == 3 && kept * 2 > w.size()) throw std::runtime_error("more than a shard survived the destructor");
      // With the weights back, the bare model trains without an engine (hooks removed,
      // gradients allocated).
      std::vector<int32_t> tok, tgt;
      batch_rows(99, 0, 2, s.T, t.model->config().vocab_size, tok, tgt);
      t.model->zero_grad();
      const float loss = t.model->forward(tok.data(), tgt.data(), 2, s.T);
      t.model->backward();
      if (!std::isfinite(loss)) throw std::runtime_error("bare model loss is not finite");
      double g = 0;
      for (auto& pb : t.model->trainable_params())
        for (size_t i = 0; i < pb.size; ++i) g += std::fabs(pb.grad[i]);
      if (!(g > 0)) throw std::runtime_error("bare model has no gradient");
    });
    for (const auto& e : errors) CHECK(e == "");
  }
}

TEST_CASE("zero_options_from maps the config keys") {
  dtrain::config::TrainConfig cfg;
  cfg.source = "t.yaml";
  cfg.zero.stage = 3;
  cfg.zero.reduce_bucket_size = 1234;
  cfg.zero.allgather_bucket_size = 99;
  cfg.zero.overlap_comm = true;
  cfg.zero.stage3_prefetch_bucket_size = 77;
  cfg.zero.stage3_param_persistence_threshold = 5;
  cfg.optimizer.lr = 0.5;
  cfg.optimizer.weight_decay = 0.1;
  cfg.bf16.enabled = true;
  cfg.gradient_clipping = 1.5;
  const auto o = dtrain::train::zero_options_from(cfg);
  CHECK(o.stage == 3);
  CHECK(o.reduce_bucket_size == 1234);
  CHECK(o.allgather_bucket_size == 99);
  CHECK(o.overlap_comm);
  CHECK(o.prefetch_bucket_size == 77);
  CHECK(o.param_persistence_threshold == 5);
  CHECK(o.adamw.lr == 0.5f);
  CHECK(o.adamw.weight_decay == doctest::Approx(0.1));
  CHECK(o.compute_dtype == DType::BF16);
  CHECK(o.gradient_clipping == 1.5f);
  cfg.zero.stage = 4;
  CHECK_THROWS_AS(dtrain::train::zero_options_from(cfg), dtrain::ConfigError);
  cfg.zero.stage = 2;
  cfg.zero.reduce_bucket_size = 0;
  CHECK_THROWS_AS(dtrain::train::zero_options_from(cfg), dtrain::ConfigError);
}

TEST_CASE("stage 3: evaluation between weights().materialize() and restore() needs no lockstep") {
  RunSpec s = spec_for(3, 3);
  s.steps = 2;
  std::vector<float> eval_loss(3, 0.0f);
  auto errors = run_ranks(3, [&](dtrain::comm::Communicator* comm, int r) {
    RankTrainer t(s, comm, r);
    for (int k = 1; k <= s.steps; ++k) t.step(k);
    t.engine->weights().materialize();
    std::vector<int32_t> tok, tgt;
    batch_rows(100, 0, 4, s.T, 64, tok, tgt);
    for (int i = 0; i <= r; ++i) eval_loss[static_cast<size_t>(r)] = t.model->forward(tok.data(), tgt.data(), 4, s.T);
    t.engine->weights().restore();
    t.step(s.steps + 1);  // training goes on in lockstep afterwards
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK(eval_loss[0] == eval_loss[1]);
  CHECK(eval_loss[0] == eval_loss[2]);
}
