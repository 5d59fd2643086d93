// The per-rank memory plan (memory_plan.h): DeepSpeed's ZeRO formulas over the model's
// own buffer layout, the same ones ZeroEngine::report().memory() reports as its theory.
#include "train/memory_plan.h"

#include "core/check.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/model_factory.h"
#include "train/zero_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

namespace dtrain::train {

namespace {

double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

// Bytes as GiB, or MiB below one GiB.
std::string bytes(double b) {
  return b >= 1024.0 * 1024.0 * 1024.0 ? fmt::format("{:.2f} GiB", gib(b)) : fmt::format("{:.1f} MiB", b / 1048576.0);
}

// A parameter count as 1.54B or 0.14M.
std::string count(double n) { return n >= 1e9 ? fmt::format("{:.2f}B", n / 1e9) : fmt::format("{:.2f}M", n / 1e6); }

// A CPU rank's resident bytes beyond its buffers: the program and its libraries, the
// OpenBLAS and ops threads' buffers, the data and tokenizer (measured with
// monitor.memory_trace: 18-30 MiB resident beside the allocator's bytes and the build's
// staging on a 2-core Debian 12 machine), and an allowance of kSlack of the
// buffers for glibc's own arenas and fragmentation around them (measured 0.5-1.5 %: the
// 34M-parameter jobs of cli_memory_plan_rss_test and issue 50's 201M job).
constexpr double kRuntimeBytes = 32.0 * 1024 * 1024;
constexpr double kSlack = 0.02;
// Gloo's reduce-scatter ring: two pieces of at most kRingPiece (lib/comm/gloo_comm.cpp),
// each no longer than a chunk (a bucket's share of one rank).
constexpr double kGlooPieceBytes = 8.0 * 1024 * 1024;
// The CPU device keeps freed blocks of 1 MiB and more for reuse (cpu_device.cpp).
constexpr double kCacheMin = 1024.0 * 1024;

// One parameter buffer as the engine's slot sees it.
struct PlanBuf {
  int layer = 0;
  double n = 0;
  bool trainable = true;
};

// The step's working buffers, replayed from the engine's schedule (zero_grads.cpp,
// zero_gather.cpp) without allocating anything: stage 3 gathers each sharded layer before
// it runs and keeps a prefetch window ahead (prefetch_bucket_size elements, the current
// layers within max_live_parameters), stages 2-3 give each layer's trainable gradient a
// working buffer from its backward until it is packed into its bucket, the bucket lives
// until its last buffer is packed (and, with overlap_comm, until the next one exists),
// stages 0-1 reduce with one scratch of the largest bucket. Each allocation is counted by
// its size as the CPU device's block cache keeps it: the cache holds at most the most
// blocks of each size in use at once (plus the live small ones).
struct WorkPlan {
  double gather = 0, layer_grad = 0, bucket = 0, held = 0, live = 0;
  double most_bucket = 0;  // bytes of the largest gradient bucket (its collective's buffer)
};

double round64(double b) { return std::ceil(b / 64) * 64; }

// The block cache's count: blocks in use and the most at once, by (64-byte rounded) size.
class BlockCount {
 public:
  void take(double bytes) {
    if (bytes <= 0) return;
    bytes = round64(bytes);
    live_bytes_ += bytes;
    peak_ = std::max(peak_, live_bytes_);
    int& k = live_[bytes];
    ++k;
    most_[bytes] = std::max(most_[bytes], k);
  }
  void give(double bytes) {
    if (bytes <= 0) return;
    bytes = round64(bytes);
    live_bytes_ -= bytes;
    --live_[bytes];
  }
  double peak() const { return peak_; }
  // What the cache holds at most: small blocks are not kept, they count while in use.
  double held() const {
    double held = 0;
    for (const auto& [bytes, k] : most_) held += bytes >= kCacheMin ? bytes * k : 0;
    return std::max(held, peak_);
  }

