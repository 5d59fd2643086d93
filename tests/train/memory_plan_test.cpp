// The per-rank memory plan (--dry-run) against the ZeRO engine's own accounting of the
// same model on 2 ranks (its theory, which the engine tests check against what it
// allocates), per stage, full and LoRA; stage 3's working buffers against the engine's meter
// over real steps; the machine check refuses with the numbers.
#include "zero_harness.h"
#include "core/error.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"
#include "train/zero_engine.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

using namespace dtrain;

namespace {

config::TrainConfig job(int stage, bool lora) {
  config::TrainConfig c;
  c.source = "job.yaml";
  c.model.architecture = "llama";
  c.model.vocab_size = 64;
  c.model.n_layer = 3;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.d_model = 32;
  c.model.d_ff = 48;
  c.model.max_seq_len = 16;
  c.data.seq_len = 16;
  c.resolved_micro_batch_size = 2;
  c.resolved_grad_accum_steps = 1;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every buffer sharded at stage 3
  if (lora) {
    c.lora.r = 4;
    c.lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  }
  return c;
}

}  // namespace

TEST_CASE("memory plan: the engine's own per-rank accounting, stages 0-3, full and LoRA") {
  for (bool lora : {false, true})
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(lora);
      CAPTURE(stage);
      const config::TrainConfig cfg = job(stage, lora);
      const train::MemoryPlan p = train::memory_plan(cfg, 2);
      std::vector<train::ZeroMemory> mem(2);
      size_t params = 0, trainable = 0, buffers = 0;
      const auto errors = zero_test::run_ranks(2, [&](comm::Communicator* comm, int r) {
        auto m = train::model_create(cfg);
        if (r == 0) {
          params = m->num_params();
          trainable = m->num_trainable_params();
          buffers = m->params().size() + m->lora_params().size();
        }
        train::ZeroEngine e(*m, comm, train::zero_options_from(cfg));
        mem[static_cast<size_t>(r)] = e.report().memory();
      });
      for (const auto& err : errors) REQUIRE_MESSAGE(err.empty(), err);
      CHECK(p.params == static_cast<double>(params));
      CHECK(p.trainable == static_cast<double>(trainable));
      CHECK(p.deferred == (stage == 3));
      // The engine divides each buffer by the world size in whole elements: a few bytes
      // per buffer apart at most.
      const double slack = 4.0 * 12 * static_cast<double>(buffers);
      const train::ZeroMemory& t = mem[0];
      CHECK(std::fabs(p.grad_bytes - static_cast<double>(t.theory_grad)) <= slack);
      CHECK(std::fabs(p.optim_bytes - static_cast<double>(t.theory_optim)) <= slack);
      CHECK(std::fabs(p.param_bytes - static_cast<double>(t.theory_param)) <= slack);
      CHECK(p.build_peak_bytes == 4 * p.largest_buffer);  // one buffer's fp32 values staged at a time
      // The step's working buffers (memory_plan.cpp's replay of the engine's schedule):
      // stage 3 gathers at least the largest layer, stages 1-2 all-gather the updated
      // shards, stages 2-3 hold a layer's gradient and a bucket, stages 0-1 a bucket
      // scratch; what the allocator holds is at least what is in use at once.
      // cli_memory_plan_rss_test holds them against real jobs.
      CHECK((p.gather_bytes > 0) == (stage >= 1));
      if (stage == 3) CHECK(p.gather_bytes >= 4 * p.largest_buffer);
      CHECK((p.layer_grad_bytes > 0) == (stage >= 2));
      CHECK(p.bucket_bytes > 0);
      CHECK(p.work_bytes >= p.work_live_bytes);
      CHECK(p.work_live_bytes >= std::max({p.gather_bytes, p.layer_grad_bytes, p.bucket_bytes}));
    }
}

