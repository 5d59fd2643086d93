// Shared by the ZeRO engine and checkpoint tests: tiny GPT-2 / Llama models, N ranks as
// threads over Gloo + HashStore on 127.0.0.1, and a training run where each rank takes
// its slice of one global batch, so every world size sees the same global gradient.
#pragma once

#include "comm/gloo_comm.h"
#include "rank_threads.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/zero_engine.h"

#include <gloo/rendezvous/hash_store.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace zero_test {

using dtrain::model::ModelConfig;

inline ModelConfig tiny_config(bool llama, int n_layer = 2) {
  ModelConfig c;
  c.arch = llama ? ModelConfig::Arch::LLAMA : ModelConfig::Arch::GPT2;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_kv_head = llama ? 2 : 4;
  c.d_model = 32;
  c.d_ff = llama ? 48 : 128;
  c.tie_embeddings = !llama;
  return c;
}

struct RunSpec {
  bool llama = false;
  bool lora = false;
  int n_layer = 2;
  int world = 1;
  int steps = 20;
  int global_batch = 12;  // divisible by 1, 2, 3, 4
  int T = 16;
  float lr = 3e-3f;
  float loss_scale = 1.0f;
  uint64_t init_seed = 7;
  dtrain::train::ZeroOptions opts;
};

inline std::unique_ptr<dtrain::model::Model> model_build(const RunSpec& r) {
  auto m = std::make_unique<dtrain::model::Model>(tiny_config(r.llama, r.n_layer));
  m->init_weights(r.init_seed);
  if (r.lora) {
    dtrain::model::LoraConfig lc;
    lc.rank = 4;
    lc.alpha = 8.0f;
    lc.targets = r.llama ? std::vector<std::string>{"q_proj", "v_proj", "down_proj"}
                         : std::vector<std::string>{"c_attn", "c_fc"};
    lc.seed = 3;
    m->lora_enable(lc);
    // B starts at zero; give it values so base and adapter gradients are non-trivial.
    for (auto& pb : m->lora_params())
      for (size_t i = 0; i < pb.size; ++i) pb.host_f32()[i] += 0.01f * std::sin(static_cast<float>(i));
  }
  return m;
}

// Rows [row0, row0 + rows) of step `step`'s global batch: tokens and next-token targets.
inline void batch_rows(int step, int row0, int rows, int T, int vocab, std::vector<int32_t>& tok,
                       std::vector<int32_t>& tgt) {
  tok.resize(static_cast<size_t>(rows) * T);
  tgt.resize(tok.size());
  for (int r = 0; r < rows; ++r) {
    dtrain::Rng rng(static_cast<uint64_t>(step) * 1000 + static_cast<uint64_t>(row0 + r));
    std::vector<int32_t> seq(static_cast<size_t>(T) + 1);
    // A learnable pattern (x -> x + 1 mod vocab) with noise.
    seq[0] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    for (int t = 1; t <= T; ++t)
      seq[static_cast<size_t>(t)] = rng.uniform() < 0.8f
                                        ? (seq[static_cast<size_t>(t) - 1] + 1) % vocab
                                        : static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    for (int t = 0; t < T; ++t) {
      tok[static_cast<size_t>(r) * T + t] = seq[static_cast<size_t>(t)];
      tgt[static_cast<size_t>(r) * T + t] = seq[static_cast<size_t>(t) + 1];
    }
  }
}

using dtrain::test::run_ranks;

// One rank's training state and steps: forward/backward on its slice of the global batch.
struct RankTrainer {
  RunSpec spec;
  int rank = 0;
  std::unique_ptr<dtrain::model::Model> model;
  std::unique_ptr<dtrain::train::ZeroEngine> engine;
  std::vector<int32_t> tok, tgt;

  RankTrainer(const RunSpec& s, dtrain::comm::Communicator* comm, int r)
      : RankTrainer(s, dtrain::comm::ProcessGroups::world_only(comm), r) {}
  // Over the data-parallel group of `groups` (r: the rank in it).
  RankTrainer(const RunSpec& s, const dtrain::comm::ProcessGroups& groups, int r) : spec(s), rank(r) {
    model = model_build(s);
    engine = std::make_unique<dtrain::train::ZeroEngine>(*model, groups, s.opts);
  }
  // One optimizer step (1-based global step index); returns this rank's local loss.
  float step(int step_index, bool* applied = nullptr) {
    const int rows = spec.global_batch / spec.world;
    batch_rows(step_index, rank * rows, rows, spec.T, model->config().vocab_size, tok, tgt);
    engine->before_step();
    const float loss = model->forward(tok.data(), tgt.data(), rows, spec.T);
    model->backward(spec.loss_scale);
    const bool ok = update(spec.lr, spec.loss_scale);
    if (applied) *applied = ok;
    return loss;
  }
  // The engine's update after backward (its three calls, as train::TrainStep makes them);
  // true when applied.
  bool update(float lr, float loss_scale = 1.0f) {
    engine->step_prepare(lr);
    engine->step_issue(loss_scale);
    return engine->step_finish(loss_scale);
  }
  // Every parameter (base then adapters), full fp32 masters.
  std::vector<float> weights() {
    engine->weights().materialize();
    std::vector<float> w;
    for (auto* list : {&model->params(), &model->lora_params()})
      for (auto& pb : *list) w.insert(w.end(), pb.host_f32(), pb.host_f32() + pb.size);
    engine->weights().restore();
    return w;
  }
};

struct RunResult {
  std::vector<double> losses;  // global mean loss per step (mean of the ranks' losses)
  std::vector<float> weights;  // rank 0's final full weights
  std::vector<std::vector<float>> rank_weights;
  std::vector<dtrain::train::ZeroMemory> memory;
  std::vector<std::string> errors;
  std::vector<double> norms;
  bool ok() const {
    for (const auto& e : errors)
      if (!e.empty()) return false;
    return true;
  }
  std::string error_text() const {
    std::string s;
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) s += "rank " + std::to_string(r) + ": " + errors[r] + "\n";
    return s;
  }
};

inline RunResult train_run(const RunSpec& spec) {
  RunResult out;
  std::vector<std::vector<float>> losses(static_cast<size_t>(spec.world));
  out.rank_weights.resize(static_cast<size_t>(spec.world));
  out.memory.resize(static_cast<size_t>(spec.world));
  std::vector<double> norms;
  out.errors = run_ranks(spec.world, [&](dtrain::comm::Communicator* comm, int r) {
    RankTrainer t(spec, comm, r);
    for (int s = 1; s <= spec.steps; ++s) {
      losses[static_cast<size_t>(r)].push_back(t.step(s));
      if (r == 0) norms.push_back(t.engine->last_step().grad_norm);
    }
    out.rank_weights[static_cast<size_t>(r)] = t.weights();
    out.memory[static_cast<size_t>(r)] = t.engine->report().memory();
  });
  if (!out.ok()) return out;
  for (int s = 0; s < spec.steps; ++s) {
    double sum = 0;
    for (int r = 0; r < spec.world; ++r) sum += losses[static_cast<size_t>(r)][static_cast<size_t>(s)];
    out.losses.push_back(sum / spec.world);
  }
  out.weights = out.rank_weights[0];
  out.norms = norms;
  return out;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]) / std::max(1e-12, std::fabs(b[i])));
  return d;
}

}  // namespace zero_test