 private:
  std::map<double, int> live_, most_;
  double live_bytes_ = 0, peak_ = 0;
};

// Gradient buckets in backward order (zero_buckets_plan): consecutive trainable
// buffers while their full sizes stay within reduce_bucket_size.
struct Buckets {
  std::vector<int> of;      // each buffer's bucket (-1: frozen)
  std::vector<double> seg;  // a rank's elements of each bucket
  std::vector<int> slots;   // buffers in each bucket
};

// The replay itself (work_plan): its state is the cache count, the buckets and, at stage 3,
// which layers are gathered (ZeroGatherReplay: the engine's visits and releases). The
// buffers are placed, bucketed and grouped by the engine's own rules (zero_layout).
class WorkReplay {
 public:
  WorkReplay(const std::vector<PlanBuf>& bufs, const config::TrainConfig& cfg, int n_layer, bool tied, double W,
             double c, double wire)
      : bufs_(bufs), cfg_(cfg), n_layer_(n_layer), tied_(tied), W_(W), c_(c), wire_(wire), st_(cfg.zero.stage),
        layout_(layout_of(bufs, cfg, n_layer, W)),
        gathers_(layout_.layer_sharded(), tied, static_cast<size_t>(cfg.zero.stage3_prefetch_bucket_size),
                 static_cast<size_t>(cfg.zero.stage3_max_live_parameters)) {}

  WorkPlan run();

 private:
  // Each buffer placed as the engine places it (rank 0's shard; the plan needs lengths only).
  static ZeroLayout layout_of(const std::vector<PlanBuf>& bufs, const config::TrainConfig& cfg, int n_layer, double W) {
    ZeroLayout layout(ZeroPlacement{static_cast<int>(cfg.zero.stage), 0, static_cast<int>(W),
                                    static_cast<size_t>(cfg.zero.stage3_param_persistence_threshold)},
                      n_layer);
    for (const PlanBuf& b : bufs) layout.add(static_cast<size_t>(b.n), b.layer, b.trainable);
    return layout;
  }
  void plan_buckets();
  double bucket_bytes(size_t b) const { return 4 * (st_ == 0 ? buckets_.seg[b] : W_ * buckets_.seg[b]); }
  void post_step_gather();
  WorkPlan scratch_only();
  // Stage 3's gathered layers (index layer + 1: -1 embeddings .. n_layer head): one sharded
  // buffer's working buffer, a layer's, and a layer gathered or released.
  double gathered_bytes(size_t i) const { return W_ * static_cast<double>(layout_.shards[i].s) * c_; }
  double gather_bytes(int l) const;
  void gather(int l, bool on);
  void visit(int layer, int dir);
  void attach(int l);
  void backward();

