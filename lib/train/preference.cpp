// The preference objectives (DPO sigmoid with label smoothing, ORPO, SimPO) and the
// gradient of each with respect to the rows' log-probability sums, in double precision on
// the host: a pair is a handful of scalars, the model's backward does the rest.
#include "train/preference.h"

#include "core/check.h"

#include <cmath>
#include <optional>

namespace dtrain::train {

namespace {

// log(sigmoid(x)) and sigmoid(x) without overflow for any finite x.
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

}  // namespace

PrefOptions pref_options_from(const config::TrainConfig& cfg, bool lora) {
  const config::TrainingConfig& t = cfg.training;
  PrefOptions o;
  o.loss = t.pref_loss == "orpo" ? PrefLoss::ORPO : t.pref_loss == "simpo" ? PrefLoss::SIMPO : PrefLoss::SIGMOID;
  o.beta = t.pref_beta;
  o.ftx = t.pref_ftx;
  o.label_smoothing = t.dpo_label_smoothing;
  o.simpo_gamma = t.simpo_gamma;
  if (o.loss != PrefLoss::SIGMOID) return o;  // reference-free
  if (t.pref_reference == "adapters_off") {
    DT_ENFORCE(lora, ConfigError,
               "{}: training.pref_reference: adapters_off needs LoRA (lora.r > 0): without adapters there is no base "
               "model to switch back to; use precomputed (or auto)",
               cfg.source);
    o.reference = PrefReference::ADAPTERS_OFF;
  } else if (t.pref_reference == "precomputed") {
    o.reference = PrefReference::PRECOMPUTED;
  } else {
    o.reference = lora ? PrefReference::ADAPTERS_OFF : PrefReference::PRECOMPUTED;
  }
  return o;
}

std::vector<RowLogp> row_logps(const float* token_losses, const int32_t* targets, int B, int T) {
  std::vector<RowLogp> rows(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b) * static_cast<size_t>(T) + static_cast<size_t>(t);
      if (targets[i] < 0) continue;
      rows[static_cast<size_t>(b)].sum -= static_cast<double>(token_losses[i]);
      ++rows[static_cast<size_t>(b)].count;
    }
  return rows;
}

std::vector<std::pair<std::string, double>> PrefStats::means() const {
  const double n = pairs > 0 ? pairs : 1.0;
  return {{"rewards/chosen", chosen_reward / n}, {"rewards/rejected", rejected_reward / n},
          {"rewards/accuracies", accuracy / n},  {"rewards/margins", margin / n},
          {"logps/chosen", chosen_logp / n},     {"logps/rejected", rejected_logp / n}};
}

void PrefStats::add(const PrefStats& o) {
  chosen_reward += o.chosen_reward;
  rejected_reward += o.rejected_reward;
  accuracy += o.accuracy;
  margin += o.margin;
  chosen_logp += o.chosen_logp;
  rejected_logp += o.rejected_logp;
  pairs += o.pairs;
}