TEST_CASE("memory plan: the stages shrink a rank's share; the machine check names the numbers") {
  std::vector<double> host;
  for (int stage = 0; stage <= 3; ++stage) {
    config::TrainConfig cfg = job(stage, false);
    cfg.model.d_model = 256;
    cfg.model.d_ff = 768;
    cfg.model.n_layer = 8;
    host.push_back(train::memory_plan(cfg, 4).state_bytes() - train::memory_plan(cfg, 4).activation_bytes);
  }
  CHECK(host[1] < host[0]);
  CHECK(host[2] < host[1]);
  CHECK(host[3] < host[2]);

  const train::MemoryPlan p = train::memory_plan(job(2, false), 2);
  const std::string text = train::memory_plan_text(p, 2, 1e9);
  CHECK(text.find("memory per rank (ZeRO stage 2, 2 rank(s)") != std::string::npos);
  CHECK(text.find("this machine: 2 rank(s)") != std::string::npos);
  CHECK_NOTHROW(train::memory_plan_check(p, 2, 2.0 * p.host_bytes() + 1, "job.yaml"));
  CHECK_NOTHROW(train::memory_plan_check(p, 0, 1.0, "job.yaml"));  // ranks elsewhere: not this machine's
  CHECK_THROWS_WITH_AS(train::memory_plan_check(p, 2, 2.0 * p.host_bytes() - 1, "job.yaml"),
                       doctest::Contains("job.yaml: the job needs"), ConfigError);
  CHECK_THROWS_WITH_AS(train::memory_plan_check(p, 2, 2.0 * p.host_bytes() - 1, "job.yaml"),
                       doctest::Contains("raise zero_optimization.stage"), ConfigError);
}

TEST_CASE("memory plan with ZeRO-Offload: the optimizer state and gradient shards move to the host, by the formula") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    config::TrainConfig cfg = job(stage, false);
    cfg.training.device = "cuda";
    cfg.bf16.enabled = true;
    const train::MemoryPlan on_gpu = train::memory_plan(cfg, 2);
    cfg.zero.offload_optimizer_device = "cpu";
    cfg.zero.offload_optimizer_pin_memory = true;
    const train::MemoryPlan off = train::memory_plan(cfg, 2);
    CHECK(off.offload_optimizer);
    const double psi = off.trainable, W = 2;
    // Host: master, m, v, gradient (16 B), the landing buffer at stages 2-3 (4 B) and the
    // bf16 copy back (2 B) per element of the shard; all pinned.
    CHECK(off.offload_bytes == doctest::Approx((16 + (stage >= 2 ? 4 : 0) + 2) * psi / W));
    CHECK(off.pinned_bytes == off.offload_bytes);
    CHECK(off.optim_bytes == 0);
    CHECK(off.grad_bytes == (stage == 1 ? 4 * psi : 0));
    // The device gives up K Psi / W of optimizer state (and the gradient shard at 2-3).
    CHECK(on_gpu.device_bytes() - off.device_bytes() ==
          doctest::Approx(on_gpu.optim_bytes + (stage >= 2 ? on_gpu.grad_bytes : 0) + on_gpu.param_bytes -
                          off.param_bytes));
    CHECK(off.host_bytes() > on_gpu.host_bytes());
    if (stage == 3) {
      cfg.zero.offload_param_device = "cpu";
      const train::MemoryPlan par = train::memory_plan(cfg, 2);
      CHECK(par.offload_param);
      CHECK(par.param_bytes < off.param_bytes);     // only the gathered layers stay
      CHECK(par.pinned_bytes == off.pinned_bytes);  // offload_param.pin_memory is off
    }
    // On CPU ranks offload changes nothing.
    cfg.training.device = "cpu";
    CHECK(!train::memory_plan(cfg, 2).offload_optimizer);
  }
}

TEST_CASE("memory plan: a GPU rank that does not fit its GPU is refused, naming offload as the way out") {
  config::TrainConfig cfg = job(2, false);
  cfg.training.device = "cuda";
  const train::MemoryPlan p = train::memory_plan(cfg, 2);
  try {
    train::memory_plan_check(p, 2, 1e12, "job.yaml", p.device_bytes() * 0.9);
    FAIL("a plan over the GPU's memory must be refused");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    CHECK(m.find("job.yaml") != std::string::npos);
    CHECK(m.find("device memory") != std::string::npos);
    CHECK(m.find("offload_optimizer.device: cpu") != std::string::npos);
  }
  CHECK_NOTHROW(train::memory_plan_check(p, 2, 1e12, "job.yaml", p.device_bytes() * 1.1));
  CHECK(train::memory_plan_text(p, 2, 1e12, p.device_bytes() * 0.9).find("does NOT fit") != std::string::npos);
  CHECK(train::memory_plan_text(p, 2, 1e12, p.device_bytes() * 1.1).find("per GPU: fits)") != std::string::npos);
  // A plan for another cluster's nodes (--plan-for): their host total, nothing of this machine.
  const std::string other = train::memory_plan_text(p, 0, 1e12, p.device_bytes() * 1.1, 8);
  CHECK(other.find("per node: 8 rank(s)") != std::string::npos);
  CHECK(other.find("this machine") == std::string::npos);
}

