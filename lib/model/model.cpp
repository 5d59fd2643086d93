// Model: GPT-2 / Llama-family forward and backward written once over the device layer (llm.c
// structure: layer inputs kept per layer boundary, each formed by the next norm's fused
// residual add; per-layer saved activations; one set of backward scratch arrays; all of
// them carved from one arena, model_activations.cpp), plus recomputation and LoRA
// adapters; the parameters and their storage are in model_params.cpp and model_storage.cpp.
#include "model/model.h"

#include "model/model_arena.h"

#include "core/check.h"
#include "core/rng.h"
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dtrain::model {

namespace {
constexpr int32_t IGNORE_INDEX = -100;
constexpr int GPT2_C_ATTN = 0, GPT2_ATTN_PROJ = 1, GPT2_FC = 2, GPT2_MLP_PROJ = 3;
constexpr int LL_Q = 0, LL_K = 1, LL_V = 2, LL_O = 3, LL_GATE = 4, LL_UP = 5, LL_DOWN = 6;
// How a backward op treats its input-gradient output: the first producer of a gradient
// array writes it (a GEMM with beta = 0, no zeroing pass), later ones add to it.
constexpr bool WRITE = false, ACCUMULATE = true;

int tensor_index(const BufferLayout& b, const std::string& name) {
  for (size_t i = 0; i < b.tensors.size(); ++i)
    if (b.tensors[i].name == name) return static_cast<int>(i);
  DT_THROW(InternalError, "layout {} has no tensor {}", b.name, name);
}

}  // namespace

// One projection of a layer: y = x W^T (+ b), optionally with a LoRA adapter.
struct Model::Proj {
  std::string short_name;  // LoRA target name: "q_proj", "c_proj", ...
  std::string module;      // path inside the layer: "self_attn.q_proj", "mlp.c_proj"
  int in = 0, out = 0;
  int w = -1, b = -1;  // tensor indices in the layer buffer (b = -1: no bias)
};

Model::Model(const ModelConfig& cfg, Deferred, device::Device& dev, DType dtype) : Model(cfg, dev, dtype, true) {}

Model::Model(const ModelConfig& cfg, device::Device& dev, DType dtype) : Model(cfg, dev, dtype, false) {}

Model::Model(const ModelConfig& cfg, FrozenBase, device::Device& dev, DType dtype)
    : Model(cfg, dev, dtype, false, false) {}

Model::Model(const ModelConfig& cfg, device::Device& dev, DType dtype, bool deferred, bool grads)
    : ModelActivations(cfg, dev, dtype, deferred, grads) {
  const BufferLayout& l0 = params_[1].layout;
  const std::string p0 = layer_prefix(cfg_, 0) + ".";
  for (const LayerProjection& lp : layer_projections(cfg_)) {
    Proj p{lp.short_name, lp.module, lp.in, lp.out, -1, -1};
    p.w = tensor_index(l0, p0 + p.module + ".weight");
    if (lp.bias) p.b = tensor_index(l0, p0 + p.module + ".bias");
    projs_.push_back(std::move(p));
  }
  if (cfg_.arch != ModelConfig::Arch::GPT2) {
    // The layout puts each group's weights (and biases) back to back (layout_build); qwen3's
    // per-head q/k norms read q and k dense, so its q/k/v stay three GEMMs.
    qkv_fusable_ = !cfg_.qk_norm && proj_group_fusable(l0, LL_Q, 3);
    gate_up_fusable_ = proj_group_fusable(l0, LL_GATE, 2);
    ln1_ = tensor_index(l0, p0 + "input_layernorm.weight");
    ln2_ = tensor_index(l0, p0 + "post_attention_layernorm.weight");
    if (cfg_.qk_norm) {
      qnorm_ = tensor_index(l0, p0 + "self_attn.q_norm.weight");
      knorm_ = tensor_index(l0, p0 + "self_attn.k_norm.weight");
    }
  }
}

Model::~Model() = default;

void Model::weights_copy_from(const Model& src) {
  storage_enforce_whole("weights_copy_from()");
  src.storage_enforce_whole("weights_copy_from() (source)");
  DT_ENFORCE(src.params_.size() == params_.size(), UsageError, "weights_copy_from: the models differ in layers");
  for (size_t i = 0; i < params_.size(); ++i)
    DT_ENFORCE_EQ(src.params_[i].size, params_[i].size, UsageError, "weights_copy_from: size of buffer {}",
                  params_[i].layout.name);
  if (src.lora_on() && !lora_on()) lora_enable(src.lora_config());
  DT_ENFORCE(src.lora_on() == lora_on(), UsageError, "weights_copy_from: LoRA is {} on the source but {} here",
             src.lora_on() ? "on" : "off", lora_on() ? "on" : "off");
  for (size_t i = 0; i < params_.size() + lora_params_.size(); ++i) {
    const ParamBuffer& s = src.buffer_at(i);
    DT_ENFORCE_EQ(s.size, buffer_at(i).size, UsageError, "weights_copy_from: size of buffer {}", s.layout.name);
    if (s.on_host && s.dtype == DType::F32) buffer_from_host(i, s.host_f32());
    else buffer_from_host(i, src.buffer_to_host(i).data());
  }
}

// ---------------------------------------------------------------------------
// Activations: one arena for (B, T) (laid out in model_activations.cpp)

void Model::allocate(int B, int T) {
  ArenaShape sh;
  sh.B = B;
  sh.T = T;
  sh.r = lora_on() ? static_cast<size_t>(lora_cfg_.rank) : 0;
  sh.xd = lora_on() && lora_cfg_.dropout > 0.0f;
  sh.adapted.assign(projs_.size(), 0);
  for (size_t p = 0; p < projs_.size(); ++p) {
    sh.proj_in.push_back(projs_[p].in);
    for (int l = 0; l < cfg_.n_layer; ++l) sh.adapted[p] = sh.adapted[p] || proj_adapted(l, static_cast<int>(p));
  }
  // d(act) is stored only where an adapter on the down projection adds to it, or
  // SwiGLU needs it; GPT-2's plain projection goes straight to d(fc).
  sh.dact = !(cfg_.arch == ModelConfig::Arch::GPT2 && !sh.adapted[GPT2_MLP_PROJ]);
  arena_allocate(sh);
}

// ---------------------------------------------------------------------------
// Projections (base linear + optional LoRA adapter)

bool Model::proj_adapted(int l, int p) const {
  return lora_on() && acts_adapted_ && lora_slot_[static_cast<size_t>(l)][static_cast<size_t>(p)] >= 0;
}

// Dropout masks are a function of (seed, forward count, layer, projection): recompute
// and backward redraw the forward's mask.
uint64_t Model::lora_mask_seed(int l, int p) const {
  return splitmix64(lora_cfg_.seed ^ splitmix64(acts_step_ * 4096 + static_cast<uint64_t>(l) * 16 + p + 1));
}

bool Model::proj_group_fusable(const BufferLayout& layer, int p, int n) const {
  auto offset = [&](int t) { return layer.tensors[static_cast<size_t>(t)].offset; };
  const Proj& first = projs_[static_cast<size_t>(p)];
  for (int m = 1; m < n; ++m) {
    const Proj& pr = projs_[static_cast<size_t>(p + m)];
    const Proj& prev = projs_[static_cast<size_t>(p + m - 1)];
    if (pr.in != first.in || (pr.b >= 0) != (first.b >= 0)) return false;
    if (offset(pr.w) != offset(prev.w) + static_cast<size_t>(prev.out) * prev.in) return false;
    if (pr.b >= 0 && offset(pr.b) != offset(prev.b) + static_cast<size_t>(prev.out)) return false;
  }
  return true;
}

void Model::proj_forward(int l, int p, const void* x, void* y, LayerActs& a) { proj_group_forward(l, p, 1, x, y, a); }

void Model::proj_backward(int l, int p, const void* dy, const void* x, void* dx, bool accumulate_dx, LayerActs& a) {
  proj_group_backward(l, p, 1, dy, x, dx, accumulate_dx, a);
}

void Model::proj_group_forward(int l, int p, int n, const void* x, void* y, LayerActs& a) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  int out = 0;
  for (int m = 0; m < n; ++m) out += projs_[static_cast<size_t>(p + m)].out;
  const void* W = param_at(pb, static_cast<size_t>(pr.w));
  const void* b = pr.b >= 0 ? param_at(pb, static_cast<size_t>(pr.b)) : nullptr;
  dev_->linear_forward(y, x, W, b, B_ * T_, pr.in, out, out, dtype_);
  int col = 0;
  for (int m = 0; m < n; ++m) {
    if (proj_adapted(l, p + m)) lora_forward(l, p + m, x, at(y, static_cast<size_t>(col)), out, a);
    col += projs_[static_cast<size_t>(p + m)].out;
  }
}

