// train_run(): the CPU training loop. The optimizer side (gradient reduction, overflow
// check, clipping, AdamW, compute-copy refresh) sits behind OptimizerEngine so the ZeRO
// engine (stages 1-3) can replace the stage-0 implementation without touching the loop.
#include "train/trainer.h"

#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "train/adamw.h"
#include "train/data_loader.h"
#include "train/evaluate.h"
#include "train/grad_clip.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/model_factory.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

namespace dtrain::train {

namespace fs = std::filesystem;

// ----------------------------------------------------------------------------
// Optimizer engine: everything between "backward done on every micro-batch" and "the
// model's parameter buffers hold the next step's weights".
namespace {

struct StepRequest {
  float lr = 0.0f;
  float loss_scale = 1.0f;  // the gradients hold loss_scale * true gradient
  float max_norm = 0.0f;    // gradient_clipping (0 = off)
  bool check_overflow = false;
};

struct StepOutcome {
  bool overflow = false;
  double grad_norm = 0.0;  // global, unscaled, before clipping
};

class OptimizerEngine {
 public:
  virtual ~OptimizerEngine() = default;
  /// Reduces the gradients across ranks and, unless they overflowed, applies one update.
  virtual StepOutcome step(const StepRequest& req, StepTimer& timer) = 0;
  /// Puts the fp32 master weights into the model's buffers (before an fp32 export).
  virtual void master_to_model() = 0;
};

void round_inplace(float* x, size_t n, DType t) {
  if (t == DType::BF16)
    for (size_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
  else if (t == DType::F16)
    for (size_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

// ZeRO stage 0: full gradients allreduced (AVG) on every rank, full optimizer state on
// every rank; every rank computes the same update.
class Stage0Engine final : public OptimizerEngine {
 public:
  Stage0Engine(model::Model& m, comm::Communicator* comm, const AdamWConfig& acfg, DType compute)
      : m_(m), comm_(comm), acfg_(acfg), compute_(compute) {
    for (auto& pb : m_.trainable_params()) {
      m_state_.emplace_back(pb.size, 0.0f);
      v_state_.emplace_back(pb.size, 0.0f);
    }
    if (compute_ != DType::F32) {
      // Masters of every buffer: trainable ones are updated, frozen ones (LoRA base)
      // are kept to export fp32 weights; the model keeps the rounded compute copy.
      for (auto* list : {&m_.params(), &m_.lora_params()})
        for (auto& pb : *list) {
          masters_.push_back({&pb, std::vector<float>(pb.data, pb.data + pb.size)});
          round_inplace(pb.data, pb.size, compute_);
        }
    }
  }

  StepOutcome step(const StepRequest& req, StepTimer& timer) override {
    auto& bufs = m_.trainable_params();
    const bool multi = comm_ != nullptr && comm_->size() > 1;
    if (multi) {
      auto s = timer.scope(Section::COMM);
      for (auto& pb : bufs) comm_->allreduce(pb.grad, pb.grad, pb.size, DType::F32, comm::ReduceOp::AVG);
    }
    auto s = timer.scope(Section::OPTIMIZER);
    StepOutcome out;
    double sq = 0.0;
    for (auto& pb : bufs) sq += grad_norm_sq(pb.grad, pb.size);
    out.grad_norm = std::sqrt(sq) / req.loss_scale;
    float overflow = std::isfinite(sq) ? 0.0f : 1.0f;
    if (multi && req.check_overflow) {
      timer.stop(Section::OPTIMIZER);
      timer.start(Section::COMM);
      comm_->allreduce(&overflow, &overflow, 1, DType::F32, comm::ReduceOp::MAX);
      timer.stop(Section::COMM);
      timer.start(Section::OPTIMIZER);
    }
    if (overflow != 0.0f) {
      DT_ENFORCE(req.check_overflow, TrainError,
                 "gradients became inf/NaN (global norm {}); lower optimizer.lr or enable gradient_clipping",
                 out.grad_norm);
      out.overflow = true;
      return out;
    }
    const float grad_scale = clip_coefficient(out.grad_norm, req.max_norm) / req.loss_scale;
    ++step_count_;
    size_t mi = 0;
    for (size_t b = 0; b < bufs.size(); ++b) {
      auto& pb = bufs[b];
      float* master = pb.data;
      if (compute_ != DType::F32) {
        while (masters_[mi].first != &pb) ++mi;  // same order as trainable_params()
        master = masters_[mi].second.data();
      }
      for (const auto& t : pb.layout.tensors) {
        const size_t o = t.offset, n = t.numel();
        if (compute_ == DType::F32) {
          adamw_step(master + o, pb.grad + o, m_state_[b].data() + o, v_state_[b].data() + o, n, acfg_, req.lr,
                     step_count_, t.decay, grad_scale);
        } else {
          copy_.resize(n);
          adamw_step_copy(master + o, pb.grad + o, m_state_[b].data() + o, v_state_[b].data() + o, n, acfg_, req.lr,
                          step_count_, t.decay, grad_scale, copy_.data(), compute_);
          float* dst = pb.data + o;
          if (compute_ == DType::BF16)
            for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(copy_[i]);
          else
            for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(copy_[i]);
        }
      }
    }
    return out;
  }

  void master_to_model() override {
    for (auto& [pb, master] : masters_) std::copy(master.begin(), master.end(), pb->data);
  }

 private:
  model::Model& m_;
  comm::Communicator* comm_;
  AdamWConfig acfg_;
  DType compute_;
  int64_t step_count_ = 0;
  std::vector<std::vector<float>> m_state_, v_state_;
  std::vector<std::pair<model::ParamBuffer*, std::vector<float>>> masters_;
  std::vector<uint16_t> copy_;
};

// ----------------------------------------------------------------------------
LrScheduleConfig schedule_config(const config::TrainConfig& cfg, int64_t total_steps) {
  const auto& s = cfg.scheduler;
  LrScheduleConfig l;
  l.type = s.type.value_or("constant");
  l.warmup_min_lr = static_cast<float>(s.warmup_min_lr);
  l.warmup_max_lr = s.warmup_max_lr ? static_cast<float>(*s.warmup_max_lr) : -1.0f;
  l.warmup_num_steps = s.warmup_num_steps;
  l.total_num_steps = s.total_num_steps.value_or(total_steps);
  l.warmup_type = s.warmup_type;
  l.warmup_min_ratio = static_cast<float>(s.warmup_min_ratio);
  l.cos_min_ratio = static_cast<float>(s.cos_min_ratio);
  return l;
}

LossScalerConfig scaler_config(const config::Fp16Config& f) {
  LossScalerConfig c;
  c.loss_scale = static_cast<float>(f.loss_scale);
  c.initial_scale_power = static_cast<int>(f.initial_scale_power);
  c.loss_scale_window = f.loss_scale_window;
  c.hysteresis = static_cast<int>(f.hysteresis);
  c.consecutive_hysteresis = f.consecutive_hysteresis;
  c.min_loss_scale = static_cast<float>(f.min_loss_scale);
  return c;
}

// JSON has no inf/NaN: such values are written as null.
nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

// Sums a few doubles over the ranks (fp32 on the wire: counts stay exact below 2^24).
void allreduce_sum(comm::Communicator* comm, std::vector<double>& v) {
  if (comm == nullptr || comm->size() == 1) return;
  std::vector<float> f(v.begin(), v.end());
  comm->allreduce(f.data(), f.data(), f.size(), DType::F32, comm::ReduceOp::SUM);
  for (size_t i = 0; i < v.size(); ++i) v[i] = f[i];
}

}  // namespace

// ----------------------------------------------------------------------------
TrainResult train_run(const config::TrainConfig& cfg, const TrainerEnv& env) {
  const int W = env.world_size, rank = env.rank;
  DT_ENFORCE(W >= 1 && rank >= 0 && rank < W, UsageError, "trainer: rank {} outside world size {}", rank, W);
  comm::Communicator* comm = env.comm != nullptr && env.comm->size() > 1 ? env.comm : nullptr;
  if (W > 1) {
    DT_ENFORCE(comm != nullptr, UsageError, "trainer: world size {} needs a communicator", W);
    DT_ENFORCE_EQ(comm->size(), W, UsageError, "trainer: communicator size vs world size");
    DT_ENFORCE_EQ(comm->rank(), rank, UsageError, "trainer: communicator rank vs rank");
  }
  DT_ENFORCE(cfg.resolved_micro_batch_size > 0 && cfg.resolved_grad_accum_steps > 0, UsageError,
             "trainer: the batch sizes are not resolved; call config_resolve_batch(cfg, {}) first", W);
  DT_ENFORCE_EQ(cfg.resolved_dp_world_size, static_cast<int64_t>(W), UsageError,
                "trainer: config_resolve_batch was called for another world size");
  DT_ENFORCE(!(cfg.fp16.enabled && cfg.bf16.enabled), ConfigError, "{}: fp16.enabled and bf16.enabled are exclusive",
             cfg.source);
  DT_ENFORCE(cfg.zero.stage == 0, ConfigError,
             "{}: zero_optimization.stage {} is not available in this trainer yet; use stage 0", cfg.source,
             cfg.zero.stage);
  const bool lead = rank == 0;

  // ---- model, data, optimizer
  auto model = model_create(cfg);
  model::Model& m = *model;
  TrainData data = data_load(cfg, m.config().vocab_size, m.config().max_seq_len);
  const int micro = static_cast<int>(cfg.resolved_micro_batch_size);
  const int accum = static_cast<int>(cfg.resolved_grad_accum_steps);
  const int T = static_cast<int>(data.train->seq_len());
  BatchReader reader(*data.train, micro, rank, W, static_cast<uint64_t>(cfg.training.seed), cfg.data.shuffle);
  const int64_t total_steps =
      cfg.training.max_steps ? *cfg.training.max_steps : *cfg.training.epochs * reader.steps_per_epoch(accum);
  DT_ENFORCE_GT(total_steps, 0, ConfigError, "{}: training.max_steps", cfg.source);

  const auto sched = lr_schedule_create(schedule_config(cfg, total_steps), static_cast<float>(cfg.optimizer.lr));
  AdamWConfig acfg;
  acfg.lr = static_cast<float>(cfg.optimizer.lr);
  acfg.beta1 = static_cast<float>(cfg.optimizer.betas[0]);
  acfg.beta2 = static_cast<float>(cfg.optimizer.betas[1]);
  acfg.eps = static_cast<float>(cfg.optimizer.eps);
  acfg.weight_decay = static_cast<float>(cfg.optimizer.weight_decay);
  const DType compute = cfg.bf16.enabled ? DType::BF16 : cfg.fp16.enabled ? DType::F16 : DType::F32;
  std::unique_ptr<LossScaler> scaler;
  if (cfg.fp16.enabled) scaler = std::make_unique<LossScaler>(scaler_config(cfg.fp16));
  Stage0Engine engine(m, comm, acfg, compute);

  std::unique_ptr<MetricsWriter> metrics;
  if (lead && !env.run_dir.empty()) {
    std::error_code ec;
    fs::create_directories(env.run_dir, ec);
    DT_ENFORCE(!ec, IoError, "cannot create the run directory {}: {}", env.run_dir, ec.message());
    metrics = std::make_unique<MetricsWriter>((fs::path(env.run_dir) / "metrics.jsonl").string(), false);
  }
  if (lead && env.print)
    std::printf("train: %s %zu params (%zu trainable), %zu train samples of %d tokens, %d rank(s) x micro %d x accum %d, "
                "%lld steps, %s\n",
                model::arch_name(m.config().arch), m.num_params(), m.num_trainable_params(), data.train->size(), T, W,
                micro, accum, static_cast<long long>(total_steps), dtype_name(compute));

  // ---- loop
  TrainResult res;
  res.final_eval_loss = res.final_eval_ppl = std::numeric_limits<double>::quiet_NaN();
  const int64_t print_every = std::max<int64_t>(1, cfg.steps_per_print);
  const int64_t tokens_per_step = static_cast<int64_t>(micro) * accum * W * T;
  std::vector<std::vector<int32_t>> inputs(static_cast<size_t>(accum)), targets(static_cast<size_t>(accum));
  std::vector<int64_t> counts(static_cast<size_t>(accum));
  StepTimer timer;
  Stopwatch run_clock, interval_clock;
  int64_t interval_steps = 0;

  auto run_eval = [&](int64_t step) {
    if (!data.valid) return;
    EvalLoss e = eval_loss(m, *data.valid, micro, 0, rank, W);
    std::vector<double> v{e.loss_sum, static_cast<double>(e.tokens)};
    allreduce_sum(comm, v);
    e.loss_sum = v[0];
    e.tokens = static_cast<int64_t>(v[1]);
    res.final_eval_loss = e.mean();
    res.final_eval_ppl = e.ppl();
    if (!lead) return;
    if (env.print)
      std::printf("eval step %lld | eval_loss %.4f | eval_ppl %.3f\n", static_cast<long long>(step), e.mean(), e.ppl());
    if (metrics) metrics->write({{"step", step}, {"eval_loss", num(e.mean())}, {"eval_ppl", num(e.ppl())}});
  };

  for (int64_t step = 1; step <= total_steps; ++step) {
    // Data first: the step's unmasked-token count fixes every micro-batch's weight.
    std::vector<double> count{0.0};
    {
      auto s = timer.scope(Section::DATA);
      for (int a = 0; a < accum; ++a) {
        counts[static_cast<size_t>(a)] = reader.next(inputs[static_cast<size_t>(a)], targets[static_cast<size_t>(a)]);
        count[0] += static_cast<double>(counts[static_cast<size_t>(a)]);
      }
    }
    {
      auto s = timer.scope(Section::COMM);
      allreduce_sum(comm, count);
    }
    const double n_step = count[0];
    const float loss_scale = scaler ? scaler->scale() : 1.0f;
    m.zero_grad();
    double loss_sum = 0.0;
    for (int a = 0; a < accum; ++a) {
      const int64_t n = counts[static_cast<size_t>(a)];
      if (n == 0) continue;  // nothing to learn from: no forward, no gradient
      float loss;
      {
        auto s = timer.scope(Section::FORWARD);
        loss = m.forward(inputs[static_cast<size_t>(a)].data(), targets[static_cast<size_t>(a)].data(), micro, T);
      }
      loss_sum += static_cast<double>(loss) * static_cast<double>(n);
      auto s = timer.scope(Section::BACKWARD);
      m.backward(static_cast<float>(static_cast<double>(W) * static_cast<double>(n) / n_step) * loss_scale);
      if (compute == DType::F16)
        for (auto& pb : m.trainable_params()) round_inplace(pb.grad, pb.size, DType::F16);
    }
    std::vector<double> lsum{loss_sum};
    {
      auto s = timer.scope(Section::COMM);
      allreduce_sum(comm, lsum);
    }
    // A step whose every target is masked (possible with short packed windows of SFT
    // data) has loss 0 and zero gradients, as Model::forward defines it; AdamW still runs.
    if (n_step == 0 && lead) log_warn("step {}: every target of the batch is masked (loss 0)", step);
    const double step_loss = n_step > 0 ? lsum[0] / n_step : 0.0;
    DT_ENFORCE(std::isfinite(step_loss), TrainError, "step {}: the loss is {}; lower optimizer.lr", step, step_loss);

    const float lr = sched->lr(res.applied_steps);
    StepRequest req;
    req.lr = lr;
    req.loss_scale = loss_scale;
    req.max_norm = static_cast<float>(cfg.gradient_clipping);
    req.check_overflow = scaler != nullptr;
    const StepOutcome out = engine.step(req, timer);
    bool applied = true;
    if (scaler) applied = scaler->update(out.overflow);
    res.steps = step;
    if (applied) ++res.applied_steps; else ++res.skipped_steps;
    res.losses.push_back(step_loss);
    res.lrs.push_back(lr);
    res.grad_norms.push_back(out.grad_norm);
    res.loss_scales.push_back(loss_scale);
    res.skipped.push_back(applied ? 0 : 1);
    res.final_loss = step_loss;
    res.tokens += tokens_per_step;
    ++interval_steps;

    if (step % print_every == 0 || step == total_steps) {
      const double dt = interval_clock.elapsed_s();
      const double per_step = dt / static_cast<double>(interval_steps);
      const double tps = static_cast<double>(tokens_per_step * interval_steps) / std::max(dt, 1e-9);
      if (lead && env.print)
        std::printf("step %lld/%lld | loss %.4f | lr %.1e | grad_norm %.3f | loss_scale %.0f | tokens/s %.0f | %.2f s/step%s\n",
                    static_cast<long long>(step), static_cast<long long>(total_steps), step_loss, lr, out.grad_norm,
                    static_cast<double>(loss_scale), tps, per_step, applied ? "" : " | skipped (fp16 overflow)");
      if (metrics) {
        nlohmann::json r{{"step", step},          {"loss", num(step_loss)},  {"lr", lr},
                         {"grad_norm", num(out.grad_norm)}, {"loss_scale", loss_scale}, {"tokens", res.tokens},
                         {"tokens_per_s", tps},   {"step_time", per_step},   {"skipped_steps", res.skipped_steps}};
        if (cfg.wall_clock_breakdown)
          for (Section sec : {Section::FORWARD, Section::BACKWARD, Section::COMM, Section::OPTIMIZER, Section::DATA})
            r[std::string(section_name(sec)) + "_ms"] = timer.elapsed_ms(sec) / static_cast<double>(interval_steps);
        metrics->write(r);
      }
      if (lead && env.print) std::fflush(stdout);
      timer.reset();
      interval_clock.restart();
      interval_steps = 0;
    }
    if (cfg.training.eval_steps > 0 && step % cfg.training.eval_steps == 0 && step != total_steps) run_eval(step);
  }
  run_eval(total_steps);
  res.elapsed_s = run_clock.elapsed_s();
  res.final_loss_scale = scaler ? scaler->scale() : 1.0;

  // ---- final weights
  engine.master_to_model();
  if (lead && !env.run_dir.empty()) {
    const std::string dir = (fs::path(env.run_dir) / "final").string();
    model_export_hf(m, dir, data.tokenizer->bos_id(), data.tokenizer->eos_id());
    if (env.print) std::printf("train: wrote %s (%lld steps, final loss %.4f, %.1f s)\n", dir.c_str(),
                               static_cast<long long>(res.steps), res.final_loss, res.elapsed_s);
    std::fflush(stdout);
  }
  if (comm) comm->barrier();  // no rank leaves before the export is complete
  return res;
}

}  // namespace dtrain::train
