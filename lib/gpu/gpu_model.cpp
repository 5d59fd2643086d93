// GpuTrainer on the kernels/ launchers: the arena plan, parameter upload, the GPT-2 /
// Llama layer forward and backward (llm.c structure: fused residual + norm, GEMM
// epilogues, flash attention, fused cross-entropy in place on the logits), LoRA through
// cuBLASLt GEMMs, and the optimizer step of the CPU trainer (token-weighted loss, loss
// scaler, global-norm clip, AdamW writing the compute copy). CPU-only builds get a
// factory that throws DeviceError.
#include "gpu/gpu_model.h"

#include "core/check.h"

#ifdef DTRAIN_HAVE_CUDA
#include "core/cuda_check.h"
#include "kernels/activation.cuh"
#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/device.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemm.cuh"
#include "kernels/norm.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rope.cuh"
#include "train/grad_clip.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#endif

namespace dtrain::gpu {

#ifndef DTRAIN_HAVE_CUDA

int gpu_device_count() { return 0; }

void gpu_device_require(int) {
  DT_THROW(DeviceError,
           "the GPU path is not available: this dtrain was built without CUDA (rebuild with "
           "-DDTRAIN_CUDA=ON where nvcc is installed)");
}

std::unique_ptr<GpuTrainer> gpu_trainer_create(model::Model&, const GpuTrainOptions& opts) {
  gpu_device_require(opts.device);
  return nullptr;  // not reached
}

#else

int gpu_device_count() { return kernels::device_count(); }

void gpu_device_require(int device) {
  const int ndev = kernels::device_count();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  DT_ENFORCE(ndev > 0, DeviceError, "no CUDA device is visible (CUDA_VISIBLE_DEVICES='{}'); the GPU path needs one",
             visible ? visible : "");
  DT_ENFORCE(device >= 0 && device < ndev, DeviceError, "CUDA device {} does not exist ({} visible)", device, ndev);
}

namespace {

constexpr int32_t IGNORE_INDEX = -100;
constexpr size_t CUBLASLT_WORKSPACE_BYTES = 32u << 20;  // kernels/gemm.cu, one per device

// ----------------------------------------------------------------------------
// RAII holders and the arena plan.

class DeviceAlloc {
 public:
  DeviceAlloc() = default;
  // Zeroed on `stream`, the one every later kernel runs on: a cudaMemset on the legacy
  // stream would not be ordered before work on a cudaStreamNonBlocking stream.
  DeviceAlloc(size_t bytes, cudaStream_t stream) : bytes_(bytes) {
    DT_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    DT_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes, stream));
  }
  ~DeviceAlloc() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  DeviceAlloc(const DeviceAlloc&) = delete;
  DeviceAlloc& operator=(const DeviceAlloc&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedAlloc {
 public:
  explicit PinnedAlloc(size_t bytes) { DT_CUDA_CHECK(cudaMallocHost(&ptr_, bytes)); }
  ~PinnedAlloc() { (void)cudaFreeHost(ptr_); }
  PinnedAlloc(const PinnedAlloc&) = delete;
  PinnedAlloc& operator=(const PinnedAlloc&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

class Stream {
 public:
  Stream() { DT_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Bump allocator over one base address. The plan runs twice: once from address 0 to
// measure the arena, once over the real allocation; every region is 256-byte aligned so
// each kernel and GEMM sees its best alignment.
class Carver {
 public:
  explicit Carver(char* base) : base_(reinterpret_cast<uintptr_t>(base)) {}
  void* bytes(size_t n) {
    off_ = (off_ + 255) & ~size_t{255};
    void* p = reinterpret_cast<void*>(base_ + off_);
    off_ += n;
    return p;
  }
  template <typename T> T* of(size_t n) { return static_cast<T*>(bytes(n * sizeof(T))); }
  size_t size() const { return off_; }

 private:
  uintptr_t base_;
  size_t off_ = 0;
};

// ----------------------------------------------------------------------------
// Model pieces.

// One parameter buffer on the device, same layout (offsets in elements) as the CPU one.
struct DevBuffer {
  model::BufferLayout layout;
  bool trainable = false;
  void* compute = nullptr;  // compute dtype
  float* master = nullptr;  // fp32; == compute under F32; null for frozen buffers otherwise
  float* grad = nullptr;    // fp32, trainable only
  float* m = nullptr;
  float* v = nullptr;
  struct Run {
    size_t offset, n;
    bool decay;
  };
  std::vector<Run> runs;  // consecutive tensors with one decay flag: one AdamW launch each
};

struct Proj {
  std::string short_name, module;
  int in = 0, out = 0;
  int w = -1, b = -1;  // tensor indices in the layer buffer
};

struct LayerActs {
  void *x, *ln1, *q, *k, *v, *atty, *res2, *ln2, *fc, *up, *act;
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
  std::vector<void*> lora_h;  // per projection: x A^T [N, r] (null when not adapted)
};

int tensor_index(const model::BufferLayout& b, const std::string& name) {
  for (size_t i = 0; i < b.tensors.size(); ++i)
    if (b.tensors[i].name == name) return static_cast<int>(i);
  return -1;
}

// ----------------------------------------------------------------------------
class CudaTrainer final : public GpuTrainer {
 public:
  CudaTrainer(model::Model& init, const GpuTrainOptions& opts);

  const model::ModelConfig& config() const override { return cfg_; }
  const GpuTrainOptions& options() const override { return opts_; }
  GpuStepResult step(const int32_t* inputs, const int32_t* targets, int accum, float lr) override;
  float forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale) override;
  void zero_grad() override;
  std::vector<std::vector<float>> grads_to_host() override;
  void weights_to_model(model::Model& m) override;
  GpuMemory memory() const override;
  std::string device_name() const override { return device_name_; }
  int64_t applied_steps() const override { return step_count_; }
  void synchronize() override { DT_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  void plan(Carver& c);
  void upload(const std::vector<model::ParamBuffer>& base, const std::vector<model::ParamBuffer>& lora);
  int64_t stage_tokens(const int32_t* inputs, const int32_t* targets, int accum, std::vector<int64_t>& counts);
  void forward(const int32_t* tokens, const int32_t* targets, float ce_scale, float* loss);
  void backward(const int32_t* tokens);
  void layer_forward(int l);
  void layer_backward(int l);
  void proj_forward(int l, int p, const void* x, void* y);
  void proj_backward(int l, int p, const void* dy, const void* x, void* dx);
  void optimizer_step(float lr, float grad_scale);

  void* at(const void* base, size_t elems) const {
    return static_cast<char*>(const_cast<void*>(base)) + elems * es_;
  }
  void* W(int l, int i) const;       // compute copy of tensor i of layer l
  float* G(int l, int i) const;      // its gradient (null when frozen)
  void zero(void* p, size_t elems) const { DT_CUDA_CHECK(cudaMemsetAsync(p, 0, elems * es_, s_)); }

  model::ModelConfig cfg_;
  GpuTrainOptions opts_;
  DType D_;
  size_t es_;
  bool gpt2_, lora_;
  int B_, T_, N_, C_, F_, V_, L_, NH_, NKV_, HD_, QD_, KD_;
  int lora_r_ = 0;
  float lora_scale_ = 0.0f;
  std::vector<Proj> projs_;
  std::vector<std::vector<int>> lora_slot_;  // [layer][proj]: tensor index of lora_A, -1 if none
  std::vector<DevBuffer> base_, lora_bufs_;   // base: embeddings, layers, head
  std::vector<LayerActs> acts_;
  void *xL_ = nullptr, *lnf_ = nullptr, *logits_ = nullptr, *qkv_ = nullptr, *attproj_ = nullptr, *mlp_ = nullptr;
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  void *dres_ = nullptr, *dln_ = nullptr, *dqkv_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr;
  void *datty_ = nullptr, *dfc_ = nullptr, *dup_ = nullptr, *dact_ = nullptr, *dh_ = nullptr;
  int32_t *tokens_dev_ = nullptr, *targets_dev_ = nullptr;
  double* norm_sq_ = nullptr;
  int* overflow_ = nullptr;
  float* loss_slots_ = nullptr;  // [grad_accum]: mean loss of each micro-batch

  std::unique_ptr<Stream> stream_;  // created after the device checks
  cudaStream_t s_ = nullptr;
  std::unique_ptr<DeviceAlloc> arena_;
  std::unique_ptr<PinnedAlloc> host_;  // staged tokens/targets, read-back stats
  std::unique_ptr<train::LossScaler> scaler_;
  int64_t step_count_ = 0;
  std::string device_name_;
};

std::vector<DevBuffer>& trainable(std::vector<DevBuffer>& base, std::vector<DevBuffer>& lora) {
  return lora.empty() ? base : lora;
}

CudaTrainer::CudaTrainer(model::Model& init, const GpuTrainOptions& opts)
    : cfg_(init.config()), opts_(opts), D_(opts.compute), es_(dtype_size(opts.compute)) {
  DT_ENFORCE_GT(opts.micro_batch, 0, UsageError, "GPU trainer micro-batch size");
  DT_ENFORCE_GT(opts.grad_accum, 0, UsageError, "GPU trainer gradient accumulation steps");
  DT_ENFORCE(opts.seq_len >= 1 && opts.seq_len <= cfg_.max_seq_len, ConfigError,
             "GPU trainer: sequence length {} must be in [1, max_seq_len = {}]", opts.seq_len, cfg_.max_seq_len);
  DT_ENFORCE(static_cast<int64_t>(opts.micro_batch) * opts.seq_len <= (int64_t{1} << 31) / cfg_.vocab_size,
             UsageError, "GPU trainer: micro-batch {} x seq_len {} x vocab {} logits exceed 2^31 elements",
             opts.micro_batch, opts.seq_len, cfg_.vocab_size);
  gpu_device_require(opts.device);
  DT_CUDA_CHECK(cudaSetDevice(opts.device));
  cudaDeviceProp prop{};
  DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, opts.device));
  device_name_ = prop.name;
  stream_ = std::make_unique<Stream>();
  s_ = stream_->get();

  gpt2_ = cfg_.arch == model::ModelConfig::Arch::GPT2;
  lora_ = init.lora_on();
  B_ = opts.micro_batch;
  T_ = opts.seq_len;
  N_ = B_ * T_;
  C_ = cfg_.d_model;
  F_ = cfg_.d_ff;
  V_ = cfg_.vocab_size;
  L_ = cfg_.n_layer;
  NH_ = cfg_.n_head;
  NKV_ = cfg_.n_kv_head;
  HD_ = cfg_.head_dim();
  QD_ = NH_ * HD_;
  KD_ = NKV_ * HD_;
  if (lora_) {
    const model::LoraConfig& lc = init.lora_config();
    DT_ENFORCE(lc.dropout == 0.0f, ConfigError,
               "lora.dropout = {}: the GPU trainer has no dropout masks; set lora.dropout to 0", lc.dropout);
    lora_r_ = lc.rank;
    lora_scale_ = lc.scale();
  }
  if (opts.compute == DType::F16) scaler_ = std::make_unique<train::LossScaler>(opts.loss_scaler);

  // Projections, as model.cpp names them.
  const auto& l0 = init.params()[1].layout;
  const std::string p0 = model::layer_prefix(cfg_, 0) + ".";
  auto proj = [&](std::string shrt, std::string module, int in, int out, bool bias) {
    Proj p{std::move(shrt), std::move(module), in, out, -1, -1};
    p.w = tensor_index(l0, p0 + p.module + ".weight");
    if (bias) p.b = tensor_index(l0, p0 + p.module + ".bias");
    DT_CHECK(p.w >= 0 && (!bias || p.b >= 0));
    projs_.push_back(std::move(p));
  };
  if (gpt2_) {
    proj("c_attn", "attn.c_attn", C_, QD_ + 2 * KD_, true);
    proj("c_proj", "attn.c_proj", QD_, C_, true);
    proj("c_fc", "mlp.c_fc", C_, F_, true);
    proj("c_proj", "mlp.c_proj", F_, C_, true);
  } else {
    proj("q_proj", "self_attn.q_proj", C_, QD_, false);
    proj("k_proj", "self_attn.k_proj", C_, KD_, false);
    proj("v_proj", "self_attn.v_proj", C_, KD_, false);
    proj("o_proj", "self_attn.o_proj", QD_, C_, false);
    proj("gate_proj", "mlp.gate_proj", C_, F_, false);
    proj("up_proj", "mlp.up_proj", C_, F_, false);
    proj("down_proj", "mlp.down_proj", F_, C_, false);
  }

  auto describe = [&](std::vector<DevBuffer>& out, const std::vector<model::ParamBuffer>& src, bool is_trainable) {
    for (const auto& pb : src) {
      DevBuffer d;
      d.layout = pb.layout;
      d.trainable = is_trainable;
      for (const auto& t : pb.layout.tensors) {
        if (!d.runs.empty() && d.runs.back().decay == t.decay && d.runs.back().offset + d.runs.back().n == t.offset)
          d.runs.back().n += t.numel();
        else
          d.runs.push_back({t.offset, t.numel(), t.decay});
      }
      out.push_back(std::move(d));
    }
  };
  describe(base_, init.params(), !lora_);
  describe(lora_bufs_, init.lora_params(), true);
  if (lora_) {
    lora_slot_.assign(static_cast<size_t>(L_), std::vector<int>(projs_.size(), -1));
    for (int l = 0; l < L_; ++l)
      for (size_t p = 0; p < projs_.size(); ++p) {
        const std::string path = model::layer_prefix(cfg_, l) + "." + projs_[p].module;
        lora_slot_[static_cast<size_t>(l)][p] =
            tensor_index(lora_bufs_[static_cast<size_t>(l)].layout, model::lora_tensor_name(path, false));
      }
  }
  acts_.resize(static_cast<size_t>(L_));

  Carver measure(nullptr);
  plan(measure);
  arena_ = std::make_unique<DeviceAlloc>(measure.size(), s_);
  Carver real(arena_->get());
  plan(real);
  DT_CHECK(real.size() == measure.size());
  const size_t staged = 2 * static_cast<size_t>(opts.grad_accum) * N_ * sizeof(int32_t);
  host_ = std::make_unique<PinnedAlloc>(staged + 16 + static_cast<size_t>(opts.grad_accum) * sizeof(float));
  upload(init.params(), init.lora_params());
}

// Every device pointer, carved in one pass (see Carver).
void CudaTrainer::plan(Carver& c) {
  const size_t N = static_cast<size_t>(N_), C = C_, F = F_;
  const bool mixed = D_ != DType::F32;
  for (auto* list : {&base_, &lora_bufs_})
    for (auto& b : *list) {
      const size_t n = b.layout.size;
      b.compute = c.bytes(n * es_);
      b.master = mixed ? (b.trainable ? c.of<float>(n) : nullptr) : static_cast<float*>(b.compute);
      if (b.trainable) {
        b.grad = c.of<float>(n);
        b.m = c.of<float>(n);
        b.v = c.of<float>(n);
      }
    }
  auto act = [&](size_t n) { return c.bytes(n * es_); };
  for (auto& a : acts_) {
    a.x = act(N * C);
    a.ln1 = act(N * C);
    a.q = act(N * QD_);
    a.k = act(N * KD_);
    a.v = act(N * KD_);
    a.atty = act(N * QD_);
    a.res2 = act(N * C);
    a.ln2 = act(N * C);
    a.fc = act(N * F);
    a.up = gpt2_ ? nullptr : act(N * F);
    a.act = act(N * F);
    a.ln1_mean = c.of<float>(N);
    a.ln1_rstd = c.of<float>(N);
    a.ln2_mean = c.of<float>(N);
    a.ln2_rstd = c.of<float>(N);
    a.lse = c.of<float>(static_cast<size_t>(B_) * NH_ * T_);
    a.lora_h.assign(projs_.size(), nullptr);
    if (lora_)
      for (size_t p = 0; p < projs_.size(); ++p)
        if (lora_slot_[static_cast<size_t>(&a - acts_.data())][p] >= 0) a.lora_h[p] = act(N * lora_r_);
  }
  xL_ = act(N * C);
  lnf_ = act(N * C);
  lnf_mean_ = c.of<float>(N);
  lnf_rstd_ = c.of<float>(N);
  logits_ = act(N * V_);
  qkv_ = gpt2_ ? act(N * (QD_ + 2 * KD_)) : nullptr;
  attproj_ = act(N * C);
  mlp_ = act(N * C);
  dres_ = act(N * C);
  dln_ = act(N * C);
  dqkv_ = gpt2_ ? act(N * (QD_ + 2 * KD_)) : nullptr;
  dq_ = act(N * QD_);
  dk_ = act(N * KD_);
  dv_ = act(N * KD_);
  datty_ = act(N * QD_);
  dfc_ = act(N * F);
  dup_ = gpt2_ ? nullptr : act(N * F);
  dact_ = act(N * F);
  dh_ = lora_ ? act(N * lora_r_) : nullptr;
  tokens_dev_ = c.of<int32_t>(N * opts_.grad_accum);
  targets_dev_ = c.of<int32_t>(N * opts_.grad_accum);
  norm_sq_ = c.of<double>(1);
  overflow_ = c.of<int>(1);
  loss_slots_ = c.of<float>(static_cast<size_t>(opts_.grad_accum));
}

// fp32 host weights -> masters and the compute copy (rounded on the host, as the CPU
// trainer rounds its compute copy). Copied on the trainer's stream, which is then
// synchronised: the host buffers (pageable, `half` reused) must outlive the copies.
void CudaTrainer::upload(const std::vector<model::ParamBuffer>& base, const std::vector<model::ParamBuffer>& lora) {
  std::vector<uint16_t> half;
  auto put = [&](DevBuffer& d, const model::ParamBuffer& h) {
    DT_CHECK(d.layout.size == h.size);
    if (d.master)
      DT_CUDA_CHECK(cudaMemcpyAsync(d.master, h.data, h.size * sizeof(float), cudaMemcpyHostToDevice, s_));
    if (D_ == DType::F32) return;
    half.resize(h.size);
    for (size_t i = 0; i < h.size; ++i) half[i] = D_ == DType::BF16 ? f32_to_bf16(h.data[i]) : f32_to_f16(h.data[i]);
    DT_CUDA_CHECK(cudaMemcpyAsync(d.compute, half.data(), h.size * 2, cudaMemcpyHostToDevice, s_));
    DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  };
  for (size_t i = 0; i < base.size(); ++i) put(base_[i], base[i]);
  for (size_t i = 0; i < lora.size(); ++i) put(lora_bufs_[i], lora[i]);
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
}

void* CudaTrainer::W(int l, int i) const {
  const DevBuffer& b = base_[static_cast<size_t>(l) + 1];
  return at(b.compute, b.layout.tensors[static_cast<size_t>(i)].offset);
}

float* CudaTrainer::G(int l, int i) const {
  const DevBuffer& b = base_[static_cast<size_t>(l) + 1];
  return b.grad ? b.grad + b.layout.tensors[static_cast<size_t>(i)].offset : nullptr;
}

// ----------------------------------------------------------------------------
// Projections: y = x W^T (+ b), plus scale * (x A^T) B^T under LoRA.

void CudaTrainer::proj_forward(int l, int p, const void* x, void* y) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  kernels::linear_forward(y, x, W(l, pr.w), pr.b >= 0 ? W(l, pr.b) : nullptr, N_, pr.in, pr.out, D_, s_);
  const int slot = lora_ ? lora_slot_[static_cast<size_t>(l)][static_cast<size_t>(p)] : -1;
  if (slot < 0) return;
  const DevBuffer& lb = lora_bufs_[static_cast<size_t>(l)];
  const void* A = at(lb.compute, lb.layout.tensors[static_cast<size_t>(slot)].offset);
  const void* Bm = at(lb.compute, lb.layout.tensors[static_cast<size_t>(slot) + 1].offset);
  void* h = acts_[static_cast<size_t>(l)].lora_h[static_cast<size_t>(p)];
  kernels::gemm(false, true, N_, lora_r_, pr.in, 1.0f, x, A, 0.0f, h, D_, D_, s_);
  kernels::gemm(false, true, N_, pr.out, lora_r_, lora_scale_, h, Bm, 1.0f, y, D_, D_, s_);
}

// dx += dy W (dx may be null); dW, db += (fp32, when trainable); the adapters' dA, dB.
void CudaTrainer::proj_backward(int l, int p, const void* dy, const void* x, void* dx) {
  const Proj& pr = projs_[static_cast<size_t>(p)];
  kernels::linear_backward(dx, G(l, pr.w), pr.b >= 0 ? G(l, pr.b) : nullptr, dy, x, W(l, pr.w), N_, pr.in, pr.out,
                           D_, s_);
  const int slot = lora_ ? lora_slot_[static_cast<size_t>(l)][static_cast<size_t>(p)] : -1;
  if (slot < 0) return;
  const DevBuffer& lb = lora_bufs_[static_cast<size_t>(l)];
  const size_t oa = lb.layout.tensors[static_cast<size_t>(slot)].offset;
  const size_t ob = lb.layout.tensors[static_cast<size_t>(slot) + 1].offset;
  const void* h = acts_[static_cast<size_t>(l)].lora_h[static_cast<size_t>(p)];
  const int r = lora_r_;
  kernels::gemm(true, false, pr.out, r, N_, lora_scale_, dy, h, 1.0f, lb.grad + ob, D_, DType::F32, s_);
  kernels::gemm(false, false, N_, r, pr.out, lora_scale_, dy, at(lb.compute, ob), 0.0f, dh_, D_, D_, s_);
  kernels::gemm(true, false, r, pr.in, N_, 1.0f, dh_, x, 1.0f, lb.grad + oa, D_, DType::F32, s_);
  if (dx) kernels::gemm(false, false, N_, pr.in, r, 1.0f, dh_, at(lb.compute, oa), 1.0f, dx, D_, D_, s_);
}

// ----------------------------------------------------------------------------
// One layer. Layer l's input x_l = res2_{l-1} + mlp_{l-1} is formed by the fused
// residual + norm of layer l (layer 0's is the embedding output).

void CudaTrainer::layer_forward(int l) {
  LayerActs& a = acts_[static_cast<size_t>(l)];
  const LayerActs* prev = l > 0 ? &acts_[static_cast<size_t>(l) - 1] : nullptr;
  const float eps = cfg_.norm_eps;
  const size_t NF = static_cast<size_t>(N_) * F_, es = es_;
  if (gpt2_) {
    // tensors: 0 ln_1.w 1 ln_1.b 6 ln_2.w 7 ln_2.b
    if (prev)
      kernels::residual_layernorm_forward(a.x, a.ln1, a.ln1_mean, a.ln1_rstd, prev->res2, mlp_, W(l, 0), W(l, 1), N_,
                                          C_, eps, D_, s_);
    else
      kernels::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.x, W(l, 0), W(l, 1), N_, C_, eps, D_, s_);
    proj_forward(l, 0, a.ln1, qkv_);
    const size_t pitch = static_cast<size_t>(QD_ + 2 * KD_) * es;
    DT_CUDA_CHECK(cudaMemcpy2DAsync(a.q, QD_ * es, qkv_, pitch, QD_ * es, N_, cudaMemcpyDeviceToDevice, s_));
    DT_CUDA_CHECK(cudaMemcpy2DAsync(a.k, KD_ * es, at(qkv_, QD_), pitch, KD_ * es, N_, cudaMemcpyDeviceToDevice, s_));
    DT_CUDA_CHECK(
        cudaMemcpy2DAsync(a.v, KD_ * es, at(qkv_, QD_ + KD_), pitch, KD_ * es, N_, cudaMemcpyDeviceToDevice, s_));
  } else {
    // tensors: 0 input_layernorm 5 post_attention_layernorm
    if (prev)
      kernels::residual_rmsnorm_forward(a.x, a.ln1, a.ln1_rstd, prev->res2, mlp_, W(l, 0), N_, C_, eps, D_, s_);
    else
      kernels::rmsnorm_forward(a.ln1, a.ln1_rstd, a.x, W(l, 0), N_, C_, eps, D_, s_);
    proj_forward(l, 0, a.ln1, a.q);
    proj_forward(l, 1, a.ln1, a.k);
    proj_forward(l, 2, a.ln1, a.v);
    kernels::rope_forward(a.q, a.k, B_, T_, NH_, NKV_, HD_, cfg_.rope_theta, D_, s_);
  }
  kernels::attention_forward(a.atty, a.lse, a.q, a.k, a.v, B_, T_, NH_, NKV_, HD_, D_, s_);
  proj_forward(l, gpt2_ ? 1 : 3, a.atty, attproj_);
  if (gpt2_) {
    kernels::residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, a.x, attproj_, W(l, 6), W(l, 7), N_, C_,
                                        eps, D_, s_);
    const Proj& fc = projs_[2];
    const bool adapted = lora_ && lora_slot_[static_cast<size_t>(l)][2] >= 0;
    if (!adapted && F_ % 8 == 0) {  // bias + GELU in the GEMM epilogue, pre-activation kept
      kernels::linear_gelu_forward(a.act, a.fc, a.ln2, W(l, fc.w), W(l, fc.b), N_, C_, F_, D_, s_);
    } else {
      proj_forward(l, 2, a.ln2, a.fc);
      kernels::gelu_forward(a.act, a.fc, NF, D_, s_);
    }
    proj_forward(l, 3, a.act, mlp_);
  } else {
    kernels::residual_rmsnorm_forward(a.res2, a.ln2, a.ln2_rstd, a.x, attproj_, W(l, 5), N_, C_, eps, D_, s_);
    proj_forward(l, 4, a.ln2, a.fc);
    proj_forward(l, 5, a.ln2, a.up);
    kernels::swiglu_forward(a.act, a.fc, a.up, NF, D_, s_);
    proj_forward(l, 6, a.act, mlp_);
  }
}

// On entry dres_ = d(loss)/d(layer output); on exit d(loss)/d(layer input).
void CudaTrainer::layer_backward(int l) {
  const LayerActs& a = acts_[static_cast<size_t>(l)];
  const size_t N = static_cast<size_t>(N_), NF = N * F_, es = es_;
  zero(dact_, NF);
  proj_backward(l, gpt2_ ? 3 : 6, dres_, a.act, dact_);
  zero(dfc_, NF);
  zero(dln_, N * C_);
  if (gpt2_) {
    kernels::gelu_backward(dfc_, a.fc, dact_, NF, D_, s_);
    proj_backward(l, 2, dfc_, a.ln2, dln_);
    kernels::layernorm_backward(dres_, G(l, 6), G(l, 7), dln_, a.res2, W(l, 6), a.ln2_mean, a.ln2_rstd, N_, C_, D_,
                                s_);
  } else {
    zero(dup_, NF);
    kernels::swiglu_backward(dfc_, dup_, dact_, a.fc, a.up, NF, D_, s_);
    proj_backward(l, 4, dfc_, a.ln2, dln_);
    proj_backward(l, 5, dup_, a.ln2, dln_);
    kernels::rmsnorm_backward(dres_, G(l, 5), dln_, a.res2, W(l, 5), a.ln2_rstd, N_, C_, D_, s_);
  }

  zero(datty_, N * QD_);
  proj_backward(l, gpt2_ ? 1 : 3, dres_, a.atty, datty_);
  zero(dq_, N * QD_);
  zero(dk_, N * KD_);
  zero(dv_, N * KD_);
  kernels::attention_backward(dq_, dk_, dv_, datty_, a.atty, a.lse, a.q, a.k, a.v, B_, T_, NH_, NKV_, HD_, D_, s_);
  zero(dln_, N * C_);
  if (gpt2_) {
    const size_t pitch = static_cast<size_t>(QD_ + 2 * KD_) * es;
    DT_CUDA_CHECK(cudaMemcpy2DAsync(dqkv_, pitch, dq_, QD_ * es, QD_ * es, N, cudaMemcpyDeviceToDevice, s_));
    DT_CUDA_CHECK(cudaMemcpy2DAsync(at(dqkv_, QD_), pitch, dk_, KD_ * es, KD_ * es, N, cudaMemcpyDeviceToDevice, s_));
    DT_CUDA_CHECK(
        cudaMemcpy2DAsync(at(dqkv_, QD_ + KD_), pitch, dv_, KD_ * es, KD_ * es, N, cudaMemcpyDeviceToDevice, s_));
    proj_backward(l, 0, dqkv_, a.ln1, dln_);
    kernels::layernorm_backward(dres_, G(l, 0), G(l, 1), dln_, a.x, W(l, 0), a.ln1_mean, a.ln1_rstd, N_, C_, D_, s_);
  } else {
    kernels::rope_backward(dq_, dk_, B_, T_, NH_, NKV_, HD_, cfg_.rope_theta, D_, s_);
    proj_backward(l, 0, dq_, a.ln1, dln_);
    proj_backward(l, 1, dk_, a.ln1, dln_);
    proj_backward(l, 2, dv_, a.ln1, dln_);
    kernels::rmsnorm_backward(dres_, G(l, 0), dln_, a.x, W(l, 0), a.ln1_rstd, N_, C_, D_, s_);
  }
}

// ----------------------------------------------------------------------------
// Whole model. The cross-entropy runs forward and backward in one pass, writing
// dlogits = (softmax - onehot) * ce_scale over the logits, so forward() must be followed
// by backward() before the next forward().

void CudaTrainer::forward(const int32_t* tokens, const int32_t* targets, float ce_scale, float* loss) {
  const DevBuffer& emb = base_.front();
  const DevBuffer& head = base_.back();
  kernels::embedding_forward(acts_[0].x, tokens, emb.compute, gpt2_ ? at(emb.compute, emb.layout.tensors[1].offset) : nullptr,
                             B_, T_, C_, V_, D_, s_);
  for (int l = 0; l < L_; ++l) layer_forward(l);
  const LayerActs& last = acts_.back();
  if (gpt2_)
    kernels::residual_layernorm_forward(xL_, lnf_, lnf_mean_, lnf_rstd_, last.res2, mlp_, head.compute,
                                        at(head.compute, head.layout.tensors[1].offset), N_, C_, cfg_.norm_eps, D_, s_);
  else
    kernels::residual_rmsnorm_forward(xL_, lnf_, lnf_rstd_, last.res2, mlp_, head.compute, N_, C_, cfg_.norm_eps, D_,
                                      s_);
  const void* wlm = cfg_.tie_embeddings ? emb.compute : at(head.compute, head.layout.tensors.back().offset);
  kernels::linear_forward(logits_, lnf_, wlm, nullptr, N_, C_, V_, D_, s_);
  kernels::cross_entropy_forward_backward(nullptr, loss, logits_, logits_, targets, N_, V_, ce_scale, IGNORE_INDEX, D_,
                                          s_);
}

void CudaTrainer::backward(const int32_t* tokens) {
  DevBuffer& emb = base_.front();
  DevBuffer& head = base_.back();
  const size_t lm_off = cfg_.tie_embeddings ? 0 : head.layout.tensors.back().offset;
  const void* wlm = cfg_.tie_embeddings ? emb.compute : at(head.compute, lm_off);
  float* dwlm = cfg_.tie_embeddings ? emb.grad : (head.grad ? head.grad + lm_off : nullptr);
  zero(dln_, static_cast<size_t>(N_) * C_);
  kernels::linear_backward(dln_, dwlm, nullptr, logits_, lnf_, wlm, N_, C_, V_, D_, s_);
  zero(dres_, static_cast<size_t>(N_) * C_);
  float* gw = head.grad;
  if (gpt2_)
    kernels::layernorm_backward(dres_, gw, gw ? gw + head.layout.tensors[1].offset : nullptr, dln_, xL_, head.compute,
                                lnf_mean_, lnf_rstd_, N_, C_, D_, s_);
  else
    kernels::rmsnorm_backward(dres_, gw, dln_, xL_, head.compute, lnf_rstd_, N_, C_, D_, s_);
  for (int l = L_ - 1; l >= 0; --l) layer_backward(l);
  if (emb.grad)
    kernels::embedding_backward(emb.grad, gpt2_ ? emb.grad + emb.layout.tensors[1].offset : nullptr, dres_, tokens, B_,
                                T_, C_, V_, D_, s_);
}

// ----------------------------------------------------------------------------
// Steps.

// Validates and copies accum micro-batches into the pinned staging area and on to the
// device (one copy each); returns the unmasked-target count of the whole step.
int64_t CudaTrainer::stage_tokens(const int32_t* inputs, const int32_t* targets, int accum,
                                  std::vector<int64_t>& counts) {
  DT_ENFORCE(accum >= 1 && accum <= opts_.grad_accum, UsageError,
             "GPU trainer step: {} micro-batches, but the arena was sized for 1..{} (GpuTrainOptions::grad_accum)", accum,
             opts_.grad_accum);
  const size_t n = static_cast<size_t>(accum) * N_;
  int32_t* ht = host_->as<int32_t>();
  int32_t* hg = ht + static_cast<size_t>(opts_.grad_accum) * N_;
  counts.assign(static_cast<size_t>(accum), 0);
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    DT_ENFORCE(inputs[i] >= 0 && inputs[i] < V_, UsageError, "GPU trainer: token {} at position {} is outside [0, {})",
               inputs[i], i, V_);
    DT_ENFORCE(targets[i] == IGNORE_INDEX || (targets[i] >= 0 && targets[i] < V_), UsageError,
               "GPU trainer: target {} at position {} is neither -100 nor in [0, {})", targets[i], i, V_);
    if (targets[i] != IGNORE_INDEX) ++counts[i / static_cast<size_t>(N_)];
  }
  std::memcpy(ht, inputs, n * sizeof(int32_t));
  std::memcpy(hg, targets, n * sizeof(int32_t));
  DT_CUDA_CHECK(cudaMemcpyAsync(tokens_dev_, ht, n * sizeof(int32_t), cudaMemcpyHostToDevice, s_));
  DT_CUDA_CHECK(cudaMemcpyAsync(targets_dev_, hg, n * sizeof(int32_t), cudaMemcpyHostToDevice, s_));
  for (int64_t c : counts) total += c;
  return total;
}