// y (rows ld_y apart) += scale * dropout(x) A^T B^T
void Model::lora_forward(int l, int p, const void* x, void* y, int ld_y, LayerActs& a) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  const int N = B_ * T_;
  const size_t slot = static_cast<size_t>(lora_slot_[static_cast<size_t>(l)][static_cast<size_t>(p)]);
  const ParamBuffer& lb = lora_params_[static_cast<size_t>(l)];
  const int r = lora_cfg_.rank;
  const void* xd = x;
  if (acts_dropout_ > 0.0f) {
    void* keep = a.lora_xd[static_cast<size_t>(p)];
    dev_->dropout_forward(keep, x, static_cast<size_t>(N) * pr.in, acts_dropout_, lora_mask_seed(l, p), dtype_);
    xd = keep;
  }
  void* h = a.lora_h[static_cast<size_t>(p)];
  dev_->gemm(false, true, N, r, pr.in, 1.0f, xd, param_at(lb, slot), 0.0f, h, dtype_, dtype_);
  dev_->gemm_ld(false, true, N, pr.out, r, lora_cfg_.scale(), h, r, param_at(lb, slot + 1), r, 1.0f, y, ld_y, dtype_,
                dtype_);
}

// dx = dy W (accumulate_dx: dx += dy W) over the group's joint weight; dW, db += (when
// trainable); then each adapted member's part (lora_backward).
void Model::proj_group_backward(int l, int p, int n, const void* dy, const void* x, void* dx, bool accumulate_dx,
                                LayerActs& a) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  int out = 0;
  for (int m = 0; m < n; ++m) out += projs_[static_cast<size_t>(p + m)].out;
  dev_->linear_backward(dx, grad_at(pb, static_cast<size_t>(pr.w)),
                        pr.b >= 0 ? grad_at(pb, static_cast<size_t>(pr.b)) : nullptr, dy, x,
                        param_at(pb, static_cast<size_t>(pr.w)), B_ * T_, pr.in, out, out, accumulate_dx, dtype_);
  int col = 0;
  for (int m = 0; m < n; ++m) {
    if (proj_adapted(l, p + m)) lora_backward(l, p + m, at(dy, static_cast<size_t>(col)), out, x, dx, a);
    col += projs_[static_cast<size_t>(p + m)].out;
  }
}

