// Model: GPT-2 / Llama forward and backward over the CPU ops (llm.c structure: one
// residual stream per layer boundary, per-layer saved activations, a shared set of
// backward scratch buffers), plus recomputation, ZeRO hooks and LoRA adapters.
#include "model/model.h"

#include "core/check.h"
#include "core/rng.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace dtrain::model {

// One projection of a layer: y = x W^T (+ b), optionally with a LoRA adapter.
struct Model::Proj {
  std::string short_name;  // LoRA target name: "q_proj", "c_proj", ...
  std::string module;      // path inside the layer: "self_attn.q_proj", "mlp.c_proj"
  int in = 0, out = 0;
  int w = -1, b = -1;      // tensor indices in the layer buffer (b = -1: no bias)
};

struct Model::LayerActs {
  Buffer<float> ln1, ln1_mean, ln1_rstd, qkv, q, k, v, att, atty, attproj, res2;
  Buffer<float> ln2, ln2_mean, ln2_rstd, fc, up, act, mlp;
  std::vector<LoraActs> lora;
};

struct Model::Scratch {
  Buffer<float> dres, dln, dqkv, dq, dk, dv, datty, dfc, dup, dact;
};

namespace {
constexpr int GPT2_C_ATTN = 0, GPT2_ATTN_PROJ = 1, GPT2_FC = 2, GPT2_MLP_PROJ = 3;
constexpr int LL_Q = 0, LL_K = 1, LL_V = 2, LL_O = 3, LL_GATE = 4, LL_UP = 5, LL_DOWN = 6;

int tensor_index(const BufferLayout& b, const std::string& name) {
  for (size_t i = 0; i < b.tensors.size(); ++i)
    if (b.tensors[i].name == name) return static_cast<int>(i);
  DT_THROW(InternalError, "layout {} has no tensor {}", b.name, name);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Model::Model(const ModelConfig& cfg) : cfg_(cfg), scratch_(std::make_unique<Scratch>()) {
  auto layouts = layout_build(cfg_);  // validates
  const int C = cfg_.d_model, F = cfg_.d_ff, QD = cfg_.n_head * cfg_.head_dim(), KD = cfg_.n_kv_head * cfg_.head_dim();
  const BufferLayout& l0 = layouts[1];
  const std::string p0 = layer_prefix(cfg_, 0) + ".";
  auto proj = [&](std::string shrt, std::string module, int in, int out, bool bias) {
    Proj p{std::move(shrt), std::move(module), in, out, -1, -1};
    p.w = tensor_index(l0, p0 + p.module + ".weight");
    if (bias) p.b = tensor_index(l0, p0 + p.module + ".bias");
    projs_.push_back(std::move(p));
  };
  if (cfg_.arch == ModelConfig::Arch::GPT2) {
    proj("c_attn", "attn.c_attn", C, QD + 2 * KD, true);
    proj("c_proj", "attn.c_proj", QD, C, true);
    proj("c_fc", "mlp.c_fc", C, F, true);
    proj("c_proj", "mlp.c_proj", F, C, true);
  } else {
    proj("q_proj", "self_attn.q_proj", C, QD, false);
    proj("k_proj", "self_attn.k_proj", C, KD, false);
    proj("v_proj", "self_attn.v_proj", C, KD, false);
    proj("o_proj", "self_attn.o_proj", QD, C, false);
    proj("gate_proj", "mlp.gate_proj", C, F, false);
    proj("up_proj", "mlp.up_proj", C, F, false);
    proj("down_proj", "mlp.down_proj", F, C, false);
  }
  for (auto& l : layouts) {
    param_store_.emplace_back(l.size);
    ParamBuffer pb;
    pb.size = l.size;
    pb.layout = std::move(l);
    pb.data = param_store_.back().data();
    params_.push_back(std::move(pb));
  }
  grads_allocate();
}

Model::~Model() = default;

void Model::grads_allocate() {
  grad_store_.clear();
  for (auto& pb : params_) {
    grad_store_.emplace_back(pb.size);
    pb.grad = grad_store_.back().data();
  }
}

// ---------------------------------------------------------------------------
// Parameters

void Model::init_weights(uint64_t seed) {
  storage_enforce_whole("init_weights()");
  const float std_resid = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  uint64_t index = 0;
  for (auto& pb : params_) {
    for (const auto& t : pb.layout.tensors) {
      float* d = pb.data + t.offset;
      const size_t n = t.numel();
      Rng rng(splitmix64(seed ^ splitmix64(++index)));
      if (t.decay) {
        const bool resid = ends_with(t.name, "c_proj.weight") || ends_with(t.name, "o_proj.weight") ||
                           ends_with(t.name, "down_proj.weight");
        const float sd = resid ? std_resid : 0.02f;
        for (size_t i = 0; i < n; ++i) d[i] = rng.normal(0.0f, sd);
      } else {
        const float v = ends_with(t.name, ".bias") ? 0.0f : 1.0f;
        for (size_t i = 0; i < n; ++i) d[i] = v;
      }
    }
  }
}

void Model::zero_grad() {
  for (auto& pb : trainable_params())
    if (pb.grad) std::memset(pb.grad, 0, pb.size * sizeof(float));
}

size_t Model::num_params() const {
  size_t n = 0;
  for (const auto& pb : params_) n += pb.size;
  return n;
}

size_t Model::num_trainable_params() const {
  if (lora_params_.empty()) return num_params();
  size_t n = 0;
  for (const auto& pb : lora_params_) n += pb.size;
  return n;
}

TensorView Model::tensor(const std::string& name) {
  for (auto* list : {&params_, &lora_params_})
    for (auto& pb : *list)
      if (const TensorSpec* t = pb.layout.find(name)) {
        DT_ENFORCE(pb.data != nullptr || pb.size == 0, UsageError,
                   "tensor {} is in buffer {}, whose storage is released (ZeRO stage 3 shards it): materialize "
                   "the parameters (ZeroEngine::params_materialize) before reading them", name, pb.layout.name);
        return TensorView{pb.data + t->offset, DType::F32, t->shape};
      }
  return TensorView{};
}

// ---------------------------------------------------------------------------
// Storage release / restore (ZeRO stages 2-3 replace the model's arrays with shards)

ParamBuffer& Model::buffer_at(size_t i) { return i < params_.size() ? params_[i] : lora_params_[i - params_.size()]; }

Buffer<float>& Model::param_store_at(size_t i) {
  return i < params_.size() ? param_store_[i] : lora_store_[i - params_.size()];
}

void Model::storage_release(bool grads, const std::vector<size_t>& param_buffers) {
  const size_t n = params_.size() + lora_params_.size();
  for (size_t i : param_buffers)
    DT_ENFORCE_LT(i, n, UsageError, "Model::storage_release: parameter buffer index out of range");
  param_released_.resize(n, 0);
  if (grads && !grads_released_) {
    for (auto& b : lora_on() ? lora_grad_store_ : grad_store_) b = Buffer<float>();
    for (auto& pb : trainable_params()) pb.grad = nullptr;
    grads_released_ = true;
  }
  for (size_t i : param_buffers) {
    param_store_at(i) = Buffer<float>();
    buffer_at(i).data = nullptr;
    param_released_[i] = 1;
  }
}

void Model::storage_restore(bool grads, const std::vector<size_t>& param_buffers) {
  const size_t n = params_.size() + lora_params_.size();
  for (size_t i : param_buffers)
    DT_ENFORCE_LT(i, n, UsageError, "Model::storage_restore: parameter buffer index out of range");
  if (grads && grads_released_) {
    auto& store = lora_on() ? lora_grad_store_ : grad_store_;
    auto& bufs = trainable_params();
    DT_CHECK(store.size() == bufs.size());
    for (size_t k = 0; k < bufs.size(); ++k) {
      store[k].resize(bufs[k].size);
      bufs[k].grad = store[k].data();
    }
    grads_released_ = false;
  }
  for (size_t i : param_buffers) {
    if (i >= param_released_.size() || !param_released_[i]) continue;
    Buffer<float>& b = param_store_at(i);
    ParamBuffer& pb = buffer_at(i);
    b.resize(pb.size);
    pb.data = b.data();
    param_released_[i] = 0;
  }
}

void Model::storage_restore() {
  std::vector<size_t> all(param_released_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  storage_restore(true, all);
}

bool Model::storage_released() const {
  if (grads_released_) return true;
  for (char r : param_released_)
    if (r) return true;
  return false;
}

bool Model::param_released(size_t i) const { return i < param_released_.size() && param_released_[i]; }

size_t Model::param_allocated_bytes() const {
  size_t n = 0;
  for (const auto* list : {&param_store_, &lora_store_})
    for (const auto& b : *list) n += b.size();
  return n * sizeof(float);
}

size_t Model::grad_allocated_bytes() const {
  size_t n = 0;
  for (const auto* list : {&grad_store_, &lora_grad_store_})
    for (const auto& b : *list) n += b.size();
  return n * sizeof(float);
}

void Model::storage_enforce_whole(const char* what) const {
  DT_ENFORCE(!storage_released(), UsageError,
             "Model::{} needs the model's own parameter and gradient storage, but part of it is released to the ZeRO "
             "engine (stages 2-3); call it before creating the engine or after it is destroyed", what);
}

// Layer l's base buffer and adapter, after its hook ran (grads: released gradients
// must have been supplied for the trainable one).
void Model::layer_buffers_enforce(int l, bool grads) const {
  buffer_enforce_present(params_[static_cast<size_t>(l) + 1], true, grads && !lora_on());
  if (lora_on()) buffer_enforce_present(lora_params_[static_cast<size_t>(l)], true, grads);
}

// A buffer about to be used must have storage: the model's own or a hook's working copy.
void Model::buffer_enforce_present(const ParamBuffer& pb, bool need_data, bool need_grad) const {
  if (pb.size == 0) return;
  DT_ENFORCE(!need_data || pb.data != nullptr, UsageError,
             "parameter buffer {} has no storage when the model needs it: it is released (ZeRO stage 3) and no hook "
             "gathered it (install the engine's hooks, or call params_materialize() for evaluation)", pb.layout.name);
  DT_ENFORCE(!need_grad || pb.grad != nullptr, UsageError,
             "gradient buffer {} has no storage when backward needs it: gradients are released (ZeRO stages 2-3) and "
             "no hook supplied a working buffer (install the engine's hooks)", pb.layout.name);
}

void Model::set_recompute(bool on) {
  if (on != recompute_) {
    recompute_ = on;
    B_ = T_ = 0;  // re-allocate the activation sets on the next forward
    have_targets_ = false;
  }
}

// ---------------------------------------------------------------------------
// Activations

void Model::allocate(int B, int T) {
  const size_t N = static_cast<size_t>(B) * T, C = cfg_.d_model, F = cfg_.d_ff, V = cfg_.vocab_size;
  const size_t QD = static_cast<size_t>(cfg_.n_head) * cfg_.head_dim(), KD = static_cast<size_t>(cfg_.n_kv_head) * cfg_.head_dim();
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  residuals_.clear();
  for (int l = 0; l <= cfg_.n_layer; ++l) residuals_.emplace_back(N * C);
  acts_.clear();
  const int sets = recompute_ ? 1 : cfg_.n_layer;
  for (int s = 0; s < sets; ++s) {
    auto a = std::make_unique<LayerActs>();
    a->ln1.resize(N * C);
    a->ln1_mean.resize(N);
    a->ln1_rstd.resize(N);
    if (gpt2) a->qkv.resize(N * (QD + 2 * KD));
    a->q.resize(N * QD);
    a->k.resize(N * KD);
    a->v.resize(N * KD);
    a->att.resize(static_cast<size_t>(B) * cfg_.n_head * T * T);
    a->atty.resize(N * QD);
    a->attproj.resize(N * C);
    a->res2.resize(N * C);
    a->ln2.resize(N * C);
    a->ln2_mean.resize(N);
    a->ln2_rstd.resize(N);
    a->fc.resize(N * F);
    if (!gpt2) a->up.resize(N * F);
    a->act.resize(N * F);
    a->mlp.resize(N * C);
    a->lora.resize(projs_.size());
    acts_.push_back(std::move(a));
  }
  lnf_.resize(N * C);
  lnf_mean_.resize(N);
  lnf_rstd_.resize(N);
  logits_.resize(N * V);
  losses_.resize(N);
  Scratch& s = *scratch_;
  s.dres.resize(N * C);
  s.dln.resize(N * C);
  if (gpt2) s.dqkv.resize(N * (QD + 2 * KD));
  s.dq.resize(N * QD);
  s.dk.resize(N * KD);
  s.dv.resize(N * KD);
  s.datty.resize(N * QD);
  s.dfc.resize(N * F);
  if (!gpt2) s.dup.resize(N * F);
  s.dact.resize(N * F);
  B_ = B;
  T_ = T;
}

Model::LayerActs& Model::acts_for(int l) { return *acts_[recompute_ ? 0 : static_cast<size_t>(l)]; }

// ---------------------------------------------------------------------------
// Projections (base linear + optional LoRA adapter)

void Model::proj_forward(int l, int p, const float* x, float* y, LayerActs& a) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  const int N = B_ * T_;
  const float* W = pb.data + pb.layout.tensors[static_cast<size_t>(pr.w)].offset;
  const float* b = pr.b >= 0 ? pb.data + pb.layout.tensors[static_cast<size_t>(pr.b)].offset : nullptr;
  ops::linear_forward(y, x, W, b, N, pr.in, pr.out);
  if (lora_on()) {
    const int slot = lora_slot_[static_cast<size_t>(l)][static_cast<size_t>(p)];
    if (slot < 0) return;
    const ParamBuffer& lb = lora_params_[static_cast<size_t>(l)];
    const float* A = lb.data + lb.layout.tensors[static_cast<size_t>(slot)].offset;
    const float* B = lb.data + lb.layout.tensors[static_cast<size_t>(slot) + 1].offset;
    const uint64_t seed = splitmix64(lora_cfg_.seed ^ splitmix64(acts_step_ * 4096 + static_cast<uint64_t>(l) * 16 + p + 1));
    lora_forward(y, x, A, B, N, pr.in, pr.out, lora_cfg_.rank, lora_cfg_.scale(), acts_dropout_, seed,
                 a.lora[static_cast<size_t>(p)]);
  }
}

void Model::proj_backward(int l, int p, const float* dy, const float* x, float* dx, LayerActs& a) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  const int N = B_ * T_;
  const TensorSpec& wt = pb.layout.tensors[static_cast<size_t>(pr.w)];
  const float* W = pb.data + wt.offset;
  float* dW = pb.grad ? pb.grad + wt.offset : nullptr;
  float* db = pb.grad && pr.b >= 0 ? pb.grad + pb.layout.tensors[static_cast<size_t>(pr.b)].offset : nullptr;
  ops::linear_backward(dx, dW, db, dy, x, W, N, pr.in, pr.out);
  if (lora_on()) {
    const int slot = lora_slot_[static_cast<size_t>(l)][static_cast<size_t>(p)];
    if (slot < 0) return;
    const ParamBuffer& lb = lora_params_[static_cast<size_t>(l)];
    const size_t oa = lb.layout.tensors[static_cast<size_t>(slot)].offset;
    const size_t ob = lb.layout.tensors[static_cast<size_t>(slot) + 1].offset;
    lora_backward(dx, lb.grad + oa, lb.grad + ob, dy, x, lb.data + oa, lb.data + ob, N, pr.in, pr.out,
                  lora_cfg_.rank, lora_cfg_.scale(), acts_dropout_, a.lora[static_cast<size_t>(p)]);
  }
}

// ---------------------------------------------------------------------------
// One transformer layer

void Model::layer_forward(int l, LayerActs& a) {
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HD = cfg_.head_dim();
  const size_t F = static_cast<size_t>(cfg_.d_ff) * N;
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  auto P = [&](size_t i) { return pb.data + pb.layout.tensors[i].offset; };
  const float* x = residuals_[static_cast<size_t>(l)].data();
  float* out = residuals_[static_cast<size_t>(l) + 1].data();

  if (gpt2) {
    // tensors: 0 ln_1.w 1 ln_1.b ... 6 ln_2.w 7 ln_2.b
    ops::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, P(0), P(1), N, C, cfg_.norm_eps);
    proj_forward(l, GPT2_C_ATTN, a.ln1.data(), a.qkv.data(), a);
    // split [N, QD + 2 KD] rows into q, k, v
    const size_t QD = static_cast<size_t>(NH) * HD, KD = static_cast<size_t>(NKV) * HD, W = QD + 2 * KD;
    for (int n = 0; n < N; ++n) {
      const float* r = a.qkv.data() + n * W;
      std::memcpy(a.q.data() + n * QD, r, QD * sizeof(float));
      std::memcpy(a.k.data() + n * KD, r + QD, KD * sizeof(float));
      std::memcpy(a.v.data() + n * KD, r + QD + KD, KD * sizeof(float));
    }
  } else {
    // tensors: 0 input_layernorm 5 post_attention_layernorm
    ops::rmsnorm_forward(a.ln1.data(), a.ln1_rstd.data(), x, P(0), N, C, cfg_.norm_eps);
    proj_forward(l, LL_Q, a.ln1.data(), a.q.data(), a);
    proj_forward(l, LL_K, a.ln1.data(), a.k.data(), a);
    proj_forward(l, LL_V, a.ln1.data(), a.v.data(), a);
    ops::rope_forward(a.q.data(), a.k.data(), B, T, NH, NKV, HD, cfg_.rope_theta);
  }
  ops::attention_forward(a.atty.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T, NH, NKV, HD);
  proj_forward(l, gpt2 ? GPT2_ATTN_PROJ : LL_O, a.atty.data(), a.attproj.data(), a);
  ops::residual_forward(a.res2.data(), x, a.attproj.data(), static_cast<size_t>(N) * C);
  if (gpt2) {
    ops::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), P(6), P(7), N, C, cfg_.norm_eps);
    proj_forward(l, GPT2_FC, a.ln2.data(), a.fc.data(), a);
    ops::gelu_forward(a.act.data(), a.fc.data(), F);
    proj_forward(l, GPT2_MLP_PROJ, a.act.data(), a.mlp.data(), a);
  } else {
    ops::rmsnorm_forward(a.ln2.data(), a.ln2_rstd.data(), a.res2.data(), P(5), N, C, cfg_.norm_eps);
    proj_forward(l, LL_GATE, a.ln2.data(), a.fc.data(), a);
    proj_forward(l, LL_UP, a.ln2.data(), a.up.data(), a);
    ops::swiglu_forward(a.act.data(), a.fc.data(), a.up.data(), F);
    proj_forward(l, LL_DOWN, a.act.data(), a.mlp.data(), a);
  }
  ops::residual_forward(out, a.res2.data(), a.mlp.data(), static_cast<size_t>(N) * C);
}

