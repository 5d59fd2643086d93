// A double-precision reference transformer (GPT-2 / Llama, optional LoRA without
// dropout) composed from the naive ops in tests/ops/reference.h and reading parameters
// by their HF/PEFT names, so the native Model's forward can be compared with it and its
// backward with central finite differences of it.
#pragma once

#include "model/model.h"
#include "ops/reference.h"

#include <map>
#include <string>

namespace dtrain::model::testref {

using ops::ref::Vec;
using Params = std::map<std::string, Vec>;

// Every base and adapter tensor of the model, as doubles.
inline Params params_of(Model& m) {
  Params p;
  for (auto* list : {&m.params(), &m.lora_params()})
    for (auto& pb : *list)
      for (auto& t : pb.layout.tensors) p[t.name] = Vec(pb.host_f32() + t.offset, pb.host_f32() + t.offset + t.numel());
  return p;
}

struct RefLora {
  int rank = 0;
  double scale = 0;
  std::vector<std::string> targets;
};

inline void add_inplace(Vec& a, const Vec& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
}

// y = x W^T (+ b) (+ LoRA delta when the module is adapted).
inline Vec ref_proj(const Params& P, const std::string& module, const std::string& shrt, const Vec& x, int N, int in,
                    int out, bool bias, const RefLora* lora) {
  const Vec* b = bias ? &P.at(module + ".bias") : nullptr;
  Vec y = ops::ref::linear(x, P.at(module + ".weight"), b, N, in, out);
  if (lora) {
    bool on = false;
    for (auto& t : lora->targets) on = on || t == shrt;
    if (on) {
      const Vec& A = P.at(lora_tensor_name(module, false));
      const Vec& B = P.at(lora_tensor_name(module, true));
      Vec h = ops::ref::linear(x, A, nullptr, N, in, lora->rank);
      Vec d = ops::ref::linear(h, B, nullptr, N, lora->rank, out);
      for (size_t i = 0; i < y.size(); ++i) y[i] += lora->scale * d[i];
    }
  }
  return y;
}

// Mean masked cross-entropy of the reference model; logits_out receives [N, V].
inline double ref_loss(const ModelConfig& cfg, const Params& P, const std::vector<int32_t>& tok,
                       const std::vector<int32_t>& tgt, int B, int T, const RefLora* lora = nullptr,
                       Vec* logits_out = nullptr) {
  namespace R = ops::ref;
  const bool gpt2 = cfg.arch == ModelConfig::Arch::GPT2;
  const int N = B * T, C = cfg.d_model, V = cfg.vocab_size, F = cfg.d_ff, NH = cfg.n_head, NKV = cfg.n_kv_head;
  const int HD = cfg.head_dim(), QD = NH * HD, KD = NKV * HD;
  const double eps = cfg.norm_eps;
  Vec x = gpt2 ? R::embedding(tok, P.at("transformer.wte.weight"), &P.at("transformer.wpe.weight"), B, T, C)
               : R::embedding(tok, P.at("model.embed_tokens.weight"), nullptr, B, T, C);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = layer_prefix(cfg, l) + ".";
    Vec q, k, v, ln1;
    if (gpt2) {
      ln1 = R::layernorm(x, P.at(p + "ln_1.weight"), P.at(p + "ln_1.bias"), N, C, eps);
      Vec qkv = ref_proj(P, p + "attn.c_attn", "c_attn", ln1, N, C, QD + 2 * KD, true, lora);
      for (int n = 0; n < N; ++n) {
        auto r = qkv.begin() + n * (QD + 2 * KD);
        q.insert(q.end(), r, r + QD);
        k.insert(k.end(), r + QD, r + QD + KD);
        v.insert(v.end(), r + QD + KD, r + QD + 2 * KD);
      }
    } else {
      ln1 = R::rmsnorm(x, P.at(p + "input_layernorm.weight"), N, C, eps);
      q = R::rope(ref_proj(P, p + "self_attn.q_proj", "q_proj", ln1, N, C, QD, false, lora), B, T, NH, HD,
                  cfg.rope_theta);
      k = R::rope(ref_proj(P, p + "self_attn.k_proj", "k_proj", ln1, N, C, KD, false, lora), B, T, NKV, HD,
                  cfg.rope_theta);
      v = ref_proj(P, p + "self_attn.v_proj", "v_proj", ln1, N, C, KD, false, lora);
    }
    Vec y = R::attention(q, k, v, B, T, NH, NKV, HD);
    add_inplace(x, gpt2 ? ref_proj(P, p + "attn.c_proj", "c_proj", y, N, QD, C, true, lora)
                        : ref_proj(P, p + "self_attn.o_proj", "o_proj", y, N, QD, C, false, lora));
    if (gpt2) {
      Vec ln2 = R::layernorm(x, P.at(p + "ln_2.weight"), P.at(p + "ln_2.bias"), N, C, eps);
      Vec h = R::gelu(ref_proj(P, p + "mlp.c_fc", "c_fc", ln2, N, C, F, true, lora));
      add_inplace(x, ref_proj(P, p + "mlp.c_proj", "c_proj", h, N, F, C, true, lora));
    } else {
      Vec ln2 = R::rmsnorm(x, P.at(p + "post_attention_layernorm.weight"), N, C, eps);
      Vec h = R::swiglu(ref_proj(P, p + "mlp.gate_proj", "gate_proj", ln2, N, C, F, false, lora),
                        ref_proj(P, p + "mlp.up_proj", "up_proj", ln2, N, C, F, false, lora));
      add_inplace(x, ref_proj(P, p + "mlp.down_proj", "down_proj", h, N, F, C, false, lora));
    }
  }
  Vec lnf = gpt2 ? R::layernorm(x, P.at("transformer.ln_f.weight"), P.at("transformer.ln_f.bias"), N, C, eps)
                 : R::rmsnorm(x, P.at("model.norm.weight"), N, C, eps);
  const Vec& wlm =
      cfg.tie_embeddings ? P.at(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight") : P.at("lm_head.weight");
  Vec logits = R::linear(lnf, wlm, nullptr, N, C, V);
  if (logits_out) *logits_out = logits;
  return R::cross_entropy(logits, tgt, N, V);
}

}  // namespace dtrain::model::testref
