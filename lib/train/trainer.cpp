// train_run(): the training loop (TrainLoop: one named function per step of it). The
// optimizer step itself (forward/backward, the ZeRO engine's update, the loss scaler,
// CUDA graphs) is train/train_step.h, the one `dtrain bench train` times; checkpoints and
// resume go through train/checkpoint.h.
#include "train/trainer.h"

#include "core/check.h"
#include "core/dtype.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/unix_time.h"
#include "ops/optim.h"
#include "tensorboard/event_writer.h"
#include "train/checkpoint.h"
#include "train/data_loader.h"
#include "train/evaluate.h"
#include "train/grad_clip.h"
#include "train/checkpoint_export.h"
#include "train/hf_export.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/memory_trace.h"
#include "train/metrics.h"
#include "train/model_factory.h"
#include "train/preference_pass.h"
#include "train/progress_publish.h"
#include "train/train_step.h"
#include "train/zero_engine.h"
#include "report/straggler.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

namespace dtrain::train {

using report::RankTimes;

namespace fs = std::filesystem;

namespace {

// ----------------------------------------------------------------------------
LrScheduleConfig schedule_config(const config::TrainConfig& cfg, int64_t total_steps) {
  const auto& s = cfg.scheduler;
  LrScheduleConfig l;
  l.type = s.type.value_or("constant");
  l.warmup_min_lr = static_cast<float>(s.warmup_min_lr);
  if (s.warmup_max_lr) l.warmup_max_lr = static_cast<float>(*s.warmup_max_lr);
  l.warmup_num_steps = s.warmup_num_steps;
  l.total_num_steps = s.total_num_steps.value_or(total_steps);
  l.warmup_type = s.warmup_type;
  l.warmup_min_ratio = static_cast<float>(s.warmup_min_ratio);
  l.cos_min_ratio = static_cast<float>(s.cos_min_ratio);
  return l;
}

// JSON has no inf/NaN: such values are written as null.
nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

// After a resume from step `last_step`: drops the records a failed round wrote for the
// steps it ran after that checkpoint (they are about to be run again) and a partial
// last line; records without a step are kept. Replaced atomically.
void metrics_cut_after(const std::string& path, int64_t last_step) {
  // Through the input rule: a FIFO or a link loop in its place is left as it is (said),
  // never waited on.
  std::string why;
  InputFile f = input_file_try_open(path, kInputAnySize, &why);
  if (!why.empty()) {
    if (why != "does not exist") log_warn("{}: {}; its records after step {} are not cut", path, why, last_step);
    return;
  }
  std::istringstream in(f.read_all("metrics file", kInputAnySize));
  f = InputFile();
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.contains("step") && j.at("step").is_number_integer() && j.at("step").get<int64_t>() > last_step) continue;
    kept += line;
    kept += '\n';
  }
  const std::string tmp = path + ".tmp";
  // POSIX writes, for the reason when one fails (a full disk); no tmp file stays behind.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  DT_ENFORCE(fd >= 0, IoError, "cannot write {}: {}", tmp, std::strerror(errno));
  int err = 0;
  for (size_t off = 0; off < kept.size() && err == 0;) {
    const ssize_t w = ::write(fd, kept.data() + off, kept.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) err = w < 0 ? errno : ENOSPC;  // 0: nothing more fits (errno not set)
    else off += static_cast<size_t>(w);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    DT_THROW(IoError, "cannot write {}: {}", tmp, std::strerror(err));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) ::unlink(tmp.c_str());
  DT_ENFORCE(!ec, IoError, "cannot replace {}: {}", path, ec.message());
}

// ----------------------------------------------------------------------------
// One run of the loop: its state, and each step of the loop as a named function, so
// run() reads as llm.c's main loop: load the batch, forward and backward, step the
// optimizer, record, log, evaluate, checkpoint.
class TrainLoop {
 public:
  TrainLoop(const config::TrainConfig& cfg, const TrainerEnv& env);
  TrainResult run();

 private:
  void env_check() const;
  void resume();
  void metrics_open();
  void batch_load();  // the micro-batches and their unmasked-target counts
  void record(int64_t step, const StepOutcome& out);
  void progress_log(int64_t step, const StepOutcome& out);
  void evaluate(int64_t step);
  void evaluate_run(int64_t step);
  // The device the job's buffers live on (a CPU rank's: the CPU device).
  device::Device& train_device() const { return env_.device != nullptr ? *env_.device : device::cpu(); }
  void pref_evaluate_valid(int64_t step);
  void reference_prepare();
  void save(int64_t step);
  bool stop_requested(int64_t step);
  RankTimes rank_times_take(double interval_s, int64_t steps);
  void export_final(bool trained);
  void lead_work_wait(const std::function<void()>& work);

