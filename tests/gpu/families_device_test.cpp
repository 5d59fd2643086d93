// The HF families on two devices: llama with llama3 RoPE, explicit head_dim, tied
// embeddings and attention/MLP biases; qwen2 (q/k/v biases); qwen3 (q/k norms, head_dim
// not d_model / n_head); mistral with a sliding window shorter than T. The same lib/model
// code on the CPU device and on a CUDA device (the execution engine in the EMU tree) gives
// the same loss and gradients in fp32 and with bf16 compute copies (the tensor-core
// attention, whose window masks whole tiles at T = 80 > 64), with recompute and LoRA on
// the biased projections. The fp32 figures against an independent reference are
// hf_family_parity_test's. Skips without a GPU.
#include "core/error.h"
#include "core/rng.h"
#include "device/device.h"
#include "model/model.h"

#include "gpu/gpu_skip.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace dtrain;
using model::ModelConfig;

namespace {

constexpr int B = 1, T = 80;

ModelConfig family(ModelConfig::Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 96;
  c.max_seq_len = T;
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_ff = 64;
  c.tie_embeddings = false;
  switch (arch) {
    case ModelConfig::Arch::LLAMA:
      c.head_size = 16;  // != 32 / 4
      c.tie_embeddings = true;
      c.qkv_bias = c.o_bias = c.mlp_bias = true;
      c.rope_theta = 500000.0f;
      c.rope_scaling = ModelConfig::RopeScaling::LLAMA3;
      c.rope_factor = 8.0f;
      c.rope_original_max_pos = 32;
      break;
    case ModelConfig::Arch::QWEN2:
      c.qkv_bias = true;
      c.tie_embeddings = true;
      break;
    case ModelConfig::Arch::QWEN3:
      c.qk_norm = true;
      c.head_size = 12;
      break;
    case ModelConfig::Arch::MISTRAL:
      c.sliding_window = 9;  // rows 72.. of the last 64-query tile see no key of tile 0
      break;
    default: break;
  }
  return c;
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

// Weights with every parameter mattering (biases and norms away from 0 and 1), rounded to
// bf16 when the CUDA copy is bf16 so both devices start from the same values.
void weights(model::Model& m, DType t) {
  m.init_weights(3);
  Rng r(17);
  for (auto* list : {&m.params(), &m.lora_params()})
    for (auto& pb : *list) {
      float* d = pb.host_f32();
      for (const auto& ts : pb.layout.tensors)
        if (!ts.decay || ts.name.find("lora_B") != std::string::npos)
          for (size_t i = 0; i < ts.numel(); ++i) d[ts.offset + i] += r.normal(0.0f, 0.1f);
      if (t != DType::F32)
        for (size_t i = 0; i < pb.size; ++i) d[i] = bf16_to_f32(f32_to_bf16(d[i]));
    }
}

void check(ModelConfig::Arch arch, DType t, bool lora, bool recompute) {
  const ModelConfig cfg = family(arch);
  model::Model cpu(cfg);
  if (lora) {
    model::LoraConfig lc;
    lc.rank = 4;
    lc.targets = model::lora_module_names(arch);
    cpu.lora_enable(lc);
  }
  weights(cpu, t);
  auto dev = device::cuda_create(0);
  model::Model gpu(cfg, *dev, t);
  gpu.weights_copy_from(cpu);
  gpu.set_recompute(recompute);
  const double tol = t == DType::F32 ? 1e-4 : 3e-2;
  Rng r(5);
  std::vector<int32_t> tok, tgt;
  for (int i = 0; i < B * T; ++i) {
    tok.push_back(static_cast<int32_t>(r.below(96)));
    tgt.push_back(static_cast<int32_t>(r.below(96)));
  }
  const float lc = cpu.forward(tok.data(), tgt.data(), B, T);
  cpu.backward();
  const float lg = gpu.forward(tok.data(), tgt.data(), B, T);
  gpu.backward();
  INFO("loss cpu " << lc << " cuda " << lg);
  CHECK(std::abs(lg - lc) <= tol * std::abs(lc));
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

TEST_CASE("HF families on two devices: loss and gradients match (fp32, bf16)") {
  SKIP_WITHOUT_GPU();
  for (auto arch :
       {ModelConfig::Arch::LLAMA, ModelConfig::Arch::QWEN2, ModelConfig::Arch::QWEN3, ModelConfig::Arch::MISTRAL})
    for (DType t : {DType::F32, DType::BF16}) {
      INFO(model::arch_name(arch) << " " << dtype_name(t));
      check(arch, t, false, false);
    }
}

TEST_CASE("HF families on two devices: recompute, and LoRA over biased projections") {
  SKIP_WITHOUT_GPU();
  check(ModelConfig::Arch::QWEN3, DType::F32, false, true);
  check(ModelConfig::Arch::MISTRAL, DType::BF16, false, true);
  check(ModelConfig::Arch::QWEN2, DType::F32, true, false);
  check(ModelConfig::Arch::LLAMA, DType::F32, true, true);
}