  const std::vector<PlanBuf>& bufs_;
  const config::TrainConfig& cfg_;
  const int n_layer_;
  const bool tied_;
  const double W_, c_, wire_;
  const int st_;
  ZeroLayout layout_;
  ZeroGatherReplay gathers_;
  WorkPlan r_;
  BlockCount blocks_;
  Buckets buckets_;
  std::vector<char> wgrad_;
  double gather_peak_ = 0, layer_grad_peak_ = 0, wg_ = 0;
};

void WorkReplay::plan_buckets() {
  Buckets& k = buckets_;
  k.of.assign(bufs_.size(), -1);
  for (const ZeroBucketPlan& plan : layout_.buckets(static_cast<size_t>(cfg_.zero.reduce_bucket_size))) {
    for (size_t i : plan.slots) k.of[i] = static_cast<int>(k.seg.size());
    k.seg.push_back(static_cast<double>(plan.seg));
    k.slots.push_back(static_cast<int>(plan.slots.size()));
  }
  for (size_t b = 0; b < k.seg.size(); ++b) r_.most_bucket = std::max(r_.most_bucket, bucket_bytes(b));
}

// After the update, once the backward's buffers are gone (stages 1-3, on any number of
// ranks: zero_post_update_gathers, the rule ZeroGather::resident_refresh runs): the trainable
// buffers the model holds whole -- stages 1-2 all of them, stage 3 those under
// stage3_param_persistence_threshold -- all-gathered back into the model, each group through
// a buffer of its own in the compute dtype (the 16-bit wire of an fp32 model under mixed
// precision).
void WorkReplay::post_step_gather() {
  const double es = wire_ > 0 ? wire_ : c_;
  for (const ZeroGatherGroup& g :
       zero_post_update_gathers(layout_.view(), st_, static_cast<size_t>(cfg_.zero.allgather_bucket_size))) {
    const double bytes = W_ * static_cast<double>(g.seg) * es;
    blocks_.take(bytes);
    blocks_.give(bytes);
    r_.gather = std::max(r_.gather, round64(bytes));
  }
}

// Stages 0-1: one scratch of the largest bucket reduced (none on one rank: no collective),
// then stage 1's post-update gathers.
WorkPlan WorkReplay::scratch_only() {
  if (W_ > 1) {
    double most_len = 0;
    for (size_t b = 0; b < buckets_.seg.size(); ++b)
      if (!(st_ == 0 && buckets_.slots[b] == 1)) most_len = std::max(most_len, bucket_bytes(b));
    r_.bucket = most_len;
    blocks_.take(most_len);
    blocks_.give(most_len);
  }
  post_step_gather();
  r_.live = blocks_.peak();
  r_.held = blocks_.held();
  return r_;
}

double WorkReplay::gather_bytes(int l) const {
  double bytes = 0;
  for (size_t i : layout_.layer_slots[static_cast<size_t>(l + 1)])
    if (layout_.shards[i].sharded) bytes += round64(gathered_bytes(i));
  return bytes;
}

void WorkReplay::gather(int l, bool on) {
  for (size_t i : layout_.layer_slots[static_cast<size_t>(l + 1)])
    if (layout_.shards[i].sharded) {
      if (!on) {
        blocks_.give(gathered_bytes(i));
        continue;
      }
      const double wire = W_ * static_cast<double>(layout_.shards[i].s) * wire_;
      blocks_.take(gathered_bytes(i));
      blocks_.take(wire);  // the 16-bit wire of an fp32 model (freed after the cast)
      blocks_.give(wire);
    }
}

// Stage 3 at `layer` going in `dir`: what leaves the window released, then the layer (and
// the tied embeddings where the head reads them) and the prefetch window ahead gathered, in
// the engine's order.
void WorkReplay::visit(int layer, int dir) {
  const ZeroGatherReplay::Visit v = gathers_.visit(layer, dir);
  for (int l : v.released) gather(l, false);
  for (const ZeroGatherReplay::Gather& g : v.issued) gather(g.layer, true);
  double g = 0;
  for (int l = -1; l <= n_layer_; ++l)
    if (gathers_.gathered(l)) g += gather_bytes(l);
  gather_peak_ = std::max(gather_peak_, g);
}

// Layer l's trainable gradients get their working buffers as its backward runs.
void WorkReplay::attach(int l) {
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (bufs_[i].layer == l && bufs_[i].trainable && !wgrad_[i]) {
      wgrad_[i] = 1;
      blocks_.take(4 * bufs_[i].n);
      wg_ += round64(4 * bufs_[i].n);
    }
  layer_grad_peak_ = std::max(layer_grad_peak_, wg_);
}

// Stages 2-3's backward: each layer's gradients packed into their buckets, a bucket alive
// until its last buffer is packed (with overlap_comm, until the next one is done too).
void WorkReplay::backward() {
  const Buckets& k = buckets_;
  std::vector<int> packed(k.seg.size(), 0);
  std::vector<char> bucket_live(k.seg.size(), 0);
  int pending = -1;  // overlap_comm: the bucket still reducing while the next one fills
  for (int l = n_layer_; l >= -1; --l) {
    if (st_ == 3) visit(l, -1);
    attach(l);
    if (l == n_layer_ && tied_) attach(-1);
    for (size_t i = 0; i < bufs_.size(); ++i) {
      if (bufs_[i].layer != l || !bufs_[i].trainable) continue;
      const auto b = static_cast<size_t>(k.of[i]);
      if (!bucket_live[b]) {
        bucket_live[b] = 1;
        blocks_.take(bucket_bytes(b));
      }
      wgrad_[i] = 0;
      blocks_.give(4 * bufs_[i].n);
      wg_ -= round64(4 * bufs_[i].n);
      if (++packed[b] == k.slots[b]) {
        if (pending >= 0) blocks_.give(bucket_bytes(static_cast<size_t>(pending)));
        pending = -1;
        if (cfg_.zero.overlap_comm) pending = static_cast<int>(b);
        else blocks_.give(bucket_bytes(b));
      }
    }
    if (st_ == 3 && gathers_.release(l)) gather(l, false);
  }
  if (pending >= 0) blocks_.give(bucket_bytes(static_cast<size_t>(pending)));
}

WorkPlan WorkReplay::run() {
  plan_buckets();
  if (st_ <= 1) return scratch_only();
  wgrad_.assign(bufs_.size(), 0);
  if (st_ == 3)
    for (int l = -1; l <= n_layer_; ++l) visit(l, +1);
  backward();
  post_step_gather();
  r_.gather = std::max(r_.gather, gather_peak_);
  r_.layer_grad = layer_grad_peak_;
  r_.bucket = r_.most_bucket * (cfg_.zero.overlap_comm ? 2 : 1);
  r_.live = blocks_.peak();
  r_.held = blocks_.held();
  return r_;
}

WorkPlan work_plan(const std::vector<PlanBuf>& bufs, const config::TrainConfig& cfg, int n_layer, bool tied, double W,
                   double c, double wire) {
  return WorkReplay(bufs, cfg, n_layer, tied, W, c, wire).run();
}

// The model's parameter buffers as the engine's slots see them, base then adapters, with
// the counts they give p (params, largest buffer, trainable). The adapters' sizes come from
// the layouts lora_enable builds (no adapter is allocated or initialised: an 8B model's
// are 40M values); lc receives the LoRA settings.
std::vector<PlanBuf> plan_buffers(MemoryPlan& p, const config::TrainConfig& cfg, const model::ModelConfig& mc,
                                  std::optional<model::LoraConfig>& lc) {
  std::vector<PlanBuf> bufs;
  for (const auto& b : model::layout_build(mc)) {
    p.params += static_cast<double>(b.size);
    p.largest_buffer = std::max(p.largest_buffer, static_cast<double>(b.size));
    bufs.push_back({b.layer, static_cast<double>(b.size), !p.lora});
  }
  p.trainable = p.params;
  if (p.lora) {
    lc = lora_config_from(cfg, mc);
    lc->validate(mc);
    p.trainable = 0;
    for (const auto& b : model::lora_layout_build(mc, *lc)) {
      p.trainable += static_cast<double>(b.size);
      bufs.push_back({b.layer, static_cast<double>(b.size), true});
    }
  }
  return bufs;
}

// Bytes of the compute copy's elements (the CPU computes in fp32).
double compute_bytes(const MemoryPlan& p) { return p.cuda && p.mixed ? 2 : 4; }

// The training state's bytes where it lives: parameters, gradients and optimizer by ZeRO
// stage, and what ZeRO-Offload moves to the host.
void plan_state(MemoryPlan& p, const config::TrainConfig& cfg) {
  // Under LoRA the base is frozen and the adapters are extra parameters; otherwise every
  // parameter trains.
  const double W = p.world, Phi = p.params, Psi = p.trainable, frozen = p.lora ? Phi : 0.0,
               held = p.lora ? Phi + Psi : Phi;
  const double c = compute_bytes(p);
  const double K = p.mixed ? 12 : 8;  // fp32 master (mixed only) + AdamW m and v
  const int st = p.stage;
  if (st < 3) {
    p.param_bytes = c * held;
  } else {
    // The frozen buffers' shards in the compute dtype and the trainable ones' fp32 master
    // shard where it is the parameter (fp32); the gathered layers are working buffers.
    p.param_bytes = c * frozen / W + (p.mixed ? 0 : 4 * Psi / W);
  }
  p.grad_bytes = 4 * (st >= 2 ? Psi / W : Psi);
  p.optim_bytes = K * (st == 0 ? Psi : Psi / W);
  // ZeRO-Offload (GPU ranks; a CPU rank's state is in host memory already): the fp32
  // master, m, v and gradient shard (16 Psi / W), their landing buffer at stages 2-3
  // (4 Psi / W) and the 16-bit copy the update sends back (2 Psi / W) go to the host; the
  // device keeps its compute copy (at stage 3 the shards, unless offload_param moves them
  // too) and stage 1's full gradient.
  if (p.cuda && cfg.zero.offload_optimizer_device == "cpu" && st >= 1) {
    p.offload_optimizer = true;
    p.offload_param = st == 3 && cfg.zero.offload_param_device == "cpu";
    const double opt_host = (16 + (st >= 2 ? 4 : 0) + (p.mixed ? 2 : 0)) * Psi / W;
    p.offload_bytes = opt_host;
    if (cfg.zero.offload_optimizer_pin_memory) p.pinned_bytes += opt_host;
    if (st == 3) {
      p.param_bytes = p.offload_param ? 0 : c * held / W;
      if (p.offload_param) {
        p.offload_bytes += c * frozen / W;
        if (cfg.zero.offload_param_pin_memory) p.pinned_bytes += c * frozen / W;
      }
    }
    p.grad_bytes = st == 1 ? 4 * Psi : 0;
    p.optim_bytes = 0;
  }
  // The CPU's bf16/fp16 keeps exact fp32 masters of the frozen buffers too.
  if (p.mixed && !p.cuda && st < 3) p.optim_bytes += 4 * (st == 0 ? frozen : frozen / W);
}

// The model's activation arena (Model::allocate) for N tokens of T per row, per token: each
// layer's saved values (its input norm, q, k, v, the attention output and what the device's
// attention keeps, the second residual and norm, the MLP's hidden values, the adapters'
// products), every layer's residual, and one set of scratch for the backward and the
// logits. With recomputation one layer's set serves all layers.
double plan_activations(const MemoryPlan& p, const model::ModelConfig& mc, const std::optional<model::LoraConfig>& lc,
                        double N, double T) {
  const double es = p.cuda && p.mixed ? 2 : 4, L = mc.n_layer, C = mc.d_model, F = mc.d_ff, V = mc.vocab_size;
  const double H = mc.n_head, hd = mc.head_dim(), QD = H * hd, KD = mc.n_kv_head * hd;
  const bool gpt2 = mc.is_gpt2();
  double lora_r = 0, lora_in = 0;  // per layer: the adapters' N x r products and dropout inputs
  const double rank = lc ? lc->rank : 0;
  if (lc) {
    const double n_targets = static_cast<double>(lc->targets.size()) * (gpt2 ? 2 : 1);  // GPT-2's c_proj is two
    lora_r = n_targets * rank;
    if (lc->dropout > 0) lora_in = n_targets * std::max(C, F);
  }
  const double qk = mc.qk_norm ? QD + KD : 0;
  const double per_layer = 3 * C + 2 * QD + 2 * KD + (gpt2 ? 2 : 3) * F + qk + lora_r + lora_in;
  const double per_layer_f32 = 4 + (p.cuda ? H : H * T) + (mc.qk_norm ? H + mc.n_kv_head : 0);
  const double ld = p.cuda ? std::ceil(V / 128) * 128 : V;  // the logits' rows (padded on a device)
  const double scratch = 5 * C + ld + 2 * QD + 2 * KD + qk + 3 * F + rank + (lora_in > 0 ? std::max(C, F) : 0);
  // Each kept layer's set, and one the recomputed layers share.
  const double sets = config::config_activation_sets(L, p.recompute_layers);
  return N * (es * (sets * per_layer + (L + 1) * C + scratch) + 4 * (sets * per_layer_f32 + 3) + 3 * sizeof(int32_t));
}

}  // namespace

MemoryPlan memory_plan(const config::TrainConfig& cfg, int world) {
  MemoryPlan p;
  p.world = std::max(1, world);
  p.stage = cfg.zero.stage;
  p.cuda = cfg.training.device == "cuda";
  p.mixed = cfg.bf16.enabled || cfg.fp16.enabled;
  p.lora = cfg.lora.enabled();
  p.deferred = p.stage == 3 || p.cuda;
  const model::ModelConfig mc = model_config_from(cfg);
  std::optional<model::LoraConfig> lc;
  const std::vector<PlanBuf> bufs = plan_buffers(p, cfg, mc, lc);
  plan_state(p, cfg);
  const double T = cfg.data.seq_len ? static_cast<double>(*cfg.data.seq_len) : static_cast<double>(mc.max_seq_len);
  // A preference micro-batch of n pairs runs 2n rows (chosen and rejected).
  const double rows = cfg.training.stage == "dpo" ? 2.0 : 1.0;
  const double N = rows * static_cast<double>(std::max<int64_t>(1, cfg.resolved_micro_batch_size)) * T;
  p.n_layer = mc.n_layer;
  p.recompute_layers = recompute_layers_of(cfg, mc.n_layer);
  p.activation_bytes = plan_activations(p, mc, lc, N, T);
  p.batch_bytes = config::config_batch_token_bytes(cfg, N);
  // One buffer's fp32 values at a time (and on a GPU its compute-dtype staging copy too).
  // A model built whole stages each buffer's fp32 values on the host too (init_weights,
  // the checkpoint's tensors) before they reach its storage.
  const double c = compute_bytes(p);
  p.build_peak_bytes = (p.cuda ? 4 + c : 4) * p.largest_buffer;

  // The step's working buffers; an fp32 model under bf16/fp16 (the CPU) gathers over a
  // 16-bit wire.
  const double W = p.world;
  const WorkPlan wp = work_plan(bufs, cfg, mc.n_layer, mc.tie_embeddings, W, c, !p.cuda && p.mixed ? 2 : 0);
  p.gather_bytes = wp.gather;
  p.layer_grad_bytes = wp.layer_grad;
  p.bucket_bytes = wp.bucket;
  p.work_bytes = wp.held;
  p.work_live_bytes = wp.live;
  if (!p.cuda) {
    p.comm_bytes = W > 1 ? 2 * std::min(kGlooPieceBytes, std::ceil(wp.most_bucket / W)) : 0;
    p.runtime_bytes =
        kRuntimeBytes + kSlack * (p.state_bytes() + std::max(p.work_bytes, p.build_peak_bytes) + p.comm_bytes);
  }
  return p;
}

config::TrainConfig recompute_resolve(config::TrainConfig cfg, int world, double capacity_bytes,
                                      RecomputeChoice* choice) {
  RecomputeChoice c;
  const MemoryPlan none = memory_plan(cfg, world);
  c.n_layer = none.n_layer;
  const auto& ac = cfg.activation_checkpointing;
  if (ac.layers || ac.enabled) {
    c.layers = none.recompute_layers;
    c.why = ac.layers  ? fmt::format("activation_checkpointing.layers: {} of {} layers", c.layers, c.n_layer)
            : c.layers ? fmt::format("activation_checkpointing.enabled: all {} layers", c.n_layer)
                       : std::string("activation_checkpointing.enabled is false: none");
  } else {
    c.planned = true;
    auto need = [&](int k) {
      config::TrainConfig t = cfg;
      t.activation_checkpointing.layers = k;
      const MemoryPlan p = memory_plan(t, world);
      return p.cuda ? p.device_bytes() : p.host_bytes();
    };
    const double room = capacity_bytes * 0.95 - (none.cuda ? 1024.0 * 1024 * 1024 : 0.0);
    const char* of = none.cuda ? "its GPU" : "its share of the node's memory";
    const double all = none.cuda ? none.device_bytes() : none.host_bytes();  // left to the plan: none recomputed
    if (capacity_bytes <= 0) {
      c.why = fmt::format("none: left to the plan, but {} is not known here (each rank decides on its own node)", of);
    } else if (all <= room) {
      c.why = fmt::format("none: a rank needs {} of the {} {} leaves after its reserve", bytes(all), bytes(room), of);
    } else {
      // need(k) does not grow with k: the fewest that fit, by bisection (1 saves nothing).
      int lo = 2, hi = c.n_layer;
      if (need(hi) > room) {
        lo = hi;
      } else {
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (need(mid) <= room) hi = mid;
          else lo = mid + 1;
        }
      }
      c.layers = lo;
      const double with = need(c.layers);
      c.why = fmt::format(
          "{} of {} layers: without recompute a rank needs {}, with {} {}, of the {} {} leaves after its "
          "reserve{}",
          c.layers, c.n_layer, bytes(all), c.layers, bytes(with), bytes(room), of,
          with > room ? " (does not fit even so)" : "");
    }
  }
  cfg.activation_checkpointing.layers = c.layers;
  if (choice) *choice = c;
  return cfg;
}

