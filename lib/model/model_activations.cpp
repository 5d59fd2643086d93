// ModelActivations: the arena for (B, T), laid out once to measure it and once over the
// allocation; the switches that invalidate it; the read-backs of logits and losses.
#include "model/model_arena.h"

#include "core/check.h"

#include <algorithm>

namespace dtrain::model {

namespace {

// On a device the logits rows are padded to a multiple of this many elements (GPT-2's
// 50257 -> 50304): every row starts 16-byte aligned, so the cross-entropy kernel reads
// whole 16-byte packs from each row's first element, and the logits GEMMs' leading
// dimension is a multiple of 128, which cuBLASLt's tensor-core tiles prefer. Only the
// first V columns are ever written or read: the padding never reaches the loss, a
// gradient or a parameter (the head keeps V rows). On the CPU the rows stay packed:
// logits() hands them out as [B, T, V], and BLAS packs its panels whatever the pitch.
constexpr size_t LOGITS_ROW_ALIGN = 128;

// Bump allocator over one base address. The plan runs twice: from address 0 to measure
// the arena, then over the real allocation. Regions are 256-byte aligned (the best
// alignment for every kernel and cuBLASLt).
class Carver {
 public:
  explicit Carver(void* base) : base_(reinterpret_cast<uintptr_t>(base)) {}
  void* bytes(size_t n) {
    off_ = (off_ + 255) & ~size_t{255};
    void* p = reinterpret_cast<void*>(base_ + off_);
    off_ += n;
    return p;
  }
  template <typename T>
  T* of(size_t n) {
    return static_cast<T*>(bytes(n * sizeof(T)));
  }
  size_t size() const { return off_; }

 private:
  uintptr_t base_;
  size_t off_ = 0;
};

// The arena's arrays in the model's dtype, and the widths they are made of.
struct ArenaCarve {
  Carver& c;
  size_t es, N, C, F, QD, KD;
  bool qkv_one, gate_up_fused, gpt2;

