// GpuTrainer against the CPU model and the CPU trainer's step math on tiny GPT-2 and
// Llama configs: loss and gradients (fp32, bf16; LoRA; ignore-index masking), whole
// optimizer steps with accumulation and clipping, and fp16 dynamic loss scaling against
// bf16. Every device test skips without a GPU; the factory's DeviceError (CPU-only
// build, or no device visible) is checked wherever there is no GPU.
#include "core/error.h"
#include "core/rng.h"
#include "device/device.h"
#include "gpu/gpu_model.h"
#include "ops/optim.h"
#include "train/grad_clip.h"

#include "gpu/gpu_skip.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace dtrain;
using model::ModelConfig;

namespace {

constexpr int B = 2, T = 16;

ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.arch = ModelConfig::Arch::GPT2;
  c.vocab_size = 96;
  c.max_seq_len = 32;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.d_ff = 128;
  c.tie_embeddings = true;
  return c;
}

ModelConfig tiny_llama() {
  ModelConfig c;
  c.arch = ModelConfig::Arch::LLAMA;
  c.vocab_size = 96;
  c.max_seq_len = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;  // GQA
  c.d_model = 32;
  c.d_ff = 64;
  c.tie_embeddings = false;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

// accum micro-batches of [B, T]; every 5th target is masked (SFT-style ignore index).
Batch make_batch(int V, int accum, uint64_t seed) {
  Rng r(seed);
  Batch b;
  for (int i = 0; i < accum * B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(V)));
    b.targets.push_back(i % 5 == 3 ? -100 : static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(V)));
  }
  return b;
}

// max|got - ref| / max|ref| (inf when shapes or finiteness differ).
double max_err(const float* got, const float* ref, size_t n) {
  double e = 0, m = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = std::max(e, std::abs(static_cast<double>(got[i]) - ref[i]));
    m = std::max(m, std::abs(static_cast<double>(ref[i])));
  }
  return e / std::max(m, 1e-30);
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// The CPU trainer's rounding of the compute copy: the reference sees the weights the
// device computes with.
void round_weights(model::Model& m, DType t) {
  if (t == DType::F32) return;
  for (auto* list : {&m.params(), &m.lora_params()})
    for (auto& pb : *list)
      for (size_t i = 0; i < pb.size; ++i)
        pb.host_f32()[i] = t == DType::BF16 ? bf16_to_f32(f32_to_bf16(pb.host_f32()[i])) : f16_to_f32(f32_to_f16(pb.host_f32()[i]));
}

// LoRA B starts at zero (dA would be zero too): give it values so every path is tested.
void lora_randomize_b(model::Model& m) {
  Rng r(99);
  for (auto& pb : m.lora_params())
    for (const auto& t : pb.layout.tensors)
      if (t.name.find("lora_B") != std::string::npos)
        for (size_t i = 0; i < t.numel(); ++i) pb.host_f32()[t.offset + i] = r.normal(0.0f, 0.05f);
}

gpu::GpuTrainOptions options(DType compute, int accum = 1) {
  gpu::GpuTrainOptions o;
  o.micro_batch = B;
  o.seq_len = T;
  o.grad_accum = accum;
  o.compute = compute;
  return o;
}

// One micro-batch: GPU loss and gradients vs the CPU model's.
void check_gradients(model::Model& m, DType compute, double loss_tol, double grad_tol) {
  round_weights(m, compute);
  auto g = gpu::gpu_trainer_create(m, options(compute));
  const Batch b = make_batch(m.config().vocab_size, 1, 5);
  m.zero_grad();
  const float cpu_loss = m.forward(b.tokens.data(), b.targets.data(), B, T);
  m.backward(1.0f);
  g->zero_grad();
  const float gpu_loss = g->forward_backward(b.tokens.data(), b.targets.data(), 1.0f);
  CHECK(rel(gpu_loss, cpu_loss) <= loss_tol);
  const auto grads = g->grads_to_host();
  auto& ref = m.trainable_params();
  REQUIRE(grads.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(grads[i].size() == ref[i].size);
    const double e = max_err(grads[i].data(), ref[i].grad, ref[i].size);
    INFO("buffer " << ref[i].layout.name << " (" << dtype_name(compute) << ") error " << e);
    CHECK(e <= grad_tol);
  }
}

// The CPU trainer's stage-0 fp32 step, written out: token-weighted micro-batches,
// global-norm clip, AdamW per tensor.
struct CpuStepper {
  model::Model& m;
  ops::AdamWConfig acfg;
  float max_norm = 0.0f;
  std::vector<std::vector<float>> mo, vo;
  int64_t steps = 0;