// On entry scratch.dres holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
void Model::layer_backward(int l, LayerActs& a) {
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HD = cfg_.head_dim();
  const size_t F = static_cast<size_t>(cfg_.d_ff) * N;
  const ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
  auto P = [&](size_t i) { return pb.data + pb.layout.tensors[i].offset; };
  auto G = [&](size_t i) { return pb.grad ? pb.grad + pb.layout.tensors[i].offset : nullptr; };
  Scratch& s = *scratch_;
  float* dres = s.dres.data();
  const float* x = residuals_[static_cast<size_t>(l)].data();

  // MLP branch: d(mlp) = dres, and dres also flows straight to res2.
  s.dact.zero();
  proj_backward(l, gpt2 ? GPT2_MLP_PROJ : LL_DOWN, dres, a.act.data(), s.dact.data(), a);
  s.dfc.zero();
  s.dln.zero();
  if (gpt2) {
    ops::gelu_backward(s.dfc.data(), a.fc.data(), s.dact.data(), F);
    proj_backward(l, GPT2_FC, s.dfc.data(), a.ln2.data(), s.dln.data(), a);
    ops::layernorm_backward(dres, G(6), G(7), s.dln.data(), a.res2.data(), P(6), a.ln2_mean.data(),
                            a.ln2_rstd.data(), N, C);
  } else {
    s.dup.zero();
    ops::swiglu_backward(s.dfc.data(), s.dup.data(), s.dact.data(), a.fc.data(), a.up.data(), F);
    proj_backward(l, LL_GATE, s.dfc.data(), a.ln2.data(), s.dln.data(), a);
    proj_backward(l, LL_UP, s.dup.data(), a.ln2.data(), s.dln.data(), a);
    ops::rmsnorm_backward(dres, G(5), s.dln.data(), a.res2.data(), P(5), a.ln2_rstd.data(), N, C);
  }

  // Attention branch: d(attproj) = dres (now d(res2)), which also flows to x.
  s.datty.zero();
  proj_backward(l, gpt2 ? GPT2_ATTN_PROJ : LL_O, dres, a.atty.data(), s.datty.data(), a);
  s.dq.zero();
  s.dk.zero();
  s.dv.zero();
  ops::attention_backward(s.dq.data(), s.dk.data(), s.dv.data(), s.datty.data(), a.att.data(), a.q.data(),
                          a.k.data(), a.v.data(), B, T, NH, NKV, HD);
  s.dln.zero();
  if (gpt2) {
    const size_t QD = static_cast<size_t>(NH) * HD, KD = static_cast<size_t>(NKV) * HD, W = QD + 2 * KD;
    for (int n = 0; n < N; ++n) {
      float* r = s.dqkv.data() + n * W;
      std::memcpy(r, s.dq.data() + n * QD, QD * sizeof(float));
      std::memcpy(r + QD, s.dk.data() + n * KD, KD * sizeof(float));
      std::memcpy(r + QD + KD, s.dv.data() + n * KD, KD * sizeof(float));
    }
    proj_backward(l, GPT2_C_ATTN, s.dqkv.data(), a.ln1.data(), s.dln.data(), a);
    ops::layernorm_backward(dres, G(0), G(1), s.dln.data(), x, P(0), a.ln1_mean.data(), a.ln1_rstd.data(), N, C);
  } else {
    ops::rope_backward(s.dq.data(), s.dk.data(), B, T, NH, NKV, HD, cfg_.rope_theta);
    proj_backward(l, LL_Q, s.dq.data(), a.ln1.data(), s.dln.data(), a);
    proj_backward(l, LL_K, s.dk.data(), a.ln1.data(), s.dln.data(), a);
    proj_backward(l, LL_V, s.dv.data(), a.ln1.data(), s.dln.data(), a);
    ops::rmsnorm_backward(dres, G(0), s.dln.data(), x, P(0), a.ln1_rstd.data(), N, C);
  }
}