  const config::TrainConfig& cfg_;
  const TrainerEnv& env_;
  const int W_, rank_;
  const bool lead_;
  comm::Communicator* comm_;
  std::unique_ptr<model::Model> host_model_;  // built on the host in fp32 (init, import, export)
  std::unique_ptr<model::Model> model_;       // the one that trains: host_model_ itself on the CPU
  bool deferred_ = false;                     // ZeRO-3 on the CPU: built shard by shard, never whole
  TrainData data_;
  int micro_ = 0, accum_ = 0, T_ = 0;
  std::unique_ptr<BatchReader> reader_;
  int64_t total_steps_ = 0;
  std::unique_ptr<LrSchedule> sched_;
  ZeroOptions zopts_;
  std::unique_ptr<TrainStep> step_;  // the optimizer step, its ZeRO engine and loss scaler
  LossScaler* scaler_ = nullptr;     // step_'s (fp16), nullptr without one
  int64_t tokens_per_step_ = 0;
  int64_t start_step_ = 0;
  TrainResult res_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<tensorboard::EventWriter> tb_;  // tensorboard.enabled: the same records as scalars
  MetricMeans metric_means_;                      // the print interval's named metrics (StepOutcome::metrics)
  std::string config_yaml_;
  std::vector<std::vector<int32_t>> inputs_, targets_, doc_starts_;
  std::vector<int64_t> counts_;
  // training.stage dpo: the objective, and with a precomputed reference its table (pair i's
  // chosen at 2i, rejected at 2i + 1) and each micro-batch's share of it.
  std::optional<PrefOptions> pref_;
  std::vector<float> ref_table_;
  std::vector<std::vector<double>> ref_batch_;
  StepTimer timer_;
  // monitor.memory_trace: each phase's peak resident bytes (the timer's sections mark it).
  MemoryTrace trace_;
  Stopwatch run_clock_, interval_clock_;
  int64_t interval_steps_ = 0;
  ZeroCommTimes last_comm_times_;
  // Bytes this rank sent (Communicator::bytes_sent) at the last print, and per step since.
  uint64_t bytes_mark_ = 0;
  double bytes_per_step_ = 0.0;
};

TrainLoop::TrainLoop(const config::TrainConfig& cfg, const TrainerEnv& env)
    : cfg_(cfg), env_(env), W_(env.world_size), rank_(env.rank), lead_(env.rank == 0),
      comm_(env.comm != nullptr && (env.comm->size() > 1 || env.single_rank_comm) ? env.comm : nullptr),
      trace_(cfg.monitor.memory_trace) {
  env_check();
  if (trace_.enabled()) {
    trace_.set_device(&train_device());
    timer_.set_observer([this](Section s, bool started) { trace_.mark(started ? "between" : section_name(s)); });
  }
  // ---- model, data, optimizer
  zopts_ = zero_options_from(cfg);
  zopts_.single_rank_comm = env.single_rank_comm;
  device::Device* dev = env.device;
  const bool on_cpu = dev == nullptr || dev->kind() == device::Kind::CPU;
  // Deferred storage (zero.Init): the engine takes each base buffer's values one at a time.
  // At ZeRO-3 on the CPU it keeps only this rank's shards, so no rank ever holds the whole
  // model, loading or training; on a GPU (every stage) the weights go straight to the
  // device, with no host fp32 copy of the model. Stages 0-2 on the CPU hold the whole
  // model anyway: built whole.
  model::BufferFill deferred;
  if (!on_cpu) {
    DeferredModel d = model_create_deferred(cfg, *dev, zopts_.compute_dtype);
    model_ = std::move(d.model);
    deferred = std::move(d.fill);
    deferred_ = true;
  } else if (zopts_.stage == 3) {
    DeferredModel d = model_create_deferred(cfg);
    host_model_ = std::move(d.model);
    deferred = std::move(d.fill);
    deferred_ = true;
  } else {
    host_model_ = model_create(cfg);
  }
  if (!on_cpu && !deferred_) {
    // The compute copy on the device in the compute dtype; the engine's fp32 masters
    // start from the host model's exact weights.
    model_ = model_on_device(*host_model_, *dev, zopts_.compute_dtype);
  }
  const model::Model& built = host_model_ ? *host_model_ : *model_;
  data_ = data_load(cfg, built.config().vocab_size, built.config().max_seq_len);
  micro_ = static_cast<int>(cfg.resolved_micro_batch_size);
  accum_ = static_cast<int>(cfg.resolved_grad_accum_steps);
  T_ = static_cast<int>(data_.train->seq_len());
  reader_ = std::make_unique<BatchReader>(*data_.train, micro_, rank_, W_, static_cast<uint64_t>(cfg.training.seed),
                                          cfg.data.shuffle);
  total_steps_ =
      cfg.training.max_steps ? *cfg.training.max_steps : *cfg.training.epochs * reader_->steps_per_epoch(accum_);
  DT_ENFORCE_GT(total_steps_, 0, ConfigError, "{}: training.max_steps", cfg.source);
  sched_ = lr_schedule_create(schedule_config(cfg, total_steps_), static_cast<float>(cfg.optimizer.lr));
  TrainStepOptions so = step_options_from(cfg, micro_ * data_.train->rows_per_sample(), accum_, T_, cfg.fp16.enabled);
  if (cfg.training.stage == "dpo") {
    pref_ = pref_options_from(cfg, built.lora_on());
    so.preference = pref_;
  }
  so.deferred_weights = std::move(deferred);
  if (!model_) model_ = std::move(host_model_);
  step_ = std::make_unique<TrainStep>(*model_, host_model_.get(), comm_, zopts_, so);
  so.deferred_weights = {};  // closes init_from's files: the engine holds the shards
  scaler_ = step_->scaler();
  tokens_per_step_ = static_cast<int64_t>(micro_) * data_.train->rows_per_sample() * accum_ * W_ * T_;
  res_.final_eval_loss = res_.final_eval_ppl = std::numeric_limits<double>::quiet_NaN();
  config_yaml_ = config::config_to_yaml(cfg);
  inputs_.resize(static_cast<size_t>(accum_));
  targets_.resize(static_cast<size_t>(accum_));
  doc_starts_.resize(static_cast<size_t>(accum_));
  counts_.resize(static_cast<size_t>(accum_));
  ref_batch_.resize(static_cast<size_t>(accum_));
}