  gpu::GpuStepResult step(const Batch& b, int accum, float lr) {
    auto& bufs = m.trainable_params();
    if (mo.empty())
      for (auto& pb : bufs) {
        mo.emplace_back(pb.size, 0.0f);
        vo.emplace_back(pb.size, 0.0f);
      }
    const size_t n = static_cast<size_t>(B) * T;
    std::vector<int64_t> counts(static_cast<size_t>(accum), 0);
    int64_t total = 0;
    for (int a = 0; a < accum; ++a)
      for (size_t i = 0; i < n; ++i) counts[static_cast<size_t>(a)] += b.targets[a * n + i] != -100;
    for (auto c : counts) total += c;
    m.zero_grad();
    double loss_sum = 0.0;
    for (int a = 0; a < accum; ++a) {
      const int64_t c = counts[static_cast<size_t>(a)];
      if (c == 0) continue;
      loss_sum += static_cast<double>(m.forward(b.tokens.data() + a * n, b.targets.data() + a * n, B, T)) * c;
      m.backward(static_cast<float>(static_cast<double>(c) / static_cast<double>(total)));
    }
    gpu::GpuStepResult r;
    r.loss = loss_sum / static_cast<double>(total);
    double sq = 0.0;
    for (auto& pb : bufs) sq += ops::grad_norm_sq(pb.grad, pb.size);
    r.grad_norm = std::sqrt(sq);
    const float coef = train::clip_coefficient(r.grad_norm, max_norm);
    ++steps;
    for (size_t k = 0; k < bufs.size(); ++k)
      for (const auto& t : bufs[k].layout.tensors)
        ops::adamw_step(bufs[k].host_f32() + t.offset, bufs[k].grad + t.offset, mo[k].data() + t.offset,
                          vo[k].data() + t.offset, t.numel(), acfg, lr, steps, t.decay, coef);
    return r;
  }
};

}  // namespace

// ----------------------------------------------------------------------------
TEST_CASE("gpu trainer: clear DeviceError without CUDA or without a device") {
  if (device::cuda_count() > 0) return;  // covered by the device tests below
  model::Model m(tiny_gpt2());
  m.init_weights(1);
  try {
    (void)gpu::gpu_trainer_create(m, options(DType::BF16));
    FAIL("gpu_trainer_create must throw without a device");
  } catch (const DeviceError& e) {
    const std::string what = e.what();
#ifdef DTRAIN_HAVE_CUDA
    CHECK(what.find("no CUDA device") != std::string::npos);
#else
    CHECK(what.find("built without CUDA") != std::string::npos);
#endif
    CHECK(e.exit_code() == 8);
  }
}

TEST_CASE("gpu trainer: GPT-2 loss and gradients match the CPU model (fp32, bf16)") {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::F32, DType::BF16}) {
    model::Model m(tiny_gpt2());
    m.init_weights(3);
    check_gradients(m, t, t == DType::F32 ? 1e-4 : 2e-2, t == DType::F32 ? 1e-4 : 3e-2);
  }
}

TEST_CASE("gpu trainer: Llama (GQA, untied head) loss and gradients match the CPU model (fp32, bf16)") {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::F32, DType::BF16}) {
    model::Model m(tiny_llama());
    m.init_weights(4);
    check_gradients(m, t, t == DType::F32 ? 1e-4 : 2e-2, t == DType::F32 ? 1e-4 : 3e-2);
  }
}

TEST_CASE("gpu trainer: LoRA adapter gradients match the CPU model (GPT-2 and Llama, all targets)") {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::F32, DType::BF16})
    for (const ModelConfig& cfg : {tiny_gpt2(), tiny_llama()}) {
      model::Model m(cfg);
      m.init_weights(5);
      model::LoraConfig lc;
      lc.rank = 4;
      lc.alpha = 8.0f;
      lc.targets = model::lora_module_names(cfg.arch);
      lc.seed = 11;
      m.lora_enable(lc);
      lora_randomize_b(m);
      check_gradients(m, t, t == DType::F32 ? 1e-4 : 2e-2, t == DType::F32 ? 1e-4 : 3e-2);
    }
}

