// The one model on two devices: the same lib/model code run on the CPU device and on a
// CUDA device (the execution engine in the EMU tree) gives the same loss and gradients:
// GPT-2 and Llama (GQA, RoPE, SwiGLU), fp32 and bf16 compute copies, LoRA with dropout
// (the counter-based masks are the same on both devices), SFT masking and recompute.
// Skips without a GPU.
#include "core/error.h"
#include "core/rng.h"
#include "device/device.h"
#include "model/model.h"

#include "gpu/gpu_skip.h"
#include "gpu/tiny_model.h"

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

ModelConfig tiny(ModelConfig::Arch arch) { return test::tiny_model(arch, 32); }

struct Batch {
  std::vector<int32_t> tokens, targets;
};

// Every 5th target masked (SFT-style), or all of them.
Batch make_batch(int V, uint64_t seed, bool all_masked = false) {
  Rng r(seed);
  Batch b;
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(V)));
    const bool masked = all_masked || i % 5 == 3;
    b.targets.push_back(masked ? -100 : static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(V)));
  }
  return b;
}

// max|got - ref| / max|ref|; inf when got is not finite.
double max_err(const std::vector<float>& got, const float* ref) {
  double e = 0, m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = std::max(e, std::abs(static_cast<double>(got[i]) - ref[i]));
    m = std::max(m, std::abs(static_cast<double>(ref[i])));
  }
  return e / std::max(m, 1e-30);
}

void round_to(model::Model& m, DType t) {
  if (t == DType::F32) return;
  for (auto* list : {&m.params(), &m.lora_params()})
    for (auto& pb : *list) {
      float* d = pb.host_f32();
      for (size_t i = 0; i < pb.size; ++i) d[i] = bf16_to_f32(f32_to_bf16(d[i]));
    }
}

void lora_on(model::Model& m, float dropout) {
  model::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8.0f;
  lc.dropout = dropout;
  lc.targets = model::lora_module_names(m.config().arch);
  lc.seed = 11;
  m.lora_enable(lc);
  Rng r(99);  // B starts at zero: give it values so dA and dx see it
  for (auto& pb : m.lora_params())
    for (const auto& t : pb.layout.tensors)
      if (t.name.find("lora_B") != std::string::npos)
        for (size_t i = 0; i < t.numel(); ++i) pb.host_f32()[t.offset + i] = r.normal(0.0f, 0.05f);
}

struct Case {
  ModelConfig::Arch arch;
  DType dtype;
  float lora_dropout;  // < 0: no LoRA
  bool recompute;
  bool packed = false;  // rows of packed documents kept apart (doc_start)
};

// Document starts of rows of T = 16: documents of 5, 1 and 10 tokens, then 7 and 9.
std::vector<int32_t> packed_starts() {
  std::vector<int32_t> ds;
  for (const auto& lens : {std::vector<int>{5, 1, 10}, std::vector<int>{7, 9}}) {
    int start = 0;
    for (int len : lens) {
      ds.insert(ds.end(), static_cast<size_t>(len), start);
      start += len;
    }
  }
  return ds;
}

// Two forward/backward passes (the second accumulates): loss and gradients vs the CPU.
void check_case(const Case& c) {
  const ModelConfig cfg = tiny(c.arch);
  model::Model cpu(cfg);
  cpu.init_weights(3);
  if (c.lora_dropout >= 0.0f) lora_on(cpu, c.lora_dropout);
  round_to(cpu, c.dtype);
  auto dev = device::cuda_create(0);
  model::Model gpu(cfg, *dev, c.dtype);
  gpu.weights_copy_from(cpu);
  gpu.set_recompute(c.recompute);
  CHECK(gpu.lora_on() == cpu.lora_on());
  const double tol = c.dtype == DType::F32 ? 1e-4 : 3e-2;
  const std::vector<int32_t> starts = packed_starts();
  const int32_t* ds = c.packed ? starts.data() : nullptr;
  for (uint64_t seed : {5u, 6u}) {
    const Batch b = make_batch(cfg.vocab_size, seed);
    const float lc = cpu.forward(b.tokens.data(), b.targets.data(), B, T, nullptr, ds);
    cpu.backward(0.5f);
    const float lg = gpu.forward(b.tokens.data(), b.targets.data(), B, T, nullptr, ds);
    gpu.backward(0.5f);
    INFO("loss cpu " << lc << " cuda " << lg);
    CHECK(std::abs(lg - lc) <= tol * std::abs(lc));
  }
  CHECK(gpu.num_targets() == cpu.num_targets());
  auto& ref = cpu.trainable_params();
  auto& got = gpu.trainable_params();
  REQUIRE(ref.size() == got.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    std::vector<float> g(got[i].size);
    dev->copy_d2h(g.data(), got[i].grad, g.size() * sizeof(float));
    const double e = max_err(g, ref[i].grad);
    INFO("buffer " << ref[i].layout.name << " error " << e);
    CHECK(e <= tol);
  }
}

}  // namespace