void TrainLoop::env_check() const {
  const int W = W_, rank = rank_;
  const config::TrainConfig& cfg = cfg_;
  DT_ENFORCE(W >= 1 && rank >= 0 && rank < W, UsageError, "trainer: rank {} outside world size {}", rank, W);
  if (W > 1) {
    DT_ENFORCE(comm_ != nullptr, UsageError, "trainer: world size {} needs a communicator", W);
    DT_ENFORCE_EQ(comm_->size(), W, UsageError, "trainer: communicator size vs world size");
    DT_ENFORCE_EQ(comm_->rank(), rank, UsageError, "trainer: communicator rank vs rank");
  }
  DT_ENFORCE(cfg.resolved_micro_batch_size > 0 && cfg.resolved_grad_accum_steps > 0, UsageError,
             "trainer: the batch sizes are not resolved; call config_resolve_batch(cfg, {}) first", W);
  DT_ENFORCE_EQ(cfg.resolved_dp_world_size, static_cast<int64_t>(W), UsageError,
                "trainer: config_resolve_batch was called for another world size");
  DT_ENFORCE(!(cfg.fp16.enabled && cfg.bf16.enabled), ConfigError, "{}: fp16.enabled and bf16.enabled are exclusive",
             cfg.source);
}

// The latest complete checkpoint of the run dir, whatever world size and stage wrote it
// (checkpoint_load reshards). Everything the loop's future depends on comes back:
// weights, AdamW moments and step, scheduler position, loss scaler, the global sampler
// position and the forward count (LoRA dropout masks). The loop draws no other random
// numbers, so no per-rank RNG stream is saved (has_rng stays false).
void TrainLoop::resume() {
  if (!env_.run_dir.empty()) {
    std::error_code ec;
    fs::create_directories(env_.run_dir, ec);
    DT_ENFORCE(!ec, IoError, "cannot create the run directory {}: {}", env_.run_dir, ec.message());
  }
  if (env_.run_dir.empty() || !env_.resume) return;
  const CheckpointLoadResult ck = checkpoint_load(env_.run_dir, step_->engine().checkpoint_view());
  res_.checkpoints_skipped = ck.skipped;
  if (lead_ && env_.print)
    for (const auto& why : ck.skipped) std::printf("resume: skipped a damaged checkpoint: %s\n", why.c_str());
  if (!ck.loaded) return;
  const TrainState& st = ck.state;
  start_step_ = st.step;
  res_.steps = st.step;
  res_.applied_steps = st.scheduler_step;
  res_.skipped_steps = st.step - st.scheduler_step;
  res_.tokens = st.step * tokens_per_step_;
  if (scaler_) {
    if (st.has_scaler) scaler_->set_state(st.scaler);
    else if (lead_) log_warn("{} was saved without fp16 loss scaling: the loss scaler starts fresh", ck.dir);
  }
  reader_->set_position(st.sampler);
  model_->set_forward_count(st.forward_count);
  res_.resumed_step = st.step;
  res_.resumed_dir = ck.dir;
  res_.resumed_world_size = ck.saved_world_size;
  res_.resumed_stage = ck.saved_stage;
  if (lead_ && env_.print)
    std::printf("resumed from step %lld (checkpoints/%s, saved at world size %d stage %d)\n",
                static_cast<long long>(st.step), fs::path(ck.dir).filename().c_str(), ck.saved_world_size,
                ck.saved_stage);
  if (lead_ && st.step > total_steps_)
    log_warn(
        "the checkpoint is at step {} but training.max_steps is {}: nothing to train; raise "
        "training.max_steps to continue",
        st.step, total_steps_);
}