TEST_CASE("gpu trainer: optimizer steps match the CPU trainer's math (accumulation, clipping, AdamW)") {
  SKIP_WITHOUT_GPU();
  for (const ModelConfig& cfg : {tiny_gpt2(), tiny_llama()}) {
    model::Model cpu(cfg), out(cfg);
    cpu.init_weights(6);
    gpu::GpuTrainOptions o = options(DType::F32, 2);
    o.adamw.weight_decay = 0.1f;
    o.max_grad_norm = 0.5f;  // small enough to clip
    auto g = gpu::gpu_trainer_create(cpu, o);
    CpuStepper ref{cpu, o.adamw, o.max_grad_norm, {}, {}, 0};
    const float lr = 1e-3f;
    for (int s = 0; s < 3; ++s) {
      const Batch b = make_batch(cfg.vocab_size, 2, 100 + s);
      const auto want = ref.step(b, 2, lr);
      const auto got = g->step(b.tokens.data(), b.targets.data(), 2, lr);
      INFO("step " << s << " loss " << got.loss << " vs " << want.loss);
      CHECK(rel(got.loss, want.loss) <= 1e-4);
      CHECK(rel(got.grad_norm, want.grad_norm) <= 1e-4);
      CHECK(got.targets == std::count_if(b.targets.begin(), b.targets.end(), [](int32_t x) { return x != -100; }));
      CHECK_FALSE(got.skipped);
    }
    CHECK(g->applied_steps() == 3);
    g->weights_to_model(out);
    for (size_t k = 0; k < cpu.params().size(); ++k) {
      const auto& a = out.params()[k];
      const auto& r = cpu.params()[k];
      double worst = 0.0;
      for (size_t i = 0; i < a.size; ++i) worst = std::max(worst, std::abs(static_cast<double>(a.host_f32()[i]) - r.host_f32()[i]));
      INFO("buffer " << r.layout.name << " max |dw| " << worst);
      CHECK(worst <= 2.0 * lr);  // an element whose gradient is ~0 may step differently
    }
  }
}

TEST_CASE("gpu trainer: fp16 dynamic loss scaling trains to a loss close to bf16's") {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_gpt2();
  const Batch b = make_batch(cfg.vocab_size, 1, 77);
  auto run = [&](DType t, std::vector<gpu::GpuStepResult>& log) {
    model::Model m(cfg);
    m.init_weights(8);
    gpu::GpuTrainOptions o = options(t);
    o.max_grad_norm = 1.0f;
    o.loss_scaler.initial_scale_power = 24;  // starts too high: the scaler must back off
    o.loss_scaler.loss_scale_window = 10;
    auto g = gpu::gpu_trainer_create(m, o);
    for (int s = 0; s < 60; ++s) log.push_back(g->step(b.tokens.data(), b.targets.data(), 1, 3e-3f));
  };
  std::vector<gpu::GpuStepResult> l16, lbf;
  run(DType::F16, l16);
  run(DType::BF16, lbf);
  // Compare at equal numbers of applied updates: fp16's last step ran after `applied`
  // updates, bf16's step `applied` too.
  int skipped = 0;
  for (size_t s = 0; s + 1 < l16.size(); ++s) skipped += l16[s].skipped;
  const size_t applied = l16.size() - 1 - static_cast<size_t>(skipped);
  const double f16 = l16.back().loss, bf = lbf[applied].loss;
  MESSAGE("fp16 loss " << f16 << " after " << applied << " updates; bf16 " << bf << " (first " << lbf.front().loss << ")");
  CHECK(bf < 0.85 * lbf.front().loss);  // it learned the batch
  CHECK(std::abs(f16 - bf) <= 0.1 * bf + 0.05);
  CHECK(skipped >= 1);                         // 2^24 overflowed at least once
  CHECK(l16.back().loss_scale < 16777216.0f);  // and the scale came down
  for (const auto& r : lbf) CHECK_FALSE(r.skipped);
}

TEST_CASE("gpu trainer: bad tokens and batch sizes are rejected on the host") {
  SKIP_WITHOUT_GPU();
  model::Model m(tiny_gpt2());
  m.init_weights(9);
  auto g = gpu::gpu_trainer_create(m, options(DType::BF16));
  Batch b = make_batch(96, 1, 3);
  b.tokens[7] = 96;
  CHECK_THROWS_AS(g->step(b.tokens.data(), b.targets.data(), 1, 1e-3f), UsageError);
  b = make_batch(96, 2, 3);
  CHECK_THROWS_AS(g->step(b.tokens.data(), b.targets.data(), 2, 1e-3f), UsageError);  // arena sized for accum 1
  gpu::GpuTrainOptions o = options(DType::BF16);
  o.seq_len = 64;  // > max_seq_len
  CHECK_THROWS_AS(gpu::gpu_trainer_create(m, o), ConfigError);
}