// dy's rows ld_dy apart: dB += scale dy^T h, dA += (scale dy B)^T dropout(x), dx +=
// dropout'((scale dy B) A).
void Model::lora_backward(int l, int p, const void* dy, int ld_dy, const void* x, void* dx, LayerActs& a) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  const int N = B_ * T_;
  const size_t slot = static_cast<size_t>(lora_slot_[static_cast<size_t>(l)][static_cast<size_t>(p)]);
  const ParamBuffer& lb = lora_params_[static_cast<size_t>(l)];
  const int r = lora_cfg_.rank;
  const float scale = lora_cfg_.scale();
  const bool dropout = acts_dropout_ > 0.0f;
  const void* xd = dropout ? a.lora_xd[static_cast<size_t>(p)] : x;
  const void* h = a.lora_h[static_cast<size_t>(p)];
  void* dh = scratch_->dh;
  dev_->gemm_ld(true, false, pr.out, r, N, scale, dy, ld_dy, h, r, 1.0f, grad_at(lb, slot + 1), r, dtype_, DType::F32);
  dev_->gemm_ld(false, false, N, r, pr.out, scale, dy, ld_dy, param_at(lb, slot + 1), r, 0.0f, dh, r, dtype_, dtype_);
  dev_->gemm(true, false, r, pr.in, N, 1.0f, dh, xd, 1.0f, grad_at(lb, slot), dtype_, DType::F32);
  if (!dx) return;
  if (!dropout) {
    dev_->gemm(false, false, N, pr.in, r, 1.0f, dh, param_at(lb, slot), 1.0f, dx, dtype_, dtype_);
    return;
  }
  dev_->gemm(false, false, N, pr.in, r, 1.0f, dh, param_at(lb, slot), 0.0f, scratch_->dxd, dtype_, dtype_);
  dev_->dropout_backward(dx, scratch_->dxd, static_cast<size_t>(N) * pr.in, acts_dropout_, lora_mask_seed(l, p),
                         dtype_);
}

// ---------------------------------------------------------------------------
// One transformer layer. Its input x_l = residuals_[l] is formed by its first norm
// (fused_input: x_l = res2_{l-1} + mlp_{l-1}, the previous layer's output) or already
// there (layer 0: the embeddings; recomputation: kept from the forward).

