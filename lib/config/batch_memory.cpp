// The widths and memory one rank's batch needs, checked when the batch is resolved and
// before anything is allocated: a micro-batch of 2^31 sequences, or micro 65536 x
// accumulation 65536, is a config error naming the key, not std::bad_alloc on a rank.
// Also the monitor's memory threshold against the node's memory, and the two rules the
// trainer's memory plan counts with too (a step's token ids, the recompute's activation sets).
#include "config/train_config.h"

#include "core/check.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

namespace dtrain::config {

namespace {

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

double config_batch_token_bytes(const TrainConfig& cfg, double tokens_per_micro) {
  const double g = static_cast<double>(std::max<int64_t>(1, cfg.resolved_grad_accum_steps));
  return g * tokens_per_micro * 2 * sizeof(int32_t);
}

double config_activation_sets(double n_layer, double recomputed) {
  return n_layer - recomputed + (recomputed > 0 ? 1 : 0);
}

BatchFootprint config_batch_footprint(const TrainConfig& cfg) {
  BatchFootprint f;
  if (!cfg.data.seq_len || cfg.resolved_micro_batch_size <= 0) return f;
  // Products in double: the point is to refuse the ones that overflow.
  const double T = static_cast<double>(*cfg.data.seq_len), m = static_cast<double>(cfg.resolved_micro_batch_size);
  const double N = m * T;
  f.tokens_per_micro = N > static_cast<double>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(N);
  // The trainer keeps every micro-batch of the step on the host: int32 ids and targets.
  f.batch_bytes = config_batch_token_bytes(cfg, N);
  const ModelConfig& mc = cfg.model;
  if (!mc.n_layer || !mc.d_model || !mc.vocab_size) return f;
  const double L = static_cast<double>(*mc.n_layer), C = static_cast<double>(*mc.d_model),
               V = static_cast<double>(*mc.vocab_size), F = static_cast<double>(mc.d_ff.value_or(*mc.d_model));
  // 2 bytes an element with fp16/bf16 compute, else 4; the arena holds per layer at least the
  // residual, two norms, the attention output and the MLP's hidden activations, and the logits.
  // Recomputed layers share one layer's set; left to the memory plan (activation_checkpointing
  // not given), the fewest sets it can choose (every layer recomputed): a lower bound.
  const ActivationCheckpointingConfig& ac = cfg.activation_checkpointing;
  const double k = ac.layers ? std::min(L, static_cast<double>(*ac.layers)) : ac.enabled.value_or(true) ? L : 0;
  const double sets = config_activation_sets(L, k);
  const double es = cfg.fp16.enabled || cfg.bf16.enabled ? 2 : 4;
  f.activation_bytes = N * (L * C + sets * (3 * C + 2 * F) + V) * es;
  const double params = V * C + L * (2 * C * C + 2 * C * F);
  const double shards = cfg.zero.stage == 3 ? static_cast<double>(std::max<int64_t>(1, cfg.resolved_dp_world_size)) : 1;
  f.weight_bytes = params * es / shards;
  return f;
}

void config_check_batch_widths(const TrainConfig& cfg) {
  if (!cfg.data.seq_len || cfg.resolved_micro_batch_size <= 0) return;
  const int64_t T = *cfg.data.seq_len, m = cfg.resolved_micro_batch_size;
  int64_t n = 0;
  if (__builtin_mul_overflow(m, T, &n) || n > INT32_MAX)
    DT_THROW(ConfigError,
             "{}: train_micro_batch_size_per_gpu: {} sequences x data.seq_len {} = {} tokens per micro-batch; the "
             "model indexes a micro-batch's tokens with 32-bit integers (at most {}): lower "
             "train_micro_batch_size_per_gpu to at most {} (use gradient_accumulation_steps for a larger global batch)",
             cfg.source, m, T, static_cast<double>(m) * static_cast<double>(T), INT32_MAX, INT32_MAX / T);
}

void config_check_batch_memory(const TrainConfig& cfg, int ranks, double memory_bytes, const std::string& memory_what) {
  if (memory_bytes <= 0 || ranks < 1) return;
  const BatchFootprint f = config_batch_footprint(cfg);
  const double need = f.total() * ranks;
  if (need <= memory_bytes) return;
  // A model that does not fit by itself is the model factory's error (it names the model's
  // size and says to choose a smaller one); this one is about the batch.
  if (f.weight_bytes * ranks > memory_bytes) return;
  // Name the key that dominates: the host batches grow with accumulation, the rest with micro.
  const bool accum = f.batch_bytes > f.activation_bytes + f.weight_bytes && cfg.resolved_grad_accum_steps > 1;
  DT_THROW(ConfigError,
           "{}: {}: the job needs at least {:.1f} GiB ({} rank(s) x [{:.1f} GiB activations for micro-batch {} x "
           "seq_len {}, {:.1f} GiB weights, {:.1f} GiB of the step's {} micro-batch(es) of token ids]) but {}: lower "
           "train_micro_batch_size_per_gpu (now {}) or gradient_accumulation_steps (now {})",
           cfg.source, accum ? "gradient_accumulation_steps" : "train_micro_batch_size_per_gpu", gib(need), ranks,
           gib(f.activation_bytes), cfg.resolved_micro_batch_size, cfg.data.seq_len.value_or(0), gib(f.weight_bytes),
           gib(f.batch_bytes), cfg.resolved_grad_accum_steps, memory_what, cfg.resolved_micro_batch_size,
           cfg.resolved_grad_accum_steps);
}

void config_check_host_batch_memory(const TrainConfig& cfg, int ranks, bool whole_job) {
  const double bytes = config_host_memory_bytes();
  config_check_batch_memory(
      cfg, ranks, bytes,
      whole_job ? fmt::format("this machine, where all {} rank(s) run, has {:.1f} GiB of memory", ranks, gib(bytes))
                : fmt::format("this machine has {:.1f} GiB of memory for its {} rank(s)", gib(bytes), ranks));
}

int64_t config_min_free_memory_bytes(const TrainConfig& cfg, double memory_bytes) {
  const double gb = cfg.monitor.min_free_memory;
  const double bytes = gb * 1024.0 * 1024.0 * 1024.0;
  constexpr const char* kUnit = "monitor.min_free_memory is in GiB, not bytes";
  if (memory_bytes > 0) {
    const bool below = bytes < memory_bytes;
    const char* how = bytes > memory_bytes ? "more than" : "all of";
    DT_ENFORCE(below, ConfigError,
               "{}: monitor.min_free_memory = {} GiB is {} this node's {:.1f} GiB of memory: the node's available "
               "memory is always below it, so its low_memory alert would hold from the first sample on; {}: set it "
               "below {:.1f}, or 0 for no such alert",
               cfg.source, gb, how, gib(memory_bytes), kUnit, gib(memory_bytes));
  }
  // Unknown memory: still within what the alert's 64-bit byte count holds (1e10 GiB wraps).
  const bool representable = std::isfinite(bytes) && bytes < 0x1p62;
  DT_ENFORCE(representable, ConfigError,
             "{}: monitor.min_free_memory = {} GiB is more memory than a node has; {}: set it below the node's "
             "memory, or 0 for no such alert",
             cfg.source, gb, kUnit);
  return static_cast<int64_t>(bytes);
}

double config_host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0;
}

}  // namespace dtrain::config