float CudaTrainer::forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale) {
  DT_CUDA_CHECK(cudaSetDevice(opts_.device));
  std::vector<int64_t> counts;
  const int64_t n = stage_tokens(tokens, targets, 1, counts);
  if (n == 0) return 0.0f;  // zero gradient contribution, as the CPU model's scale 0
  forward(tokens_dev_, targets_dev_, grad_scale / static_cast<float>(n), loss_slots_);
  backward(tokens_dev_);
  float loss = 0.0f;
  DT_CUDA_CHECK(cudaMemcpyAsync(&loss, loss_slots_, sizeof(float), cudaMemcpyDeviceToHost, s_));
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  return loss;
}

void CudaTrainer::zero_grad() {
  for (auto& b : trainable(base_, lora_bufs_))
    DT_CUDA_CHECK(cudaMemsetAsync(b.grad, 0, b.layout.size * sizeof(float), s_));
}

GpuStepResult CudaTrainer::step(const int32_t* inputs, const int32_t* targets, int accum, float lr) {
  DT_CUDA_CHECK(cudaSetDevice(opts_.device));
  std::vector<int64_t> counts;
  const int64_t n_step = stage_tokens(inputs, targets, accum, counts);
  GpuStepResult res;
  res.targets = n_step;
  res.loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  zero_grad();
  // Micro-batch i carries weight n_i / n_step: its CE gradient scale is loss_scale / n_step.
  const float ce_scale = n_step > 0 ? res.loss_scale / static_cast<float>(n_step) : 0.0f;
  for (int a = 0; a < accum; ++a) {
    if (counts[static_cast<size_t>(a)] == 0) continue;  // nothing to learn from
    const size_t off = static_cast<size_t>(a) * N_;
    forward(tokens_dev_ + off, targets_dev_ + off, ce_scale, loss_slots_ + a);
    backward(tokens_dev_ + off);
  }
  // The one read-back of the step: losses, gradient norm, overflow flag.
  DT_CUDA_CHECK(cudaMemsetAsync(norm_sq_, 0, sizeof(double), s_));
  DT_CUDA_CHECK(cudaMemsetAsync(overflow_, 0, sizeof(int), s_));
  for (auto& b : trainable(base_, lora_bufs_)) {
    kernels::grad_norm_sq(norm_sq_, b.grad, b.layout.size, DType::F32, s_);
    if (scaler_) kernels::has_inf_or_nan(overflow_, b.grad, b.layout.size, DType::F32, s_);
  }
  char* stats = reinterpret_cast<char*>(host_->as<int32_t>() + 2 * static_cast<size_t>(opts_.grad_accum) * N_);
  double norm_sq = 0.0;
  int overflow = 0;
  DT_CUDA_CHECK(cudaMemcpyAsync(stats, norm_sq_, sizeof(double), cudaMemcpyDeviceToHost, s_));
  DT_CUDA_CHECK(cudaMemcpyAsync(stats + 8, overflow_, sizeof(int), cudaMemcpyDeviceToHost, s_));
  DT_CUDA_CHECK(cudaMemcpyAsync(stats + 16, loss_slots_, accum * sizeof(float), cudaMemcpyDeviceToHost, s_));
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  std::memcpy(&norm_sq, stats, sizeof(double));
  std::memcpy(&overflow, stats + 8, sizeof(int));
  double loss_sum = 0.0;
  for (int a = 0; a < accum; ++a) {
    float l = 0.0f;
    std::memcpy(&l, stats + 16 + a * sizeof(float), sizeof(float));
    if (counts[static_cast<size_t>(a)] > 0) loss_sum += static_cast<double>(l) * static_cast<double>(counts[static_cast<size_t>(a)]);
  }
  res.loss = n_step > 0 ? loss_sum / static_cast<double>(n_step) : 0.0;
  res.grad_norm = std::sqrt(norm_sq) / res.loss_scale;
  DT_ENFORCE(std::isfinite(res.loss), TrainError, "GPU step: the loss is {}; lower optimizer.lr", res.loss);
  const bool bad = overflow != 0 || !std::isfinite(norm_sq);
  if (!scaler_) {
    DT_ENFORCE(!bad, TrainError,
               "gradients became inf/NaN (global norm {}); lower optimizer.lr or enable gradient_clipping",
               res.grad_norm);
  } else if (!scaler_->update(bad)) {
    res.skipped = true;
    return res;
  }
  optimizer_step(lr, train::clip_coefficient(res.grad_norm, opts_.max_grad_norm) / res.loss_scale);
  return res;
}