void TrainLoop::metrics_open() {
  if (lead_ && !env_.run_dir.empty() && start_step_ < total_steps_) {
    // final/ is the model of a run that finished: one that trains on (a resume with more
    // steps) drops the old one, so an interruption cannot leave eval, generate and export
    // (which prefer final/) on weights older than its latest checkpoint.
    // The entry itself, never what a link names: a final -> final loop (which exists()
    // cannot resolve) or a link to a directory elsewhere goes as a link.
    const fs::path final_dir = fs::path(env_.run_dir) / "final";
    std::error_code ec;
    if (fs::exists(fs::symlink_status(final_dir, ec)) && fs::remove_all(final_dir, ec) > 0 && !ec)
      log_info("removed {}: the run trains on from step {}, its final/ is written again at the end", final_dir.string(),
               start_step_);
  }
  if (lead_ && !env_.run_dir.empty()) {
    const std::string path = (fs::path(env_.run_dir) / "metrics.jsonl").string();
    if (res_.resumed_step >= 0) metrics_cut_after(path, res_.resumed_step);
    metrics_ = std::make_unique<MetricsWriter>(path, res_.resumed_step >= 0);
  }
  if (lead_ && !env_.run_dir.empty() && cfg_.tensorboard.enabled && start_step_ < total_steps_) {
    // Every round that trains opens a new event file beside the older ones. Its
    // SessionLog START at the first step it runs makes TensorBoard drop what earlier files
    // hold from that step on: the steps a failed round ran past its last checkpoint
    // (metrics_cut_after's job for metrics.jsonl), since old files are never rewritten.
    const auto& t = cfg_.tensorboard;
    tb_ = std::make_unique<tensorboard::EventWriter>(tensorboard::log_dir(env_.run_dir, t.output_path, t.job_name));
    tb_->session_start(start_step_ + 1);
    if (env_.print) std::printf("tensorboard: writing %s\n", tb_->path().c_str());
  }
  const model::Model& m = *model_;
  if (lead_ && env_.print)
    std::printf(
        "train: %s %zu params (%zu trainable), %zu train samples of %d tokens, %d rank(s) x micro %d x accum %d, "
        "%lld steps, %s\n",
        model::arch_name(m.config().arch), m.num_params(), m.num_trainable_params(), data_.train->size(), T_, W_,
        micro_, accum_, static_cast<long long>(total_steps_), dtype_name(zopts_.compute_dtype));
  if (lead_ && env_.print) std::printf("%s", step_->engine().report().memory_text().c_str());
}

// Data first: each micro-batch's unmasked-target count. Their sum over the ranks, which
// scales the cross-entropy backward (every target of the step weighs the same), is
// taken on the device (ZeroEngine::targets_reduce), not here.
void TrainLoop::batch_load() {
  auto s = timer_.scope(Section::DATA);
  for (int a = 0; a < accum_; ++a) {
    const auto i = static_cast<size_t>(a);
    counts_[i] = reader_->next(inputs_[i], targets_[i], doc_starts_[i]);
    if (ref_table_.empty()) continue;
    // The precomputed reference sums of the micro-batch's rows: its pairs' chosen, then
    // their rejected, as the rows are laid out.
    const std::vector<size_t>& idx = reader_->last_indices();
    ref_batch_[i].resize(2 * idx.size());
    for (size_t k = 0; k < idx.size(); ++k) {
      ref_batch_[i][k] = ref_table_[2 * idx[k]];
      ref_batch_[i][idx.size() + k] = ref_table_[2 * idx[k] + 1];
    }
  }
}

void TrainLoop::record(int64_t step, const StepOutcome& out) {
  res_.steps = step;
  if (out.applied) ++res_.applied_steps;
  else ++res_.skipped_steps;
  res_.losses.push_back(out.loss);
  res_.lrs.push_back(out.lr);
  res_.grad_norms.push_back(out.grad_norm);
  res_.loss_scales.push_back(out.loss_scale);
  res_.skipped.push_back(out.applied ? 0 : 1);
  res_.final_loss = out.loss;
  res_.tokens += tokens_per_step_;
  ++interval_steps_;
}