// ---------------------------------------------------------------------------
// Whole model

float Model::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  DT_ENFORCE_GT(B, 0, UsageError, "model forward batch size");
  DT_ENFORCE_GT(T, 0, UsageError, "model forward sequence length");
  DT_ENFORCE_LE(T, cfg_.max_seq_len, UsageError, "sequence length exceeds the model's max_seq_len");
  if (B != B_ || T != T_) allocate(B, T);
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  const int N = B * T, C = cfg_.d_model, V = cfg_.vocab_size, L = cfg_.n_layer;
  tokens_.assign(tokens, tokens + N);
  acts_step_ = forward_count_++;
  acts_dropout_ = training_ && lora_on() ? lora_cfg_.dropout : 0.0f;
  have_targets_ = false;

  if (hooks_.before_layer_forward) hooks_.before_layer_forward(-1);
  const ParamBuffer& emb = params_.front();
  buffer_enforce_present(emb, true, false);
  ops::embedding_forward(residuals_[0].data(), tokens_.data(), emb.data,
                         gpt2 ? emb.data + emb.layout.tensors[1].offset : nullptr, B, T, C, V);
  for (int l = 0; l < L; ++l) {
    if (hooks_.before_layer_forward) hooks_.before_layer_forward(l);
    layer_buffers_enforce(l, false);
    layer_forward(l, acts_for(l));
  }
  if (hooks_.before_layer_forward) hooks_.before_layer_forward(L);
  const ParamBuffer& head = params_.back();
  buffer_enforce_present(head, true, false);
  if (cfg_.tie_embeddings) buffer_enforce_present(emb, true, false);
  const float* xL = residuals_[static_cast<size_t>(L)].data();
  if (gpt2)
    ops::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), xL, head.data,
                           head.data + head.layout.tensors[1].offset, N, C, cfg_.norm_eps);
  else
    ops::rmsnorm_forward(lnf_.data(), lnf_rstd_.data(), xL, head.data, N, C, cfg_.norm_eps);
  const float* wlm = cfg_.tie_embeddings ? emb.data : head.data + head.layout.tensors.back().offset;
  ops::linear_forward(logits_.data(), lnf_.data(), wlm, nullptr, N, C, V);

  if (!targets) return std::numeric_limits<float>::quiet_NaN();
  targets_.assign(targets, targets + N);
  float loss = ops::cross_entropy_forward(losses_.data(), logits_.data(), targets_.data(), N, V);
  num_targets_ = ops::cross_entropy_count(targets_.data(), N);
  have_targets_ = true;
  return loss;
}