  void* act(size_t n) const { return c.bytes(n * es); }
  // q, k, v (or their gradients): GPT-2's (and fused Llama's) are the column blocks of one
  // [N, QD + 2 KD] array (the projection's rows), unfused Llama's three dense arrays.
  void qkv(void*& q, void*& k, void*& v) const {
    if (qkv_one) {
      q = act(N * (QD + 2 * KD));
      k = static_cast<char*>(q) + QD * es;
      v = static_cast<char*>(k) + KD * es;
    } else {
      q = act(N * QD);
      k = act(N * KD);
      v = act(N * KD);
    }
  }
  // gate and up (or their gradients): the column blocks of one [N, 2F] array when fused;
  // GPT-2's c_fc output alone.
  void gate_up(void*& g, void*& u) const {
    if (gate_up_fused) {
      g = act(N * 2 * F);
      u = static_cast<char*>(g) + F * es;
    } else {
      g = act(N * F);
      u = gpt2 ? nullptr : act(N * F);
    }
  }
};

// One layer's saved activations (the order of their regions in the arena is this).
void layer_acts_plan(const ArenaCarve& k, ModelActivations::LayerActs& a, const ModelActivations::ArenaShape& sh,
                     const ModelConfig& cfg, size_t att_floats) {
  const size_t N = k.N, C = k.C, F = k.F;
  Carver& c = k.c;
  a.ln1 = k.act(N * C);
  a.ln1_mean = c.of<float>(N);
  a.ln1_rstd = c.of<float>(N);
  k.qkv(a.q, a.k, a.v);  // GPT-2: c_attn's output rows, read in place by attention (strided q, k, v)
  a.att = c.of<float>(att_floats);
  if (cfg.qk_norm) {
    a.qpre = k.act(N * k.QD);
    a.kpre = k.act(N * k.KD);
    a.qn_rstd = c.of<float>(N * static_cast<size_t>(cfg.n_head));
    a.kn_rstd = c.of<float>(N * static_cast<size_t>(cfg.n_kv_head));
  }
  a.atty = k.act(N * k.QD);
  a.res2 = k.act(N * C);
  a.ln2 = k.act(N * C);
  a.ln2_mean = c.of<float>(N);
  a.ln2_rstd = c.of<float>(N);
  k.gate_up(a.fc, a.up);
  a.act = k.act(N * F);
  const size_t projs = sh.adapted.size();
  a.lora_h.assign(projs, nullptr);
  a.lora_xd.assign(projs, nullptr);
  for (size_t p = 0; p < projs; ++p) {
    if (!sh.adapted[p]) continue;
    a.lora_h[p] = k.act(N * sh.r);
    if (sh.xd) a.lora_xd[p] = k.act(N * static_cast<size_t>(sh.proj_in[p]));
  }
}

// The head's activations, the inputs and the backward scratch.
void scratch_plan(const ArenaCarve& k, ModelActivations::Scratch& s, const ModelActivations::ArenaShape& sh,
                  const ModelConfig& cfg, size_t logits_ld) {
  const size_t N = k.N, C = k.C, F = k.F;
  Carver& c = k.c;
  s.attproj = k.act(N * C);
  s.mlp = k.act(N * C);
  s.lnf = k.act(N * C);
  s.lnf_mean = c.of<float>(N);
  s.lnf_rstd = c.of<float>(N);
  s.logits = k.act(N * logits_ld);
  s.losses = c.of<float>(N);
  s.loss_mean = c.of<float>(1);
  s.num_targets = c.of<float>(1);
  s.tokens = c.of<int32_t>(N);
  s.targets = c.of<int32_t>(N);
  s.doc_start = c.of<int32_t>(N);
  s.dres = k.act(N * C);
  s.dln = k.act(N * C);
  k.qkv(s.dq, s.dk, s.dv);  // GPT-2, fused: attention's backward writes into the projection's gradient rows
  if (k.qkv_one) s.dqkv = s.dq;
  s.datty = k.act(N * k.QD);
  if (cfg.qk_norm) {
    s.dqpre = k.act(N * k.QD);
    s.dkpre = k.act(N * k.KD);
  }
  k.gate_up(s.dfc, s.dup);
  s.dact = sh.dact ? k.act(N * F) : nullptr;
  size_t max_in = 0;
  for (int in : sh.proj_in) max_in = std::max(max_in, static_cast<size_t>(in));
  s.dh = sh.r ? k.act(N * sh.r) : nullptr;
  s.dxd = sh.xd ? k.act(N * max_in) : nullptr;
}

}  // namespace

ModelActivations::ModelActivations(const ModelConfig& cfg, device::Device& dev, DType dtype, bool deferred, bool grads)
    : ModelParams(cfg, dev, dtype, deferred, grads), scratch_(std::make_unique<Scratch>()) {}

ModelActivations::~ModelActivations() = default;

// ---------------------------------------------------------------------------
// The arena: one for (B, T)

void ModelActivations::set_recompute_layers(int layers) {
  DT_ENFORCE(layers >= 0 && layers <= cfg_.n_layer, UsageError, "recompute {} layers of a {}-layer model", layers,
             cfg_.n_layer);
  if (layers != recompute_layers_) {
    recompute_layers_ = layers;
    activations_invalidate();  // re-allocate the activation sets on the next forward
  }
}

void ModelActivations::set_fused_projections(bool on) {
  if (on == fuse_on_) return;
  fuse_on_ = on;
  activations_invalidate();  // the activation layout changes: re-allocate on the next forward
}

void ModelActivations::arena_allocate(const ArenaShape& sh) {
  ++buffers_version_;
  // One set per kept layer, and one the recomputed layers share.
  act_set_.assign(static_cast<size_t>(cfg_.n_layer), 0);
  int sets = 0;
  for (int l = 0; l < cfg_.n_layer; ++l)
    if (!recompute_layer_at(l, recompute_layers_, cfg_.n_layer)) act_set_[static_cast<size_t>(l)] = sets++;
  if (recompute_layers_ > 0) {
    for (int l = 0; l < cfg_.n_layer; ++l)
      if (recompute_layer_at(l, recompute_layers_, cfg_.n_layer)) act_set_[static_cast<size_t>(l)] = sets;
    ++sets;
  }
  const size_t V = cfg_.vocab_size;
  arena_.reset();
  logits_ld_ = static_cast<int>(on_host() ? V : (V + LOGITS_ROW_ALIGN - 1) / LOGITS_ROW_ALIGN * LOGITS_ROW_ALIGN);
  residuals_.assign(static_cast<size_t>(cfg_.n_layer) + 1, nullptr);
  acts_.clear();
  for (int s = 0; s < sets; ++s) acts_.push_back(std::make_unique<LayerActs>());
  const size_t N = static_cast<size_t>(sh.B) * sh.T, hd = static_cast<size_t>(cfg_.head_dim());
  const size_t att_floats = dev_->attention_saved_floats(sh.B, sh.T, cfg_.n_head);
  auto plan = [&](Carver& c) {
    const ArenaCarve k{c,
                       dtype_size(dtype_),
                       N,
                       static_cast<size_t>(cfg_.d_model),
                       static_cast<size_t>(cfg_.d_ff),
                       static_cast<size_t>(cfg_.n_head) * hd,
                       static_cast<size_t>(cfg_.n_kv_head) * hd,
                       qkv_one_array(),
                       fused_gate_up(),
                       cfg_.arch == ModelConfig::Arch::GPT2};
    for (auto& res : residuals_) res = k.act(N * k.C);
    for (auto& a : acts_) layer_acts_plan(k, *a, sh, cfg_, att_floats);
    scratch_plan(k, *scratch_, sh, cfg_, static_cast<size_t>(logits_ld_));
  };
  Carver measure(nullptr);
  plan(measure);
  arena_ = device::DeviceBuffer(*dev_, measure.size());
  Carver real(arena_.get());
  plan(real);
  DT_CHECK(real.size() == measure.size());
  B_ = sh.B;
  T_ = sh.T;
}

ModelActivations::LayerActs& ModelActivations::acts_for(int l) {
  return *acts_[static_cast<size_t>(act_set_[static_cast<size_t>(l)])];
}

const int32_t* ModelActivations::doc_starts() const { return docs_ ? scratch_->doc_start : nullptr; }

// ---------------------------------------------------------------------------
// Read-backs

std::vector<float> ModelActivations::logits_to_host() const {
  DT_ENFORCE(scratch_ && B_ > 0, UsageError, "logits_to_host(): no forward has run");
  const size_t N = static_cast<size_t>(B_) * T_, V = cfg_.vocab_size, ld = logits_ld_;
  std::vector<float> out(N * V);
  const size_t esz = dtype_size(dtype_);
  std::vector<char> staged(N * ld * esz);
  dev_->copy_d2h(staged.data(), scratch_->logits, staged.size());
  const std::vector<int64_t> shape{static_cast<int64_t>(V)};
  for (size_t n = 0; n < N; ++n)
    tensor_copy(TensorView{out.data() + n * V, DType::F32, shape},
                TensorView{staged.data() + n * ld * esz, dtype_, shape});
  return out;
}

const float* ModelActivations::logits() const {
  host_enforce("logits()");
  return static_cast<const float*>(scratch_->logits);
}

const float* ModelActivations::losses() const {
  host_enforce("losses()");
  return scratch_->losses;
}

std::vector<float> ModelActivations::token_losses_to_host() const {
  DT_ENFORCE(have_targets_, UsageError, "Model::token_losses_to_host() needs a forward() with targets");
  std::vector<float> out(static_cast<size_t>(B_) * static_cast<size_t>(T_));
  dev_->copy_d2h(out.data(), scratch_->losses, out.size() * sizeof(float));
  return out;
}

}  // namespace dtrain::model