void TrainLoop::progress_log(int64_t step, const StepOutcome& out) {
  metric_means_.add(out.metrics);
  const int64_t print_every = std::max<int64_t>(1, cfg_.steps_per_print);
  if (step % print_every != 0 && step != total_steps_) return;
  const double dt = interval_clock_.elapsed_s();
  const double per_step = dt / static_cast<double>(interval_steps_);
  const double tps = static_cast<double>(tokens_per_step_ * interval_steps_) / std::max(dt, 1e-9);
  // Collective: every rank reaches this print step.
  const RankTimes times = rank_times_take(dt, interval_steps_);
  // The loss, lr and grad norm are the interval's last step's; the named metrics its means.
  report::ProgressRecord rec;
  rec.step = step;
  rec.total_steps = total_steps_;
  rec.tokens_per_s = tps;
  rec.step_time_s = per_step;
  progress_record_outcome(rec, out);
  rec.metrics = metric_means_.take();
  if (W_ > 1) {
    // With several ranks: what this rank sent per step and how long the engine's
    // collectives ran (the launcher's live view shows both; compression changes them),
    // and every rank's times for the launcher's straggler check.
    rec.comm_bytes_per_step = bytes_per_step_;
    rec.comm_s_per_step = last_comm_times_.busy_s / static_cast<double>(interval_steps_);
    rec.times = times;
  }
  nlohmann::json fields;
  if (metrics_) {
    fields = {{"tokens", res_.tokens}, {"skipped_steps", res_.skipped_steps}};
    // Memory: this rank's ZeRO state (params + grads + optimizer) and the process RSS.
    fields["memory_state_bytes"] = step_->engine().report().memory().total();
    fields["memory_rss_bytes"] = process_rss_bytes();
    if (cfg_.wall_clock_breakdown) {
      const double n = static_cast<double>(interval_steps_);
      for (Section sec :
           {Section::FORWARD, Section::BACKWARD, Section::COMM, Section::OPTIMIZER, Section::DATA, Section::CHECKPOINT})
        fields[std::string(section_name(sec)) + "_ms"] = timer_.elapsed_ms(sec) / n;
      // The ZeRO engine's collectives: exposed = the compute thread waited for them;
      // overlapped = they ran on the communication thread while compute went on.
      const ZeroCommTimes& ct = last_comm_times_;
      fields["comm_exposed_ms"] = 1e3 * ct.exposed_s / n;
      fields["comm_overlapped_ms"] = 1e3 * std::max(0.0, ct.busy_s - ct.exposed_s) / n;
    }
  }
  progress_publish(rec, std::move(fields), unix_ms(),
                   {.out = lead_ && env_.print ? stdout : nullptr,
                    .records = env_.progress_records,
                    .metrics = metrics_.get(),
                    .tb = tb_.get(),
                    .loss_scaling = scaler_ != nullptr});
  timer_.reset();
  interval_clock_.restart();
  interval_steps_ = 0;
}

void TrainLoop::evaluate(int64_t step) {
  trace_.mark("between");
  evaluate_run(step);
  trace_.mark("eval");
}

void TrainLoop::evaluate_run(int64_t step) {
  if (!data_.valid) return;
  if (pref_) {
    pref_evaluate_valid(step);
    return;
  }
  // At stage 3 each forward gathers its layers with collectives: every rank makes the same
  // number of forwards (the ones with fewer samples run masked ones), so the weights are
  // gathered layer by layer as in training, never whole on a rank.
  const int forwards = zopts_.stage == 3 && comm_ ? eval_forwards(*data_.valid, micro_, 0, W_) : 0;
  EvalLoss e = eval_loss(*model_, *data_.valid, micro_, 0, rank_, W_, forwards);
  std::vector<double> v{e.loss_sum, static_cast<double>(e.tokens)};
  comm::allreduce_sum_host(comm_, v);
  e.loss_sum = v[0];
  e.tokens = static_cast<int64_t>(v[1]);
  res_.final_eval_loss = e.mean();
  res_.final_eval_ppl = e.ppl();
  if (!lead_) return;
  if (env_.print)
    std::printf("eval step %lld | eval_loss %.4f | eval_ppl %.3f\n", static_cast<long long>(step), e.mean(), e.ppl());
  const int64_t now_ms = unix_ms();
  if (tb_) tb_->scalars(step, {{"eval/loss", e.mean()}, {"eval/ppl", e.ppl()}}, static_cast<double>(now_ms) / 1e3);
  if (metrics_)
    metrics_->write({{"step", step}, {"eval_loss", num(e.mean())}, {"eval_ppl", num(e.ppl())}, {"time_ms", now_ms}});
}

