// ZeRO-3 from a model with deferred storage (DeepSpeed's zero.Init): the engine takes each
// base buffer's values one at a time and keeps only this rank's shard, so no rank holds
// the whole model. Its masters equal those of an engine built from the whole model (from
// a random init and from an HF checkpoint), training gives the same losses, the model
// never gets storage for a sharded buffer, and a checkpoint that lacks a tensor fails
// before anything is built.
#include "temp_dir.h"
#include "zero_harness.h"
#include "core/error.h"
#include "model/model.h"
#include "train/model_factory.h"
#include "train/zero_engine.h"

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

using namespace dtrain;
namespace fs = std::filesystem;
using zero_test::tiny_config;

namespace {

train::ZeroOptions stage3(size_t persistence) {
  train::ZeroOptions o;
  o.stage = 3;
  o.param_persistence_threshold = persistence;
  o.reduce_bucket_size = 1000;
  o.allgather_bucket_size = 1000;
  o.prefetch_bucket_size = 1000;
  return o;
}

// Every master weight of the engine, gathered (a collective: every rank calls it).
std::vector<float> masters(train::ZeroEngine& e, const model::ModelConfig& cfg) {
  model::Model host(cfg);
  e.weights().to_host(host);
  std::vector<float> out;
  for (size_t i = 0; i < host.params().size(); ++i) {
    const auto v = host.buffer_to_host(i);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// A few steps of the harness's global batch on this rank's rows; the mean loss of each.
std::vector<float> train_steps(model::Model& m, train::ZeroEngine& e, int rank, int world, int steps) {
  const int rows = 4 / world, T = 8;  // each rank's rows of a global batch of 4
  std::vector<float> losses;
  std::vector<int32_t> tok, tgt;
  for (int s = 1; s <= steps; ++s) {
    zero_test::batch_rows(s, rank * rows, rows, T, m.config().vocab_size, tok, tgt);
    e.before_step();
    losses.push_back(m.forward(tok.data(), tgt.data(), rows, T));
    m.backward(1.0f);
    e.step_prepare(3e-3f);
    e.step_issue(1.0f);
    REQUIRE(e.step_finish(1.0f));
  }
  return losses;
}

}  // namespace

TEST_CASE("deferred ZeRO-3: the same masters and losses as from the whole model, no full copy on a rank") {
  for (size_t persistence : {size_t{0}, size_t{2000}}) {  // all sharded / the small buffers resident
    CAPTURE(persistence);
    const model::ModelConfig cfg = tiny_config(true, 3);
    const uint64_t seed = 11;
    std::vector<std::vector<float>> whole_w(2), deferred_w(2), whole_l(2), deferred_l(2);
    std::vector<size_t> deferred_bytes(2), sharded_bytes(2);
    const auto errors = zero_test::run_ranks(2, [&](comm::Communicator* comm, int r) {
      const auto ri = static_cast<size_t>(r);
      {
        model::Model m(cfg);
        m.init_weights(seed);
        train::ZeroEngine e(m, comm, stage3(persistence));
        whole_w[ri] = masters(e, cfg);
        whole_l[ri] = train_steps(m, e, r, 2, 3);
      }
      model::Model m(cfg, model::Model::Deferred{});
      REQUIRE(m.allocated_bytes() == 0);  // nothing until the engine asks
      train::ZeroEngine e(m, comm, stage3(persistence), nullptr,
                          [&](size_t i, float* host) { m.init_buffer_values(i, seed, host); });
      // The model holds storage only for the resident (unsharded) buffers.
      size_t resident = 0, sharded = 0;
      for (const auto& pb : m.params()) (pb.size >= persistence ? sharded : resident) += pb.size * sizeof(float);
      deferred_bytes[ri] = m.param_allocated_bytes();
      sharded_bytes[ri] = sharded;
      CHECK(m.param_allocated_bytes() == resident);
      for (size_t i = 0; i < m.params().size(); ++i) CHECK(m.param_released(i) == (m.params()[i].size >= persistence));
      CHECK(e.report().memory().model_idle_bytes == 0);
      deferred_w[ri] = masters(e, cfg);
      deferred_l[ri] = train_steps(m, e, r, 2, 3);
    });
    for (const auto& err : errors) REQUIRE_MESSAGE(err.empty(), err);
    CHECK(sharded_bytes[0] > 0);
    for (size_t r = 0; r < 2; ++r) {
      CHECK(deferred_w[r] == whole_w[r]);  // bit for bit
      CHECK(deferred_l[r] == whole_l[r]);
    }
  }
}

TEST_CASE("deferred ZeRO-3 from an HF checkpoint: the tensors of the files, a missing one named first") {
  test::TempDir d("deferred_hf");
  model::ModelConfig cfg = tiny_config(true, 2);
  cfg.arch = model::ModelConfig::Arch::QWEN2;
  cfg.qkv_bias = true;
  cfg.tie_embeddings = true;
  {
    model::Model src(cfg);
    src.init_weights(5);
    train::model_export_hf(src, (d.path / "hf").string());
  }
  config::TrainConfig tc;
  tc.source = (d.path / "job.yaml").string();
  tc.model.init_from = (d.path / "hf").string();
  tc.training.seed = 99;  // not used: the weights come from the files

  std::vector<std::vector<float>> whole_w(2), deferred_w(2);
  const auto errors = zero_test::run_ranks(2, [&](comm::Communicator* comm, int r) {
    const auto ri = static_cast<size_t>(r);
    {
      auto m = train::model_create(tc);
      train::ZeroEngine e(*m, comm, stage3(0));
      whole_w[ri] = masters(e, m->config());
    }
    train::DeferredModel dm = train::model_create_deferred(tc);
    train::ZeroEngine e(*dm.model, comm, stage3(0), nullptr, dm.fill);
    dm.fill = {};
    CHECK(dm.model->param_allocated_bytes() == 0);
    deferred_w[ri] = masters(e, dm.model->config());
  });
  for (const auto& err : errors) REQUIRE_MESSAGE(err.empty(), err);
  CHECK(!whole_w[0].empty());
  CHECK(deferred_w[0] == whole_w[0]);
  CHECK(deferred_w[1] == whole_w[1]);

  // config.json says 3 layers, the weights hold 2: the deferred build names the first
  // missing tensor before any engine exists.
  {
    std::ifstream in(d.path / "hf" / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["num_hidden_layers"] = 3;
    std::ofstream(d.path / "hf" / "config.json") << j.dump();
  }
  CHECK_THROWS_WITH_AS(train::model_create_deferred(tc), doctest::Contains("model.layers.2."), IoError);
}