void Model::layer_forward(int l, LayerActs& a, bool fused_input) {
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HD = cfg_.head_dim();
  const size_t F = static_cast<size_t>(cfg_.d_ff) * N;
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  auto P = [&](size_t i) { return param_at(pb, i); };
  Scratch& s = *scratch_;
  void* x = residuals_[static_cast<size_t>(l)];
  const void* prev_res2 = fused_input ? acts_for(l - 1).res2 : nullptr;
  const float eps = cfg_.norm_eps;

  if (gpt2) {
    // tensors: 0 ln_1.w 1 ln_1.b ... 6 ln_2.w 7 ln_2.b
    if (fused_input)
      dev_->residual_layernorm_forward(x, a.ln1, a.ln1_mean, a.ln1_rstd, prev_res2, s.mlp, P(0), P(1), N, C, eps,
                                       dtype_);
    else dev_->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, P(0), P(1), N, C, eps, dtype_);
    proj_forward(l, GPT2_C_ATTN, a.ln1, a.q, a);  // a.q, a.k, a.v are column blocks of its rows
  } else {
    const size_t ln1 = static_cast<size_t>(ln1_);
    if (fused_input) dev_->residual_rmsnorm_forward(x, a.ln1, a.ln1_rstd, prev_res2, s.mlp, P(ln1), N, C, eps, dtype_);
    else dev_->rmsnorm_forward(a.ln1, a.ln1_rstd, x, P(ln1), N, C, eps, dtype_);
    if (cfg_.qk_norm) {  // qwen3: each q and k head RMS-normed over head_dim, before RoPE
      proj_forward(l, LL_Q, a.ln1, a.qpre, a);
      proj_forward(l, LL_K, a.ln1, a.kpre, a);
      dev_->rmsnorm_forward(a.q, a.qn_rstd, a.qpre, P(static_cast<size_t>(qnorm_)), N * NH, HD, eps, dtype_);
      dev_->rmsnorm_forward(a.k, a.kn_rstd, a.kpre, P(static_cast<size_t>(knorm_)), N * NKV, HD, eps, dtype_);
      proj_forward(l, LL_V, a.ln1, a.v, a);
    } else if (fused_qkv()) {
      proj_group_forward(l, LL_Q, 3, a.ln1, a.q, a);  // a.q, a.k, a.v are column blocks of its rows
    } else {
      proj_forward(l, LL_Q, a.ln1, a.q, a);
      proj_forward(l, LL_K, a.ln1, a.k, a);
      proj_forward(l, LL_V, a.ln1, a.v, a);
    }
    dev_->rope_forward(a.q, a.k, B, T, NH, NKV, HD, q_stride(), kv_stride(), cfg_.rope_freq(), doc_starts(), dtype_);
  }
  dev_->attention_forward(a.atty, a.att, a.q, a.k, a.v, B, T, NH, NKV, HD, q_stride(), kv_stride(), cfg_.sliding_window,
                          doc_starts(), dtype_);
  proj_forward(l, gpt2 ? GPT2_ATTN_PROJ : LL_O, a.atty, s.attproj, a);
  if (gpt2) {
    dev_->residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, s.attproj, P(6), P(7), N, C, eps,
                                     dtype_);
    if (proj_adapted(l, GPT2_FC)) {
      proj_forward(l, GPT2_FC, a.ln2, a.fc, a);
      dev_->gelu_forward(a.act, a.fc, F, dtype_);
    } else {  // bias + GELU in the GEMM epilogue on CUDA; the pre-activation is kept
      const Proj& fc = projs_[GPT2_FC];
      dev_->linear_gelu_forward(a.act, a.fc, a.ln2, P(static_cast<size_t>(fc.w)), P(static_cast<size_t>(fc.b)), N, C,
                                cfg_.d_ff, dtype_);
    }
    proj_forward(l, GPT2_MLP_PROJ, a.act, s.mlp, a);
  } else {
    dev_->residual_rmsnorm_forward(a.res2, a.ln2, a.ln2_rstd, x, s.attproj, P(static_cast<size_t>(ln2_)), N, C, eps,
                                   dtype_);
    if (fused_gate_up()) {
      proj_group_forward(l, LL_GATE, 2, a.ln2, a.fc, a);  // a.fc (gate), a.up: column blocks of its rows
    } else {
      proj_forward(l, LL_GATE, a.ln2, a.fc, a);
      proj_forward(l, LL_UP, a.ln2, a.up, a);
    }
    dev_->swiglu_forward(a.act, a.fc, a.up, static_cast<size_t>(N), static_cast<size_t>(cfg_.d_ff),
                         static_cast<size_t>(gate_up_ld()), dtype_);
    proj_forward(l, LL_DOWN, a.act, s.mlp, a);
  }
}