PrefResult pref_evaluate(const PrefOptions& o, const std::vector<RowLogp>& policy, const std::vector<double>& ref) {
  DT_ENFORCE(policy.size() % 2 == 0 && !policy.empty(), InternalError,
             "a pairwise batch has an even number of rows, not {}", policy.size());
  const size_t P = policy.size() / 2;
  const bool dpo = o.loss == PrefLoss::SIGMOID;
  DT_ENFORCE(!dpo || ref.size() == policy.size(), InternalError, "DPO needs {} reference sums, got {}", policy.size(),
             ref.size());
  PrefResult r;
  r.dsum.assign(policy.size(), 0.0);
  for (size_t p = 0; p < P; ++p) {
    const RowLogp& c = policy[p];
    const RowLogp& j = policy[P + p];
    DT_ENFORCE(c.count > 0 && j.count > 0, InternalError, "pair {} has a side without a trained target", p);
    const double nc = static_cast<double>(c.count), nj = static_cast<double>(j.count);
    double loss = 0.0, dc = 0.0, dj = 0.0;  // the pair's loss and its derivatives by the two sums
    double rc = 0.0, rj = 0.0;              // the rewards TRL logs
    double lc = c.sum, lj = j.sum;          // the log-probabilities TRL logs
    if (dpo) {
      // DPO (Rafailov et al. eq. 7) with conservative label smoothing:
      // h = (pi_c - ref_c) - (pi_r - ref_r); loss = -(1-e) log s(b h) - e log s(-b h).
      const double b = o.beta, e = o.label_smoothing;
      const double h = (c.sum - ref[p]) - (j.sum - ref[P + p]);
      loss = -(1.0 - e) * log_sigmoid(b * h) - e * log_sigmoid(-b * h);
      const double dh = -(1.0 - e) * b * sigmoid(-b * h) + e * b * sigmoid(b * h);
      dc = dh;
      dj = -dh;
      rc = b * (c.sum - ref[p]);
      rj = b * (j.sum - ref[P + p]);
    } else {
      const double ac = c.sum / nc, aj = j.sum / nj;  // mean log-probability per target
      double dac = 0.0, daj = 0.0;
      if (o.loss == PrefLoss::ORPO) {
        // ORPO (Hong et al.): -ac + beta * -log s(log odds(c) - log odds(r)), with
        // log odds(a) = a - log(1 - e^a).
        const double lo = (ac - std::log(-std::expm1(ac))) - (aj - std::log(-std::expm1(aj)));
        loss = -ac - o.beta * log_sigmoid(lo);
        const double dlo = -o.beta * sigmoid(-lo);
        dac = -1.0 + dlo / (-std::expm1(ac));
        daj = -dlo / (-std::expm1(aj));
      } else {
        // SimPO (Meng et al.): -log s(beta (ac - aj) - gamma).
        const double z = o.beta * (ac - aj) - o.simpo_gamma;
        loss = -log_sigmoid(z);
        const double dz = -sigmoid(-z);
        dac = dz * o.beta;
        daj = -dz * o.beta;
      }
      dc = dac / nc;
      dj = daj / nj;
      rc = o.beta * ac;
      rj = o.beta * aj;
      lc = ac;
      lj = aj;
    }
    if (o.ftx > 0.0) {  // an SFT term on the chosen answer: -ftx * its mean log-probability
      loss += -o.ftx * c.sum / nc;
      dc += -o.ftx / nc;
    }
    r.loss_sum += loss;
    r.dsum[p] = dc;
    r.dsum[P + p] = dj;
    r.stats.chosen_reward += rc;
    r.stats.rejected_reward += rj;
    r.stats.accuracy += rc > rj ? 1.0 : 0.0;
    r.stats.margin += rc - rj;
    r.stats.chosen_logp += lc;
    r.stats.rejected_logp += lj;
    r.stats.pairs += 1.0;
  }
  return r;
}

PrefResult pref_micro_batch(model::Model& m, const int32_t* inputs, const int32_t* targets, int rows, int T,
                            const PrefOptions& o, const std::vector<double>& ref, double grad_scale, StepTimer* timer) {
  DT_ENFORCE(o.reference != PrefReference::PRECOMPUTED || ref.size() == static_cast<size_t>(rows), UsageError,
             "a precomputed reference needs {} sums, got {}", rows, ref.size());
  std::optional<StepTimer::Scope> fwd;
  if (timer) fwd.emplace(*timer, Section::FORWARD);
  std::vector<double> ref_sums;
  if (o.reference == PrefReference::ADAPTERS_OFF) {
    model::AdaptersOffScope off(m);
    m.forward(inputs, targets, rows, T);
    for (const RowLogp& x : row_logps(m.token_losses_to_host().data(), targets, rows, T)) ref_sums.push_back(x.sum);
  }
  m.forward(inputs, targets, rows, T);
  PrefResult r = pref_evaluate(o, row_logps(m.token_losses_to_host().data(), targets, rows, T),
                               o.reference == PrefReference::PRECOMPUTED ? ref : ref_sums);
  fwd.reset();
  std::vector<float> scales(r.dsum.size());
  for (size_t k = 0; k < scales.size(); ++k) scales[k] = static_cast<float>(grad_scale * -r.dsum[k]);
  std::optional<StepTimer::Scope> bwd;
  if (timer) bwd.emplace(*timer, Section::BACKWARD);
  m.backward_rows(scales.data());
  return r;
}

}  // namespace dtrain::train