// A preference run's held-out pairs: the share whose chosen answer the model ranks above
// the rejected one, and the chosen answers' loss (as eval_loss, so plots keep one curve).
void TrainLoop::pref_evaluate_valid(int64_t step) {
  PrefEval e = pref_eval(*model_, *data_.valid, micro_, rank_, W_, zopts_.stage == 3 && comm_ != nullptr);
  std::vector<double> v{e.pairs, e.preferred, e.chosen_loss_sum, e.chosen_targets};
  comm::allreduce_sum_host(comm_, v);
  e.pairs = v[0];
  e.preferred = v[1];
  e.chosen_loss_sum = v[2];
  e.chosen_targets = v[3];
  res_.final_eval_loss = e.chosen_loss();
  res_.final_eval_ppl = std::exp(e.chosen_loss());
  res_.final_pref_accuracy = e.accuracy();
  if (!lead_) return;
  if (env_.print)
    std::printf("eval step %lld | eval_loss %.4f | eval_pref_accuracy %.4f (%lld pairs)\n",
                static_cast<long long>(step), e.chosen_loss(), e.accuracy(), static_cast<long long>(e.pairs));
  const int64_t now_ms = unix_ms();
  if (tb_)
    tb_->scalars(step, {{"eval/loss", e.chosen_loss()}, {"eval/pref_accuracy", e.accuracy()}},
                 static_cast<double>(now_ms) / 1e3);
  if (metrics_)
    metrics_->write({{"step", step},
                     {"eval_loss", num(e.chosen_loss())},
                     {"eval_pref_accuracy", num(e.accuracy())},
                     {"time_ms", now_ms}});
}