TEST_CASE("activation checkpointing left to the plan: none when it fits, else the fewest layers that do") {
  for (const char* device : {"cuda", "cpu"}) {
    CAPTURE(device);
    config::TrainConfig cfg = job(2, false);
    cfg.training.device = device;
    cfg.model.n_layer = 8;
    cfg.resolved_micro_batch_size = 64;  // activations a large share of a rank's bytes
    const bool cuda = std::string(device) == "cuda";
    auto need = [&](int k) {
      config::TrainConfig t = cfg;
      t.activation_checkpointing.layers = k;
      const train::MemoryPlan p = train::memory_plan(t, 2);
      CHECK(p.recompute_layers == k);
      return cuda ? p.device_bytes() : p.host_bytes();
    };
    // Each recomputed layer beyond the first saves one layer's activations.
    CHECK(need(1) == need(0));
    for (int k = 2; k <= 8; ++k) CHECK(need(k) < need(k - 1));
    // The capacity whose room (95 %, less 1 GiB on a GPU) holds exactly need(k).
    auto capacity = [&](double bytes) { return (bytes + (cuda ? 1024.0 * 1024 * 1024 : 0.0)) / 0.95 * 1.000001; };
    train::RecomputeChoice c;
    train::recompute_resolve(cfg, 2, capacity(need(0)), &c);
    CHECK(c.planned);
    CHECK(c.layers == 0);
    CHECK(c.why.find("none: a rank needs") != std::string::npos);
    for (int k : {2, 5, 8}) {
      CAPTURE(k);
      const config::TrainConfig r = train::recompute_resolve(cfg, 2, capacity(need(k)), &c);
      CHECK(c.layers == k);
      CHECK(r.activation_checkpointing.layers == std::optional<int64_t>(k));
      CHECK(c.why.find(std::to_string(k) + " of 8 layers") != std::string::npos);
      CHECK(train::memory_plan(r, 2).recompute_layers == k);
    }
    // Nothing fits: every layer, said so (the memory check then refuses the job).
    train::recompute_resolve(cfg, 2, capacity(need(8)) * 0.5, &c);
    CHECK(c.layers == 8);
    CHECK(c.why.find("does not fit even so") != std::string::npos);
    // Unknown capacity (ranks on other machines): none here, each rank decides.
    train::recompute_resolve(cfg, 2, 0, &c);
    CHECK(c.layers == 0);
    CHECK(c.why.find("not known here") != std::string::npos);
    // Given keys are kept whatever the capacity.
    config::TrainConfig on = cfg;
    on.activation_checkpointing.enabled = true;
    train::recompute_resolve(on, 2, 1e15, &c);
    CHECK(!c.planned);
    CHECK(c.layers == 8);
    config::TrainConfig off = cfg;
    off.activation_checkpointing.enabled = false;
    train::recompute_resolve(off, 2, 1.0, &c);
    CHECK(c.layers == 0);
    config::TrainConfig some = cfg;
    some.activation_checkpointing.layers = 3;
    train::recompute_resolve(some, 2, 1.0, &c);
    CHECK(c.layers == 3);
    CHECK(train::memory_plan_text(train::memory_plan(train::recompute_resolve(some, 2, 1.0), 2), 2, 1e12)
              .find("(3 of 8 layers recomputed)") != std::string::npos);
    some.activation_checkpointing.layers = 9;
    CHECK_THROWS_WITH_AS(train::memory_plan(some, 2), doctest::Contains("activation_checkpointing.layers: 9"),
                         ConfigError);
  }
}