// On entry scratch.dres holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
void Model::layer_backward(int l, LayerActs& a) {
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HD = cfg_.head_dim();
  const size_t F = static_cast<size_t>(cfg_.d_ff) * N;
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  auto P = [&](size_t i) { return param_at(pb, i); };
  auto G = [&](size_t i) { return grad_at(pb, i); };
  Scratch& s = *scratch_;
  void* dres = s.dres;
  const void* x = residuals_[static_cast<size_t>(l)];

  // MLP branch: d(mlp) = dres, and dres also flows straight to res2. Every gradient
  // array is written by its first producer (no zeroing pass); only d(ln2) has two (gate, up).
  // GPT-2: d(fc) = gelu'(fc) (dres W_proj) in one op (on CUDA the d(act) GEMM's DGELU
  // epilogue reads the pre-activation a.fc), so d(act) is never stored, unless an adapter
  // on the projection adds its own part to d(act) first.
  const bool dgelu = gpt2 && !proj_adapted(l, GPT2_MLP_PROJ);
  if (dgelu) {
    const Proj& pr = projs_[GPT2_MLP_PROJ];
    dev_->linear_dgelu_backward(s.dfc, G(static_cast<size_t>(pr.w)), G(static_cast<size_t>(pr.b)), dres, a.act,
                                P(static_cast<size_t>(pr.w)), a.fc, N, pr.in, pr.out, dtype_);
  } else {
    proj_backward(l, gpt2 ? GPT2_MLP_PROJ : LL_DOWN, dres, a.act, s.dact, WRITE, a);
  }
  if (gpt2) {
    if (!dgelu) dev_->gelu_backward(s.dfc, a.fc, s.dact, F, dtype_);
    proj_backward(l, GPT2_FC, s.dfc, a.ln2, s.dln, WRITE, a);
    dev_->layernorm_backward(dres, G(6), G(7), s.dln, a.res2, P(6), a.ln2_mean, a.ln2_rstd, N, C, dtype_);
  } else {
    dev_->swiglu_backward(s.dfc, s.dup, s.dact, a.fc, a.up, static_cast<size_t>(N), static_cast<size_t>(cfg_.d_ff),
                          static_cast<size_t>(gate_up_ld()), dtype_);
    if (fused_gate_up()) {
      proj_group_backward(l, LL_GATE, 2, s.dfc, a.ln2, s.dln, WRITE, a);
    } else {
      proj_backward(l, LL_GATE, s.dfc, a.ln2, s.dln, WRITE, a);
      proj_backward(l, LL_UP, s.dup, a.ln2, s.dln, ACCUMULATE, a);
    }
    const size_t ln2 = static_cast<size_t>(ln2_);
    dev_->rmsnorm_backward(dres, G(ln2), s.dln, a.res2, P(ln2), a.ln2_rstd, N, C, dtype_);
  }

  // Attention branch: d(attproj) = dres (now d(res2)), which also flows to x.
  proj_backward(l, gpt2 ? GPT2_ATTN_PROJ : LL_O, dres, a.atty, s.datty, WRITE, a);
  dev_->attention_backward(s.dq, s.dk, s.dv, s.datty, a.atty, a.att, a.q, a.k, a.v, B, T, NH, NKV, HD, q_stride(),
                           kv_stride(), cfg_.sliding_window, doc_starts(), dtype_);
  if (gpt2) {
    proj_backward(l, GPT2_C_ATTN, s.dqkv, a.ln1, s.dln, WRITE, a);
    dev_->layernorm_backward(dres, G(0), G(1), s.dln, x, P(0), a.ln1_mean, a.ln1_rstd, N, C, dtype_);
  } else {
    dev_->rope_backward(s.dq, s.dk, B, T, NH, NKV, HD, q_stride(), kv_stride(), cfg_.rope_freq(), doc_starts(), dtype_);
    void* dq = s.dq;
    void* dk = s.dk;
    if (cfg_.qk_norm) {  // through the per-head norms (their backward accumulates: zero first)
      const size_t es = dtype_size(dtype_);
      dev_->zero(s.dqpre, static_cast<size_t>(N) * NH * HD * es);
      dev_->zero(s.dkpre, static_cast<size_t>(N) * NKV * HD * es);
      const size_t qn = static_cast<size_t>(qnorm_), kn = static_cast<size_t>(knorm_);
      dev_->rmsnorm_backward(s.dqpre, G(qn), s.dq, a.qpre, P(qn), a.qn_rstd, N * NH, HD, dtype_);
      dev_->rmsnorm_backward(s.dkpre, G(kn), s.dk, a.kpre, P(kn), a.kn_rstd, N * NKV, HD, dtype_);
      dq = s.dqpre;
      dk = s.dkpre;
    }
    if (fused_qkv()) {
      proj_group_backward(l, LL_Q, 3, s.dqkv, a.ln1, s.dln, WRITE, a);
    } else {
      proj_backward(l, LL_Q, dq, a.ln1, s.dln, WRITE, a);
      proj_backward(l, LL_K, dk, a.ln1, s.dln, ACCUMULATE, a);
      proj_backward(l, LL_V, s.dv, a.ln1, s.dln, ACCUMULATE, a);
    }
    const size_t ln1 = static_cast<size_t>(ln1_);
    dev_->rmsnorm_backward(dres, G(ln1), s.dln, x, P(ln1), a.ln1_rstd, N, C, dtype_);
  }
}

// ---------------------------------------------------------------------------
// Whole model

float Model::forward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss_out,
                     const int32_t* doc_start) {
  inputs_set(tokens, targets, B, T, doc_start);
  return forward_issue(loss_out);
}