void Model::backward(float grad_scale) {
  DT_ENFORCE(have_targets_, UsageError, "Model::backward() needs a forward() with targets since the last backward()");
  have_targets_ = false;
  const bool gpt2 = cfg_.arch == ModelConfig::Arch::GPT2;
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, V = cfg_.vocab_size, L = cfg_.n_layer;
  ParamBuffer& emb = params_.front();
  ParamBuffer& head = params_.back();
  Scratch& s = *scratch_;

  if (hooks_.before_layer_backward) hooks_.before_layer_backward(L);
  const bool base_grads = grads_released_ && !lora_on();  // hooks must supply the base gradients
  buffer_enforce_present(head, true, base_grads);
  if (cfg_.tie_embeddings) buffer_enforce_present(emb, true, base_grads);
  const float scale = num_targets_ > 0 ? grad_scale / static_cast<float>(num_targets_) : 0.0f;
  float* dlogits = logits_.data();
  ops::cross_entropy_backward(dlogits, logits_.data(), targets_.data(), N, V, scale);
  const size_t lm_off = cfg_.tie_embeddings ? 0 : head.layout.tensors.back().offset;
  const float* wlm = cfg_.tie_embeddings ? emb.data : head.data + lm_off;
  float* dwlm = cfg_.tie_embeddings ? emb.grad : (head.grad ? head.grad + lm_off : nullptr);
  s.dln.zero();
  ops::linear_backward(s.dln.data(), dwlm, nullptr, dlogits, lnf_.data(), wlm, N, C, V);
  s.dres.zero();
  const float* xL = residuals_[static_cast<size_t>(L)].data();
  float* gw = head.grad;
  if (gpt2)
    ops::layernorm_backward(s.dres.data(), gw, gw ? gw + head.layout.tensors[1].offset : nullptr, s.dln.data(), xL,
                            head.data, lnf_mean_.data(), lnf_rstd_.data(), N, C);
  else
    ops::rmsnorm_backward(s.dres.data(), gw, s.dln.data(), xL, head.data, lnf_rstd_.data(), N, C);
  if (hooks_.after_layer_backward) hooks_.after_layer_backward(L);

  for (int l = L - 1; l >= 0; --l) {
    if (hooks_.before_layer_backward) hooks_.before_layer_backward(l);
    layer_buffers_enforce(l, grads_released_);
    LayerActs& a = acts_for(l);
    if (recompute_) layer_forward(l, a);
    layer_backward(l, a);
    if (hooks_.after_layer_backward) hooks_.after_layer_backward(l);
  }

  if (hooks_.before_layer_backward) hooks_.before_layer_backward(-1);
  buffer_enforce_present(emb, false, base_grads);
  if (emb.grad)
    ops::embedding_backward(emb.grad, gpt2 ? emb.grad + emb.layout.tensors[1].offset : nullptr, s.dres.data(),
                            tokens_.data(), B, T, C);
  if (hooks_.after_layer_backward) hooks_.after_layer_backward(-1);
}

