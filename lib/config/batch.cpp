// DeepSpeed's batch-size rule: train_batch_size = micro_batch * grad_accum * dp_world_size,
// resolving whichever of the three were not given. Errors show all four numbers.
#include "config/train_config.h"

#include "core/check.h"

#include <fmt/format.h>

namespace dtrain::config {

namespace {

std::string show(const std::optional<int64_t>& v) { return v ? fmt::format("{}", *v) : "not set"; }

// Products of user numbers: an overflow is a config error, not undefined behaviour.
int64_t mul(int64_t a, int64_t b, const std::string& src, const std::string& numbers) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    DT_THROW(ConfigError, "{}: batch sizes: the product overflows ({}); use realistic batch sizes", src, numbers);
  return r;
}

}  // namespace

void config_resolve_batch(TrainConfig& cfg, int dp_world_size) {
  const std::optional<int64_t> tb = cfg.train_batch_size, mb = cfg.train_micro_batch_size_per_gpu,
                               ga = cfg.gradient_accumulation_steps;
  const int64_t w = dp_world_size;
  const std::string numbers = fmt::format(
      "train_batch_size = {}, train_micro_batch_size_per_gpu = {}, gradient_accumulation_steps = {}, "
      "data-parallel world size = {}",
      show(tb), show(mb), show(ga), w);
  const std::string& src = cfg.source;
  if (w < 1) DT_THROW(ConfigError, "{}: batch sizes: the data-parallel world size must be >= 1 ({})", src, numbers);
  for (const auto& v : {tb, mb, ga})
    if (v && *v < 1) DT_THROW(ConfigError, "{}: batch sizes: every given batch key must be >= 1 ({})", src, numbers);

  int64_t t = 0, m = 0, g = 0;
  if (tb && mb && ga) {
    t = *tb, m = *mb, g = *ga;
    const int64_t want = mul(mul(m, g, src, numbers), w, src, numbers);
    if (t != want)
      DT_THROW(ConfigError,
               "{}: batch sizes: train_batch_size must equal train_micro_batch_size_per_gpu * "
               "gradient_accumulation_steps * world size = {} * {} * {} = {} ({}); change train_batch_size to {}, "
               "or drop one of the three keys to have it derived",
               src, m, g, w, want, numbers, want);
  } else if (tb && mb) {
    t = *tb, m = *mb;
    const int64_t per_step = mul(m, w, src, numbers);
    if (t % per_step != 0)
      DT_THROW(ConfigError,
               "{}: batch sizes: train_batch_size {} is not divisible by train_micro_batch_size_per_gpu * world size "
               "= {} * {} = {} ({}); change train_batch_size to a multiple of {} or train_micro_batch_size_per_gpu",
               src, t, m, w, per_step, numbers, per_step);
    g = t / per_step;
  } else if (tb && ga) {
    t = *tb, g = *ga;
    const int64_t per_micro = mul(g, w, src, numbers);
    if (t % per_micro != 0)
      DT_THROW(ConfigError,
               "{}: batch sizes: train_batch_size {} is not divisible by gradient_accumulation_steps * world size "
               "= {} * {} = {} ({}); change train_batch_size to a multiple of {} or gradient_accumulation_steps",
               src, t, g, w, per_micro, numbers, per_micro);
    m = t / per_micro;
  } else if (mb && ga) {
    m = *mb, g = *ga;
    t = mul(mul(m, g, src, numbers), w, src, numbers);
  } else if (tb) {
    t = *tb, g = 1;
    if (t % w != 0)
      DT_THROW(ConfigError,
               "{}: batch sizes: train_batch_size {} is not divisible by the world size {} ({}); change "
               "train_batch_size to a multiple of {} or set train_micro_batch_size_per_gpu instead",
               src, t, w, numbers, w);
    m = t / w;
  } else if (mb) {
    m = *mb, g = 1;
    t = mul(m, w, src, numbers);
  } else {
    DT_THROW(ConfigError,
             "{}: batch sizes: none given ({}); set train_micro_batch_size_per_gpu (and optionally "
             "gradient_accumulation_steps or train_batch_size)",
             src, numbers);
  }
  cfg.resolved_train_batch_size = t;
  cfg.resolved_micro_batch_size = m;
  cfg.resolved_grad_accum_steps = g;
  cfg.resolved_dp_world_size = w;
  config_check_batch_widths(cfg);
}

ElasticBatch config_elastic_batch(const TrainConfig& cfg, int ref_world, int world) {
  TrainConfig ref = cfg;
  if (ref.resolved_dp_world_size != ref_world) config_resolve_batch(ref, ref_world);
  const int64_t t = ref.resolved_train_batch_size, m = ref.resolved_micro_batch_size, g = ref.resolved_grad_accum_steps;
  DT_ENFORCE(world >= 1, ConfigError, "{}: an elastic round needs at least one rank", cfg.source);
  ElasticBatch out;
  out.cfg = cfg;
  int64_t t2 = t, g2 = g;
  if (t % (m * world) == 0) {
    g2 = t / (m * world);
    out.note = g2 == g ? fmt::format("batch unchanged: train_batch_size {} = micro {} x accumulation {} x {} ranks", t,
                                     m, g, world)
                       : fmt::format(
                             "train_batch_size {} kept: gradient_accumulation_steps {} -> {} on {} ranks "
                             "(micro-batch {})",
                             t, g, g2, world, m);
  } else {
    t2 = m * g * world;
    out.global_changed = true;
    out.note = fmt::format(
        "train_batch_size {} -> {}: {} is not a multiple of micro-batch {} x {} ranks, so the "
        "micro-batch {} and gradient_accumulation_steps {} stay and the global batch follows the "
        "world size (the learning rate schedule is unchanged)",
        t, t2, t, m, world, m, g);
  }
  out.cfg.train_batch_size = t2;
  out.cfg.train_micro_batch_size_per_gpu = m;
  out.cfg.gradient_accumulation_steps = g2;
  config_resolve_batch(out.cfg, world);
  return out;
}

}  // namespace dtrain::config