std::string memory_plan_text(const MemoryPlan& p, int ranks_here, double memory_bytes, double gpu_bytes,
                             int ranks_per_node) {
  std::string s =
      fmt::format("memory per rank (ZeRO stage {}, {} rank(s), {} parameters, {} trainable{}, {} on the {}):\n",
                  p.stage, p.world, count(p.params), count(p.trainable), p.lora ? " (LoRA)" : "",
                  p.mixed ? "mixed precision" : "fp32", p.cuda ? "GPU" : "CPU");
  std::string state = fmt::format(
      "params {}, grads {}, optimizer {}, activations {}{}", bytes(p.param_bytes), bytes(p.grad_bytes),
      bytes(p.optim_bytes), bytes(p.activation_bytes),
      p.recompute_layers > 0 ? fmt::format(" ({} of {} layers recomputed)", p.recompute_layers, p.n_layer) : "");
  if (p.work_bytes > 0) {
    std::string parts;
    auto part = [&](double b, const char* what) {
      if (b <= 0) return;
      parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", what, bytes(b));
    };
    part(p.gather_bytes, "gathered layers");
    part(p.layer_grad_bytes, "layer gradient");
    part(p.bucket_bytes, p.stage >= 2 ? "gradient bucket" : "bucket scratch");
    state += fmt::format(", working buffers {} ({}; at most {} in use at once)", bytes(p.work_bytes), parts,
                         bytes(p.work_live_bytes));
  }
  if (p.cuda) {
    s += fmt::format("  device {}: {}{}\n", bytes(p.device_bytes()), state,
                     gpu_bytes > 0 ? fmt::format(" (of {} per GPU: {})", bytes(gpu_bytes),
                                                 p.device_bytes() > gpu_bytes ? "does NOT fit" : "fits")
                                   : "");
    if (p.offload_optimizer)
      s += fmt::format("  host   {}: offloaded {} ({}{}; {} pinned), building {}, token ids {}\n",
                       bytes(p.host_bytes()), bytes(p.offload_bytes), "optimizer state and gradient shards",
                       p.offload_param ? " + parameter shards" : "", bytes(p.pinned_bytes), bytes(p.build_peak_bytes),
                       bytes(p.batch_bytes));
    else
      s += fmt::format(
          "  host   {}: building {} (one layer's values at a time: no host copy of the model), token ids {}\n",
          bytes(p.host_bytes()), bytes(p.build_peak_bytes), bytes(p.batch_bytes));
  } else {
    s += fmt::format(
        "  host   {}: {}, token ids {}{}, collectives {}, runtime {} (the program, its libraries and 2 % for the "
        "allocator's slack)\n",
        bytes(p.host_bytes()), state, bytes(p.batch_bytes),
        p.deferred ? fmt::format(", building {} (one layer's fp32 values at a time: the model is never "
                                 "whole on a rank; before the working buffers exist)",
                                 bytes(p.build_peak_bytes))
                   : fmt::format(", building {} (one buffer's fp32 values staged at a time, before the working "
                                 "buffers exist)",
                                 bytes(p.build_peak_bytes)),
        bytes(p.comm_bytes), bytes(p.runtime_bytes));
  }
  if (ranks_here > 0 && memory_bytes > 0)
    s += fmt::format("  this machine: {} rank(s) x {} = {} of host memory, of {}\n", ranks_here, bytes(p.host_bytes()),
                     bytes(ranks_here * p.host_bytes()), bytes(memory_bytes));
  if (ranks_per_node > 0)
    s += fmt::format("  per node: {} rank(s) x {} = {} of host memory (the planned nodes' own is not known here)\n",
                     ranks_per_node, bytes(p.host_bytes()), bytes(ranks_per_node * p.host_bytes()));
  s += fmt::format(
      "  (an upper bound from DeepSpeed's ZeRO formulas, the model's layout and the step's schedule, not a "
      "measurement{}; monitor.memory_trace logs each rank's measured peak per phase)\n",
      p.cuda ? "; not counted on the GPU: the CUDA context, cuBLASLt's workspace and NCCL's buffers" : "");
  return s;
}