// ---------------------------------------------------------------------------
// LoRA

void Model::lora_enable(const LoraConfig& lcfg) {
  DT_ENFORCE(!lora_on(), UsageError, "LoRA is already enabled on this model");
  storage_enforce_whole("lora_enable()");
  lcfg.validate(cfg_);
  lora_cfg_ = lcfg;
  const int r = lcfg.rank;
  lora_slot_.assign(static_cast<size_t>(cfg_.n_layer), std::vector<int>(projs_.size(), -1));
  std::vector<BufferLayout> layouts;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    BufferLayout b{"lora.layers." + std::to_string(l), l, {}, 0};
    for (size_t p = 0; p < projs_.size(); ++p) {
      const Proj& pr = projs_[p];
      bool on = false;
      for (const auto& t : lcfg.targets) on = on || t == pr.short_name;
      if (!on) continue;
      lora_slot_[static_cast<size_t>(l)][p] = static_cast<int>(b.tensors.size());
      const std::string path = layer_prefix(cfg_, l) + "." + pr.module;
      for (bool is_b : {false, true}) {
        TensorSpec t{lora_tensor_name(path, is_b), b.size,
                     is_b ? std::vector<int64_t>{pr.out, r} : std::vector<int64_t>{r, pr.in}, true, false};
        b.size += t.numel();
        b.tensors.push_back(std::move(t));
      }
    }
    layouts.push_back(std::move(b));
  }
  uint64_t index = 0;
  for (auto& l : layouts) {
    lora_store_.emplace_back(l.size);
    lora_grad_store_.emplace_back(l.size);
    ParamBuffer pb;
    pb.size = l.size;
    pb.data = lora_store_.back().data();
    pb.grad = lora_grad_store_.back().data();
    // A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT: kaiming_uniform_(a=sqrt(5))); B = 0.
    for (const auto& t : l.tensors) {
      ++index;
      if (ends_with(t.name, "lora_B.weight")) continue;
      Rng rng(splitmix64(lcfg.seed ^ splitmix64(index)));
      const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
      for (size_t i = 0; i < t.numel(); ++i) pb.data[t.offset + i] = rng.uniform(-bound, bound);
    }
    pb.layout = std::move(l);
    lora_params_.push_back(std::move(pb));
  }
  grad_store_.clear();
  for (auto& pb : params_) pb.grad = nullptr;
}

void Model::lora_merge() {
  DT_ENFORCE(lora_on(), UsageError, "lora_merge() called on a model without LoRA adapters");
  storage_enforce_whole("lora_merge()");
  for (int l = 0; l < cfg_.n_layer; ++l) {
    ParamBuffer& pb = params_[static_cast<size_t>(l) + 1];
    const ParamBuffer& lb = lora_params_[static_cast<size_t>(l)];
    for (size_t p = 0; p < projs_.size(); ++p) {
      const int slot = lora_slot_[static_cast<size_t>(l)][p];
      if (slot < 0) continue;
      const Proj& pr = projs_[p];
      lora_merge_into(pb.data + pb.layout.tensors[static_cast<size_t>(pr.w)].offset,
                      lb.data + lb.layout.tensors[static_cast<size_t>(slot)].offset,
                      lb.data + lb.layout.tensors[static_cast<size_t>(slot) + 1].offset, pr.in, pr.out,
                      lora_cfg_.rank, lora_cfg_.scale());
    }
  }
  lora_params_.clear();
  lora_store_.clear();
  lora_grad_store_.clear();
  lora_slot_.clear();
  have_targets_ = false;
  grads_allocate();
}

}  // namespace dtrain::model
