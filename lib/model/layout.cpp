// Builds the HF-named parameter layout for GPT-2 and the Llama family.
#include "model/layout.h"

#include "core/check.h"
#include "core/tensor.h"

#include <initializer_list>
#include <utility>

namespace dtrain::model {

size_t TensorSpec::numel() const { return static_cast<size_t>(shape_numel(shape)); }

float* ParamBuffer::host_f32() const {
  DT_ENFORCE(on_host && dtype == DType::F32, UsageError,
             "parameter buffer {} is {} {} memory; this code reads host fp32 weights (copy the model to the CPU "
             "first)",
             layout.name, on_host ? "host" : "device", dtype_name(dtype));
  return static_cast<float*>(data);
}

float* ParamBuffer::host_grad() const {
  DT_ENFORCE(on_host, UsageError, "gradient buffer {} is device memory; this code reads host gradients", layout.name);
  return grad;
}

const TensorSpec* BufferLayout::find(const std::string& n) const {
  for (const auto& t : tensors)
    if (t.name == n) return &t;
  return nullptr;
}

std::string layer_prefix(const ModelConfig& cfg, int layer) {
  return (cfg.arch == ModelConfig::Arch::GPT2 ? "transformer.h." : "model.layers.") + std::to_string(layer);
}

namespace {
void add(BufferLayout& b, std::string name, std::vector<int64_t> shape, bool decay, bool transposed = false) {
  TensorSpec t{std::move(name), b.size, std::move(shape), decay, transposed};
  b.size += t.numel();
  b.tensors.push_back(std::move(t));
}
}  // namespace

std::vector<BufferLayout> layout_build(const ModelConfig& cfg) {
  cfg.validate();
  const int64_t C = cfg.d_model, V = cfg.vocab_size, F = cfg.d_ff, HD = cfg.head_dim();
  const int64_t QD = cfg.n_head * HD, KD = cfg.n_kv_head * HD;
  const bool gpt2 = cfg.arch == ModelConfig::Arch::GPT2;
  std::vector<BufferLayout> out;

  BufferLayout emb{"embeddings", -1, {}, 0};
  if (gpt2) {
    add(emb, "transformer.wte.weight", {V, C}, true);
    add(emb, "transformer.wpe.weight", {cfg.max_seq_len, C}, true);
  } else {
    add(emb, "model.embed_tokens.weight", {V, C}, true);
  }
  out.push_back(std::move(emb));

  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = layer_prefix(cfg, l) + ".";
    BufferLayout b{"layers." + std::to_string(l), l, {}, 0};
    if (gpt2) {
      add(b, p + "ln_1.weight", {C}, false);
      add(b, p + "ln_1.bias", {C}, false);
      add(b, p + "attn.c_attn.weight", {QD + 2 * KD, C}, true, true);
      add(b, p + "attn.c_attn.bias", {QD + 2 * KD}, false);
      add(b, p + "attn.c_proj.weight", {C, QD}, true, true);
      add(b, p + "attn.c_proj.bias", {C}, false);
      add(b, p + "ln_2.weight", {C}, false);
      add(b, p + "ln_2.bias", {C}, false);
      add(b, p + "mlp.c_fc.weight", {F, C}, true, true);
      add(b, p + "mlp.c_fc.bias", {F}, false);
      add(b, p + "mlp.c_proj.weight", {C, F}, true, true);
      add(b, p + "mlp.c_proj.bias", {C}, false);
    } else {
      // HF's module order, except that the weights of q/k/v and of gate/up lie back to back
      // with their biases after them: each group is then one [sum of outputs, C] matrix (and
      // one bias vector) that a fused projection reads in one GEMM. Biases and q/k norms only
      // where the family has them.
      auto group = [&](std::initializer_list<std::pair<const char*, int64_t>> ms, int64_t in, bool bias) {
        for (const auto& [m, out] : ms) add(b, p + m + ".weight", {out, in}, true);
        if (bias)
          for (const auto& [m, out] : ms) add(b, p + m + ".bias", {out}, false);
      };
      add(b, p + "input_layernorm.weight", {C}, false);
      group({{"self_attn.q_proj", QD}, {"self_attn.k_proj", KD}, {"self_attn.v_proj", KD}}, C, cfg.qkv_bias);
      group({{"self_attn.o_proj", C}}, QD, cfg.o_bias);
      if (cfg.qk_norm) {
        add(b, p + "self_attn.q_norm.weight", {HD}, false);
        add(b, p + "self_attn.k_norm.weight", {HD}, false);
      }
      add(b, p + "post_attention_layernorm.weight", {C}, false);
      group({{"mlp.gate_proj", F}, {"mlp.up_proj", F}}, C, cfg.mlp_bias);
      group({{"mlp.down_proj", C}}, F, cfg.mlp_bias);
    }
    out.push_back(std::move(b));
  }

  BufferLayout head{"head", cfg.n_layer, {}, 0};
  if (gpt2) {
    add(head, "transformer.ln_f.weight", {C}, false);
    add(head, "transformer.ln_f.bias", {C}, false);
  } else {
    add(head, "model.norm.weight", {C}, false);
  }
  if (!cfg.tie_embeddings) add(head, "lm_head.weight", {V, C}, true);
  out.push_back(std::move(head));
  return out;
}

std::vector<LayerProjection> layer_projections(const ModelConfig& cfg) {
  const int C = cfg.d_model, F = cfg.d_ff, QD = cfg.n_head * cfg.head_dim(), KD = cfg.n_kv_head * cfg.head_dim();
  if (cfg.arch == ModelConfig::Arch::GPT2)
    return {{"c_attn", "attn.c_attn", C, QD + 2 * KD, true},
            {"c_proj", "attn.c_proj", QD, C, true},
            {"c_fc", "mlp.c_fc", C, F, true},
            {"c_proj", "mlp.c_proj", F, C, true}};
  return {{"q_proj", "self_attn.q_proj", C, QD, cfg.qkv_bias}, {"k_proj", "self_attn.k_proj", C, KD, cfg.qkv_bias},
          {"v_proj", "self_attn.v_proj", C, KD, cfg.qkv_bias}, {"o_proj", "self_attn.o_proj", QD, C, cfg.o_bias},
          {"gate_proj", "mlp.gate_proj", C, F, cfg.mlp_bias},  {"up_proj", "mlp.up_proj", C, F, cfg.mlp_bias},
          {"down_proj", "mlp.down_proj", F, C, cfg.mlp_bias}};
}

}  // namespace dtrain::model