TEST_CASE("one model, two devices: GPT-2 and Llama loss and gradients match (fp32, bf16)") {
  SKIP_WITHOUT_GPU();
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA})
    for (DType t : {DType::F32, DType::BF16}) {
      INFO(model::arch_name(arch) << " " << dtype_name(t));
      check_case({arch, t, -1.0f, false});
    }
}

TEST_CASE("one model, two devices: packed documents kept apart (attention, RoPE, learned positions) match") {
  SKIP_WITHOUT_GPU();
  // GPT-2's learned positions and Llama's RoPE restart per document; the attention kernels
  // (CUDA-core fp32, tensor-core bf16) skip and mask other documents' keys. The CPU side
  // is itself checked against each document run alone (model_test).
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA})
    for (DType t : {DType::F32, DType::BF16}) {
      INFO(model::arch_name(arch) << " " << dtype_name(t));
      check_case({arch, t, -1.0f, false, true});
    }
  check_case({ModelConfig::Arch::LLAMA, DType::BF16, -1.0f, true, true});  // recomputed layers see the starts too
}

TEST_CASE("one model, two devices: LoRA with dropout draws the same masks; recompute on CUDA") {
  SKIP_WITHOUT_GPU();
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA}) {
    INFO(model::arch_name(arch));
    check_case({arch, DType::F32, 0.25f, false});
    check_case({arch, DType::F32, 0.25f, true});
    check_case({arch, DType::BF16, 0.0f, true});
  }
}

TEST_CASE("one model, two devices: recompute of some or all layers gives the gradients of keeping every activation") {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny(ModelConfig::Arch::LLAMA);
  REQUIRE(cfg.n_layer == 2);  // 0, 1 (the second layer recomputed, the first kept) and 2 layers
  model::Model cpu(cfg);
  cpu.init_weights(7);
  auto dev = device::cuda_create(0);
  std::vector<std::vector<float>> grads[3];
  for (int rc = 0; rc < 3; ++rc) {
    model::Model m(cfg, *dev, DType::BF16);
    m.weights_copy_from(cpu);
    m.set_recompute_layers(rc);
    const Batch b = make_batch(cfg.vocab_size, 8);
    m.forward(b.tokens.data(), b.targets.data(), B, T);
    m.backward(1.0f);
    for (auto& pb : m.trainable_params()) {
      grads[rc].emplace_back(pb.size);
      dev->copy_d2h(grads[rc].back().data(), pb.grad, pb.size * sizeof(float));
    }
  }
  for (int rc = 1; rc < 3; ++rc) {
    CAPTURE(rc);
    REQUIRE(grads[0].size() == grads[rc].size());
    for (size_t i = 0; i < grads[0].size(); ++i) CHECK(max_err(grads[rc][i], grads[0][i].data()) <= 1e-6);
  }
}

TEST_CASE("backward_fuse: the loss pass's gradient gives the separate backward's loss and gradients bit for bit") {
  SKIP_WITHOUT_GPU();
  auto dev = device::cuda_create(0);
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA})
    for (DType t : {DType::F32, DType::BF16})
      for (bool on_cpu : {false, true}) {
        if (on_cpu && t != DType::F32) continue;
        INFO(model::arch_name(arch) << " " << dtype_name(t) << (on_cpu ? " cpu" : " cuda"));
        const ModelConfig cfg = tiny(arch);
        model::Model src(cfg);
        src.init_weights(13);
        device::Device& d = on_cpu ? device::cpu() : *dev;
        std::vector<std::vector<float>> grads[2];
        float losses[2][2] = {};
        for (int fused = 0; fused < 2; ++fused) {
          model::Model m(cfg, d, t);
          m.weights_copy_from(src);
          for (uint64_t seed : {21u, 22u}) {  // the second backward accumulates
            const Batch b = make_batch(cfg.vocab_size, seed);
            if (fused) m.backward_fuse(0.75f);
            losses[fused][seed - 21] = m.forward(b.tokens.data(), b.targets.data(), B, T);
            m.backward(0.75f);
          }
          for (auto& pb : m.trainable_params()) {
            grads[fused].emplace_back(pb.size);
            d.copy_d2h(grads[fused].back().data(), pb.grad, pb.size * sizeof(float));
          }
          // A backward with another scale than the fused forward's is refused.
          const Batch b = make_batch(cfg.vocab_size, 23);
          m.backward_fuse(0.75f);
          m.forward(b.tokens.data(), b.targets.data(), B, T);
          if (fused) CHECK_THROWS_AS(m.backward(0.5f), UsageError);
        }
        CHECK(losses[0][0] == losses[1][0]);
        CHECK(losses[0][1] == losses[1][1]);
        REQUIRE(grads[0].size() == grads[1].size());
        for (size_t i = 0; i < grads[0].size(); ++i) CHECK(grads[1][i] == grads[0][i]);
      }
}