void Model::inputs_set(const int32_t* tokens, const int32_t* targets, int B, int T, const int32_t* doc_start) {
  DT_ENFORCE_GT(B, 0, UsageError, "model forward batch size");
  DT_ENFORCE_GT(T, 0, UsageError, "model forward sequence length");
  DT_ENFORCE_LE(T, cfg_.max_seq_len, UsageError, "sequence length exceeds the model's max_seq_len");
  const int N = B * T, V = cfg_.vocab_size;
  for (int i = 0; i < N; ++i)
    DT_ENFORCE(tokens[i] >= 0 && tokens[i] < V, UsageError,
               "token id {} at position {} is outside the vocabulary [0, {})", tokens[i], i, V);
  if (targets)
    for (int i = 0; i < N; ++i)
      DT_ENFORCE(targets[i] == IGNORE_INDEX || (targets[i] >= 0 && targets[i] < V), UsageError,
                 "target {} at row {} is outside the vocabulary [0, {}) and not the ignore index {}", targets[i], i, V,
                 IGNORE_INDEX);
  if (doc_start) ops::attention_doc_starts_check(doc_start, B, T);
  if (B != B_ || T != T_) allocate(B, T);
  Scratch& s = *scratch_;
  dev_->copy_h2d(s.tokens, tokens, static_cast<size_t>(N) * sizeof(int32_t));
  docs_ = doc_start != nullptr;
  if (docs_) dev_->copy_h2d(s.doc_start, doc_start, static_cast<size_t>(N) * sizeof(int32_t));
  inputs_targets_ = targets != nullptr;
  if (!targets) return;
  dev_->copy_h2d(s.targets, targets, static_cast<size_t>(N) * sizeof(int32_t));
  num_targets_ = 0;
  for (int i = 0; i < N; ++i) num_targets_ += targets[i] != IGNORE_INDEX;
  const float count = static_cast<float>(num_targets_);
  dev_->copy_h2d(s.num_targets, &count, sizeof count);
}

float Model::forward_issue(float* loss_out) {
  DT_ENFORCE(scratch_ != nullptr, UsageError, "Model::forward_issue() needs inputs_set() first");
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, V = cfg_.vocab_size, L = cfg_.n_layer;
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  Scratch& s = *scratch_;
  acts_step_ = forward_count_++;
  acts_adapted_ = adapters_enabled_;
  acts_dropout_ = training_ && lora_on() && acts_adapted_ ? lora_cfg_.dropout : 0.0f;
  have_targets_ = false;
  const LossGrad fuse = fuse_next_;  // consumed by this forward, with targets or not
  fuse_next_ = LossGrad{};
  fused_ = LossGrad{};

  if (hooks_.before_layer_forward) hooks_.before_layer_forward(-1);
  const ParamBuffer& emb = params_.front();
  buffer_enforce_present(emb, true, false);
  dev_->embedding_forward(residuals_[0], s.tokens, emb.data, gpt2 ? param_at(emb, 1) : nullptr, B, T, C, V,
                          doc_starts(), dtype_);
  for (int l = 0; l < L; ++l) {
    if (hooks_.before_layer_forward) hooks_.before_layer_forward(l);
    layer_buffers_enforce(l, false);
    layer_forward(l, acts_for(l), l > 0);
  }
  if (hooks_.before_layer_forward) hooks_.before_layer_forward(L);
  const ParamBuffer& head = params_.back();
  buffer_enforce_present(head, true, false);
  if (cfg_.tie_embeddings) buffer_enforce_present(emb, true, false);
  void* xL = residuals_[static_cast<size_t>(L)];
  const void* res2 = acts_for(L - 1).res2;
  if (gpt2)
    dev_->residual_layernorm_forward(xL, s.lnf, s.lnf_mean, s.lnf_rstd, res2, s.mlp, head.data, param_at(head, 1), N, C,
                                     cfg_.norm_eps, dtype_);
  else dev_->residual_rmsnorm_forward(xL, s.lnf, s.lnf_rstd, res2, s.mlp, head.data, N, C, cfg_.norm_eps, dtype_);
  const void* wlm = cfg_.tie_embeddings ? emb.data : param_at(head, head.layout.tensors.size() - 1);
  dev_->linear_forward(s.logits, s.lnf, wlm, nullptr, N, C, V, logits_ld_, dtype_);

  if (!inputs_targets_) return std::numeric_limits<float>::quiet_NaN();
  // The mean goes straight to loss_out where the caller gives one (no device copy after).
  float* mean = loss_out != nullptr ? loss_out : s.loss_mean;
  if (fuse.on) {  // the loss and, in the same pass, the logits' gradient
    dev_->cross_entropy_forward_backward(s.losses, mean, s.logits, s.logits, s.targets, N, V, logits_ld_,
                                         fuse.grad_scale, fuse.count != nullptr ? fuse.count : s.num_targets, dtype_);
    fused_ = fuse;
  } else {
    dev_->cross_entropy_forward(s.losses, mean, s.logits, s.targets, N, V, logits_ld_, dtype_);
  }
  have_targets_ = true;
  if (loss_out != nullptr) return std::numeric_limits<float>::quiet_NaN();
  float loss = 0.0f;
  dev_->copy_d2h(&loss, s.loss_mean, sizeof(float));
  return loss;
}