// DPO with a precomputed reference: the starting model's sums of every training pair,
// computed before the first step and kept in the run directory; a resumed run reads them
// back (rank 0 reads, every rank receives), since its weights are no longer the start.
void TrainLoop::reference_prepare() {
  if (!pref_ || pref_->reference != PrefReference::PRECOMPUTED) return;
  const data::TokenDataset& pairs = *data_.train;
  const uint64_t fp = pairs_fingerprint(pairs);
  if (res_.resumed_step >= 0 && !env_.run_dir.empty()) {
    ref_table_.assign(2 * pairs.size(), 0.0f);
    std::string error;
    if (lead_) {
      try {
        ref_table_ = reference_logps_load(env_.run_dir, pairs.size(), fp);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    // Every rank learns whether rank 0 could read it, then receives the table.
    float bad = error.empty() ? 0.0f : 1.0f;
    if (comm_) comm_->allreduce_host(&bad, 1, DType::F32, comm::ReduceOp::MAX);
    if (lead_) DT_ENFORCE(error.empty(), ConfigError, "{}", error);
    DT_ENFORCE(bad == 0.0f, ConfigError,
               "rank 0 could not read the run's reference log-probabilities (its log says why)");
    if (comm_ && !ref_table_.empty())
      comm_->broadcast(ref_table_.data(), ref_table_.data(), ref_table_.size(), DType::F32, 0);
    return;
  }
  Stopwatch clock;
  ref_table_ =
      reference_logps_compute(*model_, pairs, micro_, rank_, W_, comm_, zopts_.stage == 3 && comm_ != nullptr, false);
  if (lead_ && !env_.run_dir.empty()) reference_logps_save(env_.run_dir, ref_table_, fp);
  if (lead_ && env_.print) {
    std::printf("train: reference log-probabilities of %zu pairs computed (%.1f s)%s\n", pairs.size(),
                clock.elapsed_s(), env_.run_dir.empty() ? "" : ", saved as reference_logps.bin");
    std::fflush(stdout);
  }
}

// Collective (every rank writes its shard). Runs after the step's evaluation, so the
// forward count it saves is the one the next step starts from.
void TrainLoop::save(int64_t step) {
  auto s = timer_.scope(Section::CHECKPOINT);
  Stopwatch clock;
  TrainState st;
  st.step = step;
  st.scheduler_step = res_.applied_steps;
  st.has_scaler = scaler_ != nullptr;
  if (scaler_) st.scaler = scaler_->state();
  st.sampler = reader_->position();
  st.forward_count = model_->forward_count();
  st.config_yaml = config_yaml_;
  CheckpointSaveOptions o;
  o.keep_last = cfg_.training.keep_last;
  // Validated octal (0700, 0750, 0770 or 0755): the bound on the checkpoint's permissions.
  o.max_mode = static_cast<mode_t>(std::strtoul(cfg_.training.run_dir_mode.c_str(), nullptr, 8) & 0777) | 0700;
  res_.last_checkpoint = checkpoint_save(env_.run_dir, step_->engine().checkpoint_view(), st, o);
  if (lead_ && env_.print) {
    std::printf("checkpoint: saved checkpoints/%s (%.2f s)\n", fs::path(res_.last_checkpoint).filename().c_str(),
                clock.elapsed_s());
    std::fflush(stdout);
  }
}

// Every rank answers; one yes stops them all (so every rank leaves the loop at the same step).
bool TrainLoop::stop_requested(int64_t step) {
  if (!env_.stop_after_save) return false;
  float want = env_.stop_after_save(step) ? 1.0f : 0.0f;
  if (comm_) comm_->allreduce_host(&want, 1, DType::F32, comm::ReduceOp::MAX);
  return want != 0.0f;
}

// Every rank's compute time and wait in collectives per step over the last print interval
// (ms), gathered on every rank. Wait = the host's own collectives (COMM) plus the time the
// compute thread waited for the ZeRO engine's; compute = the rest of the step's wall time,
// so anything that delays a rank (a slow GPU, a busy CPU, an injected test delay) counts
// as its compute, and its peers' waiting for it as their communication.
RankTimes TrainLoop::rank_times_take(double interval_s, int64_t steps) {
  const ZeroCommTimes ct = step_->engine().report().comm_times_take();
  const double n = static_cast<double>(std::max<int64_t>(1, steps));
  if (comm_) {
    // Everything this rank sent since the last print (the gradients, the step's small
    // agreements and the last print's gather), per step.
    const uint64_t sent = comm_->bytes_sent();
    bytes_per_step_ = static_cast<double>(sent - bytes_mark_) / n;
    bytes_mark_ = sent;
  }
  const double step_ms = 1e3 * interval_s / n;
  const double comm_ms = (timer_.elapsed_ms(Section::COMM) + 1e3 * ct.exposed_s) / n;
  const float mine[2] = {static_cast<float>(std::max(0.0, step_ms - comm_ms)), static_cast<float>(comm_ms)};
  std::vector<float> all(2 * static_cast<size_t>(W_));
  if (comm_) comm_->all_gather_host(mine, all.data(), 2, DType::F32);
  else std::copy(mine, mine + 2, all.begin());
  RankTimes t;
  for (int r = 0; r < W_; ++r) {
    t.compute_ms.push_back(all[2 * static_cast<size_t>(r)]);
    t.comm_ms.push_back(all[2 * static_cast<size_t>(r) + 1]);
  }
  last_comm_times_ = ct;
  return t;
}

void TrainLoop::export_final(bool trained) {
  // The fp32 masters, gathered by every rank (collectives): in the model's own buffers on
  // the CPU, copied to the host model from a device. A deferred (ZeRO-3 CPU) run never
  // gathers the whole model: its final checkpoint, saved just before, holds the masters.
  if (!deferred_) {
    if (host_model_) step_->engine().weights().to_host(*host_model_);
    else step_->engine().weights().materialize();
  }
  // No run directory (the same on every rank): nothing to write, so no wait either. The
  // wait's polls are collectives whose number depends on when rank 0's worker thread
  // finishes, which a loaded machine changes.
  if (env_.run_dir.empty()) return;
  lead_work_wait([&] {
    const std::string dir = (fs::path(env_.run_dir) / "final").string();
    // final/ is the run's own directory: a symbolic link there (a loop, or one to a model
    // elsewhere) is replaced, never written through.
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(dir, ec))) {
      fs::remove(dir, ec);
      DT_ENFORCE(!ec, IoError, "{} is a symbolic link and cannot be removed ({}): remove it, then resume", dir,
                 ec.message());
      log_info("removed {}: a symbolic link, where the run writes its final/ directory", dir);
    }
    // The config's export section decides dtype, shards and a merged model either way; a
    // deferred run's export streams each tensor from the checkpoint's shards (no model).
    if (deferred_) {
      checkpoint_export_hf(env_.run_dir, dir);
    } else {
      HfExportOptions opts = hf_export_options(cfg_);
      opts.bos_id = data_.tokenizer->bos_id();
      opts.eos_id = data_.tokenizer->eos_id();
      model_export_hf(host_model_ ? *host_model_ : *model_, dir, opts);
    }
    if (env_.print && trained)
      std::printf("train: wrote %s (%lld steps, final loss %.4f, %.1f s)\n", dir.c_str(),
                  static_cast<long long>(res_.steps), res_.final_loss, res_.elapsed_s);
    else if (env_.print)
      std::printf(
          "train: nothing to train (the checkpoint is at step %lld, training.max_steps %lld); wrote %s "
          "again\n",
          static_cast<long long>(res_.steps), static_cast<long long>(total_steps_), dir.c_str());
    std::fflush(stdout);
  });
}