TEST_CASE("one model, two devices: an all-masked batch has loss 0 and no gradient on CUDA") {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny(ModelConfig::Arch::GPT2);
  model::Model cpu(cfg);
  cpu.init_weights(9);
  auto dev = device::cuda_create(0);
  model::Model gpu(cfg, *dev, DType::BF16);
  gpu.weights_copy_from(cpu);
  const Batch b = make_batch(cfg.vocab_size, 10, true);
  CHECK(gpu.forward(b.tokens.data(), b.targets.data(), B, T) == 0.0f);
  gpu.backward(1.0f);
  for (auto& pb : gpu.trainable_params()) {
    std::vector<float> g(pb.size);
    dev->copy_d2h(g.data(), pb.grad, g.size() * sizeof(float));
    CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; }));
  }
}

TEST_CASE("one model, two devices: host-only calls and bad inputs are refused clearly") {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny(ModelConfig::Arch::GPT2);
  CHECK_THROWS_AS(model::Model(cfg, device::cpu(), DType::BF16), UsageError);
  auto dev = device::cuda_create(0);
  model::Model gpu(cfg, *dev, DType::BF16);
  gpu.init_weights(1);
  CHECK_THROWS_AS(gpu.tensor("transformer.wte.weight"), UsageError);
  CHECK_THROWS_AS(gpu.params()[0].host_f32(), UsageError);
  Batch b = make_batch(cfg.vocab_size, 2);
  b.tokens[3] = cfg.vocab_size;  // outside the vocabulary: refused on the host
  CHECK_THROWS_AS(gpu.forward(b.tokens.data(), b.targets.data(), B, T), UsageError);
  CHECK_THROWS_AS(device::cuda_create(99), DeviceError);
  // The same seed gives the same weights on either device (drawn on the host).
  model::Model cpu(cfg);
  cpu.init_weights(1);
  for (size_t i = 0; i < cpu.params().size(); ++i) {
    const std::vector<float> w = gpu.buffer_to_host(i);
    const float* r = cpu.params()[i].host_f32();
    size_t off = 0;
    for (size_t k = 0; k < w.size(); ++k) off += w[k] != bf16_to_f32(f32_to_bf16(r[k]));
    CHECK(off == 0);
  }
}

TEST_CASE("logits_to_host: a device model's logits (padded rows dropped, bf16 widened) match the CPU's") {
  SKIP_WITHOUT_GPU();
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA})
    for (DType t : {DType::F32, DType::BF16}) {
      INFO(model::arch_name(arch) << " " << dtype_name(t));
      // A vocabulary that is not a multiple of the device's row padding.
      ModelConfig cfg = tiny(arch);
      cfg.vocab_size = 37;
      model::Model cpu(cfg);
      cpu.init_weights(4);
      round_to(cpu, t);
      auto dev = device::cuda_create(0);
      model::Model gpu(cfg, *dev, t);
      gpu.weights_copy_from(cpu);
      const Batch b = make_batch(cfg.vocab_size, 8);
      cpu.forward(b.tokens.data(), nullptr, B, T);
      gpu.forward(b.tokens.data(), nullptr, B, T);
      const std::vector<float> host = cpu.logits_to_host();
      REQUIRE(host.size() == static_cast<size_t>(B) * T * cfg.vocab_size);
      CHECK(std::equal(host.begin(), host.end(), cpu.logits()));  // the CPU: the same values
      const std::vector<float> got = gpu.logits_to_host();
      REQUIRE(got.size() == host.size());
      CHECK(max_err(got, host.data()) <= (t == DType::F32 ? 1e-4 : 3e-2));
    }
}