void memory_plan_check(const MemoryPlan& p, int ranks_here, double memory_bytes, const std::string& source,
                       double gpu_bytes) {
  if (p.cuda && gpu_bytes > 0 && p.device_bytes() > gpu_bytes) {
    std::string hint;
    if (p.stage < 3) hint = "raise zero_optimization.stage (3 shards the parameters too), ";
    if (!p.offload_optimizer) hint += "offload the optimizer (zero_optimization.offload_optimizer.device: cpu), ";
    else if (p.stage == 3 && !p.offload_param) hint += "offload the parameters (offload_param.device: cpu), ";
    hint += "run on more GPUs, use LoRA or activation checkpointing, or a smaller micro-batch";
    DT_THROW(ConfigError,
             "{}: a GPU rank needs {} of device memory (params {}, grads {}, optimizer {}, activations {}: ZeRO stage "
             "{}{}, {} parameters, {} trainable; see --dry-run) but each GPU here has {}: {}",
             source, bytes(p.device_bytes()), bytes(p.param_bytes), bytes(p.grad_bytes), bytes(p.optim_bytes),
             bytes(p.activation_bytes), p.stage, p.offload_optimizer ? " with offload" : "", count(p.params),
             count(p.trainable), bytes(gpu_bytes), hint);
  }
  if (ranks_here <= 0 || memory_bytes <= 0) return;
  const double need = ranks_here * p.host_bytes();
  if (need <= memory_bytes) return;
  std::string hint;
  if (p.offload_optimizer)
    hint = fmt::format("offloading puts {} per rank in host memory: turn offload off where the GPUs can hold it, ",
                       bytes(p.offload_bytes));
  if (p.stage < 3) hint += "raise zero_optimization.stage (3 shards the parameters too), ";
  hint += "run fewer ranks per machine or on more machines, use LoRA, or choose a smaller model";
  DT_THROW(ConfigError,
           "{}: the job needs {} of host memory on this machine ({} rank(s) x {}: ZeRO stage {}, {} parameters, {} "
           "trainable; see --dry-run) but it has {}: {}",
           source, bytes(need), ranks_here, bytes(p.host_bytes()), p.stage, count(p.params), count(p.trainable),
           bytes(memory_bytes), hint);
}

}  // namespace dtrain::train