void Model::backward_fuse(float grad_scale, const float* count) {
  fuse_next_.on = true;
  fuse_next_.grad_scale = grad_scale;
  fuse_next_.count = count;
}

void Model::backward_rows(const float* row_scales, float grad_scale) {
  DT_ENFORCE(row_scales != nullptr, UsageError, "Model::backward_rows needs one scale per row");
  backward_impl(grad_scale, nullptr, row_scales);
}

void Model::backward(float grad_scale, const float* count) { backward_impl(grad_scale, count, nullptr); }

// dlogits over the logits, scaled by grad_scale / count (read on the device), unless
// the forward's loss pass wrote them already; backward_rows': each row by its own scale.
void Model::logits_backward(float grad_scale, const float* count, const float* row_scales) {
  const int B = B_, T = T_, N = B * T, V = cfg_.vocab_size;
  Scratch& s = *scratch_;
  if (row_scales != nullptr) {
    DT_ENFORCE(!fused_.on, UsageError, "Model::backward_rows after a forward fused for backward()");
    if (row_one_.get() == nullptr) {
      row_one_ = device::DeviceBuffer(*dev_, sizeof(float));
      const float one = 1.0f;
      dev_->copy_h2d(row_one_.as<float>(), &one, sizeof one);
    }
    const size_t row = static_cast<size_t>(T) * static_cast<size_t>(logits_ld_) * dtype_size(dtype_);
    for (int b = 0; b < B; ++b) {
      void* lg = static_cast<char*>(s.logits) + static_cast<size_t>(b) * row;
      dev_->cross_entropy_backward(lg, lg, s.targets + static_cast<size_t>(b) * T, T, V, logits_ld_,
                                   grad_scale * row_scales[b], row_one_.as<float>(), dtype_);
    }
  } else if (fused_.on) {
    DT_ENFORCE(fused_.grad_scale == grad_scale && fused_.count == count, UsageError,
               "Model::backward({}) after a forward fused for backward({}), or with another count", grad_scale,
               fused_.grad_scale);
    fused_ = LossGrad{};
  } else {
    dev_->cross_entropy_backward(s.logits, s.logits, s.targets, N, V, logits_ld_, grad_scale,
                                 count != nullptr ? count : s.num_targets, dtype_);
  }
}

void Model::backward_impl(float grad_scale, const float* count, const float* row_scales) {
  DT_ENFORCE(have_targets_, UsageError, "Model::backward() needs a forward() with targets since the last backward()");
  DT_ENFORCE(acts_adapted_ || !lora_on(), UsageError,
             "Model::backward() after a forward with the adapters disabled (a reference pass has no gradient)");
  have_targets_ = false;
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, V = cfg_.vocab_size, L = cfg_.n_layer;
  const size_t NC = static_cast<size_t>(N) * C * dtype_size(dtype_);
  ParamBuffer& emb = params_.front();
  ParamBuffer& head = params_.back();
  Scratch& s = *scratch_;

  if (hooks_.before_layer_backward) hooks_.before_layer_backward(L);
  const bool base_grads = grads_released_ && !lora_on();  // hooks must supply the base gradients
  buffer_enforce_present(head, true, base_grads);
  if (cfg_.tie_embeddings) buffer_enforce_present(emb, true, base_grads);
  logits_backward(grad_scale, count, row_scales);
  const size_t lm = head.layout.tensors.size() - 1;
  const void* wlm = cfg_.tie_embeddings ? emb.data : param_at(head, lm);
  float* dwlm = cfg_.tie_embeddings ? emb.grad : grad_at(head, lm);
  dev_->linear_backward(s.dln, dwlm, nullptr, s.logits, s.lnf, wlm, N, C, V, logits_ld_, WRITE, dtype_);
  dev_->zero(s.dres, NC);
  const void* xL = residuals_[static_cast<size_t>(L)];
  if (gpt2)
    dev_->layernorm_backward(s.dres, head.grad, grad_at(head, 1), s.dln, xL, head.data, s.lnf_mean, s.lnf_rstd, N, C,
                             dtype_);
  else dev_->rmsnorm_backward(s.dres, head.grad, s.dln, xL, head.data, s.lnf_rstd, N, C, dtype_);
  if (hooks_.after_layer_backward) hooks_.after_layer_backward(L);

  for (int l = L - 1; l >= 0; --l) {
    if (hooks_.before_layer_backward) hooks_.before_layer_backward(l);
    layer_buffers_enforce(l, grads_released_);
    LayerActs& a = acts_for(l);
    if (recompute_layer_at(l, recompute_layers_, L)) layer_forward(l, a, false);
    layer_backward(l, a);
    if (hooks_.after_layer_backward) hooks_.after_layer_backward(l);
  }

  if (hooks_.before_layer_backward) hooks_.before_layer_backward(-1);
  buffer_enforce_present(emb, false, base_grads);
  if (emb.grad)
    dev_->embedding_backward(emb.grad, gpt2 ? grad_at(emb, 1) : nullptr, s.dres, s.tokens, B, T, C, V, doc_starts(),
                             dtype_);
  if (hooks_.after_layer_backward) hooks_.after_layer_backward(-1);
}