void CudaTrainer::optimizer_step(float lr, float grad_scale) {
  ++step_count_;
  for (auto& b : trainable(base_, lora_bufs_))
    for (const auto& r : b.runs) {
      if (D_ == DType::F32)
        kernels::adamw_step(b.master + r.offset, b.grad + r.offset, b.m + r.offset, b.v + r.offset, r.n, opts_.adamw,
                            lr, step_count_, r.decay, grad_scale, s_);
      else
        kernels::adamw_step_copy(b.master + r.offset, b.grad + r.offset, b.m + r.offset, b.v + r.offset, r.n,
                                 opts_.adamw, lr, step_count_, r.decay, grad_scale, at(b.compute, r.offset), D_, s_);
    }
}

// ----------------------------------------------------------------------------
// Host views.

std::vector<std::vector<float>> CudaTrainer::grads_to_host() {
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  std::vector<std::vector<float>> out;
  for (auto& b : trainable(base_, lora_bufs_)) {
    out.emplace_back(b.layout.size);
    DT_CUDA_CHECK(cudaMemcpy(out.back().data(), b.grad, b.layout.size * sizeof(float), cudaMemcpyDeviceToHost));
  }
  return out;
}

void CudaTrainer::weights_to_model(model::Model& m) {
  DT_ENFORCE(m.lora_on() == lora_, UsageError, "weights_to_model: LoRA is {} here but {} on the target model",
             lora_ ? "on" : "off", m.lora_on() ? "on" : "off");
  auto& dst = m.trainable_params();
  auto& src = trainable(base_, lora_bufs_);
  DT_ENFORCE_EQ(dst.size(), src.size(), UsageError, "weights_to_model: parameter buffer count");
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  for (size_t i = 0; i < src.size(); ++i) {
    DT_ENFORCE_EQ(dst[i].size, src[i].layout.size, UsageError, "weights_to_model: size of buffer {}", src[i].layout.name);
    DT_CUDA_CHECK(cudaMemcpy(dst[i].data, src[i].master, dst[i].size * sizeof(float), cudaMemcpyDeviceToHost));
  }
}

GpuMemory CudaTrainer::memory() const {
  GpuMemory g;
  g.arena_bytes = arena_->bytes();
  g.workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
  size_t free_b = 0, total_b = 0;
  DT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  g.device_used_bytes = total_b - free_b;
  g.device_total_bytes = total_b;
  return g;
}

}  // namespace

std::unique_ptr<GpuTrainer> gpu_trainer_create(model::Model& init, const GpuTrainOptions& opts) {
  DT_ENFORCE(opts.compute == DType::F32 || opts.compute == DType::BF16 || opts.compute == DType::F16, UsageError,
             "GPU trainer compute dtype");
  return std::make_unique<CudaTrainer>(init, opts);
}

#endif  // DTRAIN_HAVE_CUDA

}  // namespace dtrain::gpu
