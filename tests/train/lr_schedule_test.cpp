// LR schedules at their boundary steps against formulas written out here from
// DeepSpeed's documentation, plus a few hand-computed literal values.
#include "train/lr_schedule.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;

namespace {

constexpr double kPi = 3.14159265358979323846;

double expected_warmup_fraction(int64_t s, int64_t w, bool log_type) {
  if (log_type) return std::log(static_cast<double>(s) + 1.0) / std::log(static_cast<double>(w));
  return static_cast<double>(s) / static_cast<double>(w);
}

double expected_warmup_lr(int64_t s, double lo, double hi, int64_t w, bool log_type) {
  return s < w ? lo + (hi - lo) * expected_warmup_fraction(s, w, log_type) : hi;
}

double expected_decay_lr(int64_t s, double lo, double hi, int64_t w, int64_t t, bool log_type) {
  if (s < w) return lo + (hi - lo) * expected_warmup_fraction(s, w, log_type);
  double gamma = static_cast<double>(t - s) / static_cast<double>(t - w);
  if (gamma < 0) gamma = 0;
  return lo + (hi - lo) * gamma;
}

double expected_cosine_lr(int64_t s, double base, double wmin, double cmin, int64_t w, int64_t t, bool log_type) {
  if (s < w) return base * (wmin + (1.0 - wmin) * expected_warmup_fraction(s, w, log_type));
  double progress = static_cast<double>(s - w + 1) / static_cast<double>(t - w);
  if (progress > 1) progress = 1;
  return base * (cmin + (1.0 - cmin) * 0.5 * (1.0 + std::cos(kPi * progress)));
}

std::vector<int64_t> boundary_steps(int64_t w, int64_t t) { return {0, 1, w - 1, w, w + 1, t - 1, t, t + 1, t + 1000}; }

}  // namespace

TEST_CASE("constant schedule") {
  LrScheduleConfig cfg;
  auto s = lr_schedule_create(cfg, 3e-4f);
  for (int64_t step : {0, 1, 1000000}) CHECK(s->lr(step) == 3e-4f);
  cfg.type = "";
  CHECK(lr_schedule_create(cfg, 0.5f)->lr(7) == 0.5f);
}

TEST_CASE("WarmupLR literal values") {
  LrScheduleConfig cfg;
  cfg.type = "WarmupLR";
  cfg.warmup_min_lr = 0.0f;
  cfg.warmup_max_lr = 1.0f;
  cfg.warmup_num_steps = 10;
  cfg.warmup_type = "log";
  auto s = lr_schedule_create(cfg, 123.0f);  // base lr unused: max given
  CHECK(s->lr(0) == 0.0f);
  CHECK(s->lr(1) == doctest::Approx(0.30102999566));  // log 2 / log 10
  CHECK(s->lr(9) == doctest::Approx(1.0));
  CHECK(s->lr(10) == 1.0f);
  CHECK(s->lr(5000) == 1.0f);
  cfg.warmup_type = "linear";
  s = lr_schedule_create(cfg, 123.0f);
  CHECK(s->lr(0) == 0.0f);
  CHECK(s->lr(1) == doctest::Approx(0.1));
  CHECK(s->lr(9) == doctest::Approx(0.9));
  CHECK(s->lr(10) == 1.0f);
  // warmup_max_lr unset: the optimizer's base lr.
  cfg.warmup_max_lr.reset();
  CHECK(lr_schedule_create(cfg, 0.25f)->lr(100) == 0.25f);
  // warmup_num_steps 1 acts as 2 (DeepSpeed's max(2, n)).
  cfg.warmup_num_steps = 1;
  cfg.warmup_max_lr = 1.0f;
  s = lr_schedule_create(cfg, 1.0f);
  CHECK(s->lr(1) == doctest::Approx(0.5));
  CHECK(s->lr(2) == 1.0f);
}