// The config.json files examples/ plans with (tests/data/hf_configs, written from the
// published checkpoints): the plan's parameter count from each is the checkpoint's own,
// its model.safetensors.index.json total_size over 2 bytes (bf16), so a wrong width, layer
// count, vocabulary, bias or tie in those files fails here.
TEST_CASE("memory plan: the published 7-8B config.json files give their checkpoints' parameter counts") {
  const char* src = std::getenv("DTRAIN_SOURCE_DIR");
  const std::string root = src && *src ? src : ".";
  const struct {
    const char* dir;
    double params;
  } models[] = {{"llama3.1-8b", 8030261248.0},  // Llama-3.1-8B-Instruct: total_size 16060522496
                {"qwen2.5-7b", 7615616512.0},   // Qwen2.5-7B-Instruct: 15231233024
                {"qwen3-8b", 8190735360.0},     // Qwen3-8B: 16381470720
                {"mistral-7b", 7248023552.0}};  // Mistral-7B-Instruct-v0.3: 14496047104
  for (const auto& m : models) {
    CAPTURE(m.dir);
    config::TrainConfig c;
    c.source = "job.yaml";
    c.model.init_from = root + "/tests/data/hf_configs/" + m.dir;
    c.data.seq_len = 2048;
    c.resolved_micro_batch_size = 1;
    c.resolved_grad_accum_steps = 1;
    c.training.device = "cuda";
    c.bf16.enabled = true;
    c.zero.stage = 3;
    const train::MemoryPlan p = train::memory_plan(c, 8);
    CHECK(p.params == m.params);
    CHECK(p.trainable == m.params);
  }
}

TEST_CASE("memory plan: stage 3's working buffers as the engine meters them, the post-update all-gather included") {
  // Stage 3 keeps the trainable buffers under stage3_param_persistence_threshold whole and
  // all-gathers their updated shards back after each update (zero_post_update_gathers), as
  // stages 1-2 do for every trainable buffer. With small gradient buckets that all-gather
  // is the step's largest working buffer; the plan counted it at stages 1-2 only. Truth: the
  // engine's own meter of its working buffers over a real step (ZeroMemory::work_peak_bytes).
  struct Case {
    const char* what;
    bool lora;
    int resident;  // 0: the adapters (LoRA); 1: every buffer; 2: the buffers below the median
  };
  for (const Case c : {Case{"every buffer resident", false, 1}, Case{"some buffers resident", false, 2},
                       Case{"LoRA: the adapters resident, the base sharded", true, 0}}) {
    CAPTURE(c.what);
    config::TrainConfig cfg = job(3, c.lora);
    cfg.zero.reduce_bucket_size = 500;
    std::vector<size_t> base, adapters;
    {
      auto m = train::model_create(cfg);
      for (const auto& pb : m->params()) base.push_back(pb.size);
      for (const auto& pb : m->lora_params()) adapters.push_back(pb.size);
    }
    std::vector<size_t> all = base;
    all.insert(all.end(), adapters.begin(), adapters.end());
    std::sort(all.begin(), all.end());
    size_t threshold = 0;
    if (c.resident == 0) {
      threshold = *std::max_element(adapters.begin(), adapters.end()) + 1;
      REQUIRE(*std::min_element(base.begin(), base.end()) >= threshold);
    } else {
      threshold = c.resident == 1 ? all.back() + 1 : all[all.size() / 2];
    }
    cfg.zero.stage3_param_persistence_threshold = static_cast<int64_t>(threshold);
    const train::MemoryPlan p = train::memory_plan(cfg, 2);
    std::vector<train::ZeroMemory> mem(2);
    const auto errors = zero_test::run_ranks(2, [&](comm::Communicator* comm, int r) {
      auto m = train::model_create(cfg);
      train::ZeroEngine e(*m, comm, train::zero_options_from(cfg));
      const int B = static_cast<int>(cfg.resolved_micro_batch_size), T = static_cast<int>(*cfg.data.seq_len);
      std::vector<int32_t> tok, tgt;
      for (int step = 1; step <= 2; ++step) {
        zero_test::batch_rows(step, r * B, B, T, m->config().vocab_size, tok, tgt);
        e.before_step();
        m->forward(tok.data(), tgt.data(), B, T);
        m->backward(1.0f);
        e.step_prepare(1e-3f);
        e.step_issue(1.0f);
        if (!e.step_finish(1.0f)) throw std::runtime_error("step " + std::to_string(step) + " skipped");
      }
      mem[static_cast<size_t>(r)] = e.report().memory();
    });
    for (const auto& err : errors) REQUIRE_MESSAGE(err.empty(), err);
    const double metered = static_cast<double>(mem[0].work_peak_bytes);
    INFO("plan: at most " << p.work_live_bytes << " bytes of working buffers in use at once (gathered "
                          << p.gather_bytes << "); the engine's meter: " << metered);
    CHECK(metered > 0);
    // The plan rounds each block to 64 bytes: an upper bound, a few blocks above the meter.
    CHECK(p.work_live_bytes >= metered);
    CHECK(p.work_live_bytes <= metered + 64.0 * static_cast<double>(all.size()));
  }
}