// Rank 0 runs `work` (no collectives in it) on a thread while every rank polls, once a
// second, whether it is done: no rank leaves before it is, and no collective waits longer
// than a poll however long the work takes (a multi-GB export outlasts Gloo's timeout).
// The work's error is rank 0's; the others leave normally.
void TrainLoop::lead_work_wait(const std::function<void()>& work) {
  if (!comm_) {
    if (lead_) work();
    return;
  }
  std::atomic<bool> done{!lead_};
  std::exception_ptr error;
  std::thread worker;
  if (lead_)
    worker = std::thread([&] {
      try {
        work();
      } catch (...) {
        error = std::current_exception();
      }
      done = true;
    });
  try {
    for (;;) {
      float busy = done ? 0.0f : 1.0f;
      comm_->allreduce_host(&busy, 1, DType::F32, comm::ReduceOp::MAX);
      if (busy == 0.0f) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  } catch (...) {
    if (worker.joinable()) worker.join();
    throw;
  }
  if (worker.joinable()) worker.join();
  if (error) std::rethrow_exception(error);
}

TrainResult TrainLoop::run() {
  resume();
  reference_prepare();
  metrics_open();
  // What the build freed (a deferred build's staging, the full gradient arrays stages 2-3
  // release to the engine's shards) is not the step's working set: the allocator's cache
  // gives it back rather than keep it beside the step's buffers.
  train_device().memory_trim();
  trace_.mark("build");  // the model, the engine's state, the data, a resumed checkpoint
  // The loop's wall time excludes the model build, resume and the export.
  run_clock_.restart();
  interval_clock_.restart();
  timer_.reset();
  if (env_.on_step) env_.on_step(start_step_);
  // A preference run evaluates the starting model too: its held-out accuracy is the
  // figure the trained one is measured against.
  if (pref_ && start_step_ == 0 && start_step_ < total_steps_) evaluate(0);
  for (int64_t step = start_step_ + 1; step <= total_steps_; ++step) {
    batch_load();
    const StepOutcome out = step_->run(
        step, sched_->lr(res_.applied_steps),
        StepBatch{&inputs_, &targets_, &counts_, ref_table_.empty() ? nullptr : &ref_batch_, &doc_starts_}, timer_);
    res_.graph_steps = step_->graph_steps();
    if (out.target_count == 0 && lead_) log_warn("step {}: every target of the batch is masked (loss 0)", step);
    record(step, out);
    progress_log(step, out);
    if (cfg_.training.eval_steps > 0 && step % cfg_.training.eval_steps == 0 && step != total_steps_) evaluate(step);
    if (!env_.run_dir.empty() && cfg_.training.save_steps > 0 && step % cfg_.training.save_steps == 0 &&
        step != total_steps_) {
      save(step);
      if (stop_requested(step)) {
        res_.stopped_at_checkpoint = true;
        if (env_.on_step) env_.on_step(step);
        break;
      }
    }
    if (env_.on_step) env_.on_step(step);
  }
  if (res_.stopped_at_checkpoint) {
    if (env_.on_steps_done) env_.on_steps_done();
    res_.elapsed_s = run_clock_.elapsed_s();
    res_.final_loss_scale = scaler_ ? scaler_->scale() : 1.0;
    if (lead_ && env_.print) {
      std::printf("train: stopped after the checkpoint at step %lld (the launcher changes the job's membership)\n",
                  static_cast<long long>(res_.steps));
      std::fflush(stdout);
    }
    if (comm_) comm_->barrier();
    return res_;
  }
  if (env_.on_steps_done) env_.on_steps_done();
  // A resumed run that was already at (or past) its last step trains nothing: its final
  // evaluation and checkpoint exist.
  const bool trained = start_step_ < total_steps_;
  if (trained) evaluate(total_steps_);
  res_.elapsed_s = run_clock_.elapsed_s();
  res_.final_loss_scale = scaler_ ? scaler_->scale() : 1.0;
  if (trained && !env_.run_dir.empty()) save(total_steps_);
  // Each rank's peak host memory of building, training and checkpointing (the export
  // that follows is its own phase): the figure ZeRO's sharding is about.
  const size_t peak = trace_.peak();
  log_info("memory: rank {} peak resident {:.2f} GiB ({} MiB) before the final export", rank_,
           static_cast<double>(peak) / (1024.0 * 1024.0 * 1024.0), peak >> 20);
  trace_.mark("between");
  // The step's working buffers (gathers, layer gradients, buckets) do not come back: the
  // export's own buffers take their place rather than adding to them.
  train_device().memory_trim();
  export_final(trained);
  if (trace_.enabled()) {
    trace_.mark("export");
    log_info("memory trace: rank {} peak resident by phase: {} (the plan, --dry-run: {:.2f} GiB)", rank_,
             trace_.summary(), memory_plan(cfg_, W_).host_bytes() / (1024.0 * 1024.0 * 1024.0));
  }
  return res_;
}

}  // namespace

// ----------------------------------------------------------------------------
TrainResult train_run(const config::TrainConfig& cfg, const TrainerEnv& env) { return TrainLoop(cfg, env).run(); }

}  // namespace dtrain::train