// ---------------------------------------------------------------------------
// LoRA

void Model::lora_enable(const LoraConfig& lcfg) {
  DT_ENFORCE(!lora_on(), UsageError, "LoRA is already enabled on this model");
  // A deferred model (every base buffer released, no gradient array) may get adapters: they
  // touch no base storage. Any other partly released model may not.
  const bool deferred = grads_released_ &&
                        std::all_of(param_released_.begin(), param_released_.end(), [](char r) { return r != 0; }) &&
                        param_released_.size() == params_.size();
  // Built FrozenBase: every parameter present, no gradient array (none is wanted).
  const bool frozen_base = grads_released_ && param_released_.size() == params_.size() &&
                           std::none_of(param_released_.begin(), param_released_.end(), [](char r) { return r != 0; });
  if (!deferred && !frozen_base) storage_enforce_whole("lora_enable()");
  lcfg.validate(cfg_);
  lora_cfg_ = lcfg;
  // lora_layout_build's order: per layer, lora_A then lora_B of each targeted projection.
  lora_slot_.assign(static_cast<size_t>(cfg_.n_layer), std::vector<int>(projs_.size(), -1));
  std::vector<BufferLayout> layouts = lora_layout_build(cfg_, lcfg);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    int slot = 0;
    for (size_t p = 0; p < projs_.size(); ++p)
      if (std::find(lcfg.targets.begin(), lcfg.targets.end(), projs_[p].short_name) != lcfg.targets.end()) {
        lora_slot_[static_cast<size_t>(l)][p] = slot;
        slot += 2;
      }
  }
  uint64_t index = 0;
  std::vector<float> host;
  for (auto& l : layouts) {
    lora_store_.emplace_back(*dev_, l.size * dtype_size(dtype_));
    lora_grad_store_.emplace_back(*dev_, l.size * sizeof(float));
    ParamBuffer pb;
    pb.size = l.size;
    pb.data = lora_store_.back().get();
    pb.grad = lora_grad_store_.back().as<float>();
    pb.dtype = dtype_;
    pb.on_host = on_host();
    // A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT: kaiming_uniform_(a=sqrt(5))); B = 0.
    host.assign(l.size, 0.0f);
    for (const auto& t : l.tensors) {
      ++index;
      if (t.name.ends_with("lora_B.weight")) continue;
      Rng rng(splitmix64(lcfg.seed ^ splitmix64(index)));
      const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
      for (size_t i = 0; i < t.numel(); ++i) host[t.offset + i] = rng.uniform(-bound, bound);
    }
    pb.layout = std::move(l);
    lora_params_.push_back(std::move(pb));
    buffer_from_host(params_.size() + lora_params_.size() - 1, host.data());
  }
  grad_store_.clear();
  for (auto& pb : params_) pb.grad = nullptr;
  activations_invalidate();  // the adapters' activations join the arena on the next forward
  grads_released_ = false;   // the adapters' gradients, the only trainable ones, exist
}

void Model::lora_merge() {
  DT_ENFORCE(lora_on(), UsageError, "lora_merge() called on a model without LoRA adapters");
  DT_ENFORCE(dtype_ == DType::F32, UsageError, "lora_merge() folds the adapters into fp32 weights; this model is {}",
             dtype_name(dtype_));
  storage_enforce_whole("lora_merge()");
  for (int l = 0; l < cfg_.n_layer; ++l) {
    ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
    const ParamBuffer& lb = lora_params_[static_cast<size_t>(l)];
    for (size_t p = 0; p < projs_.size(); ++p) {
      const int slot = lora_slot_[static_cast<size_t>(l)][p];
      if (slot < 0) continue;
      const Proj& pr = projs_[p];
      lora_merge_weight(*dev_, param_at(pb, static_cast<size_t>(pr.w)), param_at(lb, static_cast<size_t>(slot)),
                        param_at(lb, static_cast<size_t>(slot) + 1), pr.out, pr.in, lora_cfg_);
    }
  }
  lora_params_.clear();
  lora_store_.clear();
  lora_grad_store_.clear();
  lora_slot_.clear();
  activations_invalidate();
  grads_allocate();
}

}  // namespace dtrain::model