TEST_CASE("WarmupLR boundaries") {
  for (const char* type : {"log", "linear"}) {
    LrScheduleConfig cfg;
    cfg.type = "WarmupLR";
    cfg.warmup_min_lr = 1e-5f;
    cfg.warmup_max_lr = 2e-4f;
    cfg.warmup_num_steps = 50;
    cfg.warmup_type = type;
    auto s = lr_schedule_create(cfg, 1.0f);
    for (int64_t step : boundary_steps(50, 200)) {
      CAPTURE(type);
      CAPTURE(step);
      CHECK(s->lr(step) == doctest::Approx(expected_warmup_lr(step, 1e-5f, 2e-4f, 50, cfg.warmup_type == "log")));
    }
  }
}

TEST_CASE("WarmupDecayLR boundaries and literals") {
  for (const char* type : {"log", "linear"}) {
    LrScheduleConfig cfg;
    cfg.type = "WarmupDecayLR";
    cfg.warmup_min_lr = 0.0f;
    cfg.warmup_max_lr = 1e-3f;
    cfg.warmup_num_steps = 10;
    cfg.total_num_steps = 110;
    cfg.warmup_type = type;
    auto s = lr_schedule_create(cfg, 1.0f);
    for (int64_t step : boundary_steps(10, 110)) {
      CAPTURE(type);
      CAPTURE(step);
      CHECK(s->lr(step) ==
            doctest::Approx(expected_decay_lr(step, 0.0, 1e-3f, 10, 110, cfg.warmup_type == "log")).epsilon(1e-6));
    }
    CHECK(s->lr(10) == doctest::Approx(1e-3));
    CHECK(s->lr(11) == doctest::Approx(0.99e-3));
    CHECK(s->lr(109) == doctest::Approx(1e-5));
    CHECK(s->lr(110) == 0.0f);
    CHECK(s->lr(500) == 0.0f);
  }
}

TEST_CASE("WarmupCosineLR boundaries and literals") {
  for (const char* type : {"log", "linear"}) {
    LrScheduleConfig cfg;
    cfg.type = "WarmupCosineLR";
    cfg.warmup_min_ratio = 0.1f;
    cfg.cos_min_ratio = 0.01f;
    cfg.warmup_num_steps = 20;
    cfg.total_num_steps = 120;
    cfg.warmup_type = type;
    const float base = 6e-4f;
    auto s = lr_schedule_create(cfg, base);
    for (int64_t step : boundary_steps(20, 120)) {
      CAPTURE(type);
      CAPTURE(step);
      CHECK(s->lr(step) ==
            doctest::Approx(expected_cosine_lr(step, base, 0.1f, 0.01f, 20, 120, cfg.warmup_type == "log"))
                .epsilon(1e-6));
    }
    CHECK(s->lr(0) == doctest::Approx(base * 0.1));
    // Half way through the cosine (real step 50 of 100): ratio = cmin + (1-cmin)/2.
    CHECK(s->lr(69) == doctest::Approx(base * (0.01f + 0.99f * 0.5)).epsilon(1e-6));
    CHECK(s->lr(119) == doctest::Approx(base * 0.01f));
    CHECK(s->lr(10000) == doctest::Approx(base * 0.01f));
  }
}

TEST_CASE("schedule config errors") {
  LrScheduleConfig cfg;
  cfg.type = "OneCycle";
  CHECK_THROWS_AS(lr_schedule_create(cfg, 1.0f), ConfigError);
  cfg.type = "WarmupLR";
  cfg.warmup_type = "cubic";
  CHECK_THROWS_AS(lr_schedule_create(cfg, 1.0f), ConfigError);
  cfg.warmup_type = "linear";
  cfg.warmup_num_steps = 0;
  CHECK_THROWS_AS(lr_schedule_create(cfg, 1.0f), ConfigError);
  cfg.warmup_num_steps = 10;
  cfg.type = "WarmupDecayLR";
  cfg.total_num_steps = 0;
  CHECK_THROWS_AS(lr_schedule_create(cfg, 1.0f), ConfigError);
  cfg.type = "WarmupCosineLR";
  CHECK_THROWS_AS(lr_schedule_create(cfg, 1.0f), ConfigError);
  try {
    cfg.type = "Bogus";
    lr_schedule_create(cfg, 1.0f);
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("Bogus") != std::string::npos);
  }
}
