// Loss scaler: scripted overflow sequences with the scale and hysteresis expected
// after each step worked out by hand from DeepSpeed's rules, the min-scale error, the
// static scale, checkpoint state, and the inf/nan scan.
#include "train/loss_scaler.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;

namespace {

struct Expect {
  bool overflow;
  float scale_after;
  int hysteresis_after;
};

void run_script(LossScaler& s, const std::vector<Expect>& script) {
  int i = 0;
  for (const Expect& e : script) {
    CAPTURE(i);
    CHECK(s.update(e.overflow) == !e.overflow);
    CHECK(s.scale() == e.scale_after);
    CHECK(s.state().cur_hysteresis == e.hysteresis_after);
    ++i;
  }
}

LossScalerConfig dyn(int power, int64_t window, int hysteresis, bool consecutive, float min_scale = 1.0f) {
  LossScalerConfig c;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

}  // namespace

TEST_CASE("dynamic scale starts at 2^initial_scale_power") {
  LossScaler s(LossScalerConfig{});
  CHECK(s.dynamic());
  CHECK(s.scale() == 65536.0f);
  CHECK(s.state().cur_hysteresis == 2);
}

TEST_CASE("hysteresis 1: halve on overflow, double after the window") {
  LossScaler s(dyn(4, 3, 1, false));
  run_script(s, {
                    {false, 16, 1},  // iter 0: stable 0
                    {false, 16, 1},  // iter 1: stable 1
                    {false, 16, 1},  // iter 2: stable 2
                    {false, 32, 1},  // iter 3: stable 3 -> double
                    {true, 16, 1},   // iter 4: overflow
                    {false, 16, 1},  // iter 5: stable 0
                    {false, 16, 1},  // iter 6
                    {false, 16, 1},  // iter 7
                    {false, 32, 1},  // iter 8: stable 3
                    {false, 32, 1},  // iter 9
                    {false, 32, 1},  // iter 10
                    {false, 64, 1},  // iter 11: stable 6
                });
  CHECK(s.state().cur_iter == 12);
  CHECK(s.state().last_overflow_iter == 4);
}

TEST_CASE("hysteresis 2 without consecutive_hysteresis") {
  LossScaler s(dyn(4, 3, 2, false));
  run_script(s, {
                    {true, 16, 1},   // iter 0: credit used, scale kept
                    {false, 16, 1},  // iter 1: no refill without consecutive
                    {true, 8, 1},    // iter 2: no credit -> halve
                    {true, 4, 1},    // iter 3
                    {false, 4, 1},   // iter 4: stable 0
                    {false, 4, 1},   // iter 5
                    {false, 4, 1},   // iter 6
                    {false, 8, 2},   // iter 7: stable 3 -> double and refill
                    {true, 8, 1},    // iter 8: credit used again
                });
}

TEST_CASE("hysteresis 2 with consecutive_hysteresis") {
  LossScaler s(dyn(4, 3, 2, true));
  run_script(s, {
                    {true, 16, 1},   // iter 0: credit used
                    {false, 16, 2},  // iter 1: refilled by a clean step
                    {true, 16, 1},   // iter 2: credit used again, scale kept
                    {true, 8, 1},    // iter 3: two in a row -> halve
                    {false, 8, 2},   // iter 4
                });
}

TEST_CASE("hysteresis 3 survives two overflows") {
  LossScaler s(dyn(10, 100, 3, false));
  run_script(s, {{true, 1024, 2}, {true, 1024, 1}, {true, 512, 1}, {true, 256, 1}});
}

TEST_CASE("overflow at min_loss_scale raises TrainError") {
  LossScaler s(dyn(3, 1000, 1, false, 4.0f));
  run_script(s, {{true, 4, 1}, {false, 4, 1}});
  try {
    s.update(true);
    FAIL("expected TrainError");
  } catch (const TrainError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("min_loss_scale=4") != std::string::npos);
    CHECK(msg.find("bf16") != std::string::npos);
  }
}

TEST_CASE("min_loss_scale clamps the halving and then raises") {
  LossScaler s(dyn(3, 1000, 1, false, 5.0f));
  run_script(s, {{true, 5, 1}});
  CHECK_THROWS_AS(s.update(true), TrainError);
}

TEST_CASE("hysteresis credit is spent before the min-scale error") {
  LossScaler s(dyn(0, 1000, 2, false, 1.0f));  // starts at the minimum
  run_script(s, {{true, 1, 1}});
  CHECK_THROWS_AS(s.update(true), TrainError);
}

TEST_CASE("raise_error_at_min_scale off keeps skipping at the minimum") {
  LossScalerConfig c = dyn(1, 1000, 1, false, 1.0f);
  c.raise_error_at_min_scale = false;
  LossScaler s(c);
  run_script(s, {{true, 1, 1}, {true, 1, 1}, {true, 1, 1}, {false, 1, 1}});
}

TEST_CASE("static loss scale never changes") {
  LossScalerConfig c;
  c.loss_scale = 128.0f;
  LossScaler s(c);
  CHECK_FALSE(s.dynamic());
  for (int i = 0; i < 300; ++i) {
    const bool overflow = i % 7 == 0;
    CHECK(s.update(overflow) == !overflow);
    CHECK(s.scale() == 128.0f);
  }
}

TEST_CASE("state round trip resumes identically") {
  LossScaler a(dyn(8, 4, 2, false));
  const std::vector<bool> seq = {false, true,  false, false, true,  true,  false, false, false,
                                 false, false, true,  false, false, false, false, false, false};
  for (size_t i = 0; i < 7; ++i) a.update(seq[i]);
  LossScaler b(dyn(8, 4, 2, false));
  b.set_state(a.state());
  for (size_t i = 7; i < seq.size(); ++i) {
    a.update(seq[i]);
    b.update(seq[i]);
    CHECK(a.scale() == b.scale());
    CHECK(a.state().cur_hysteresis == b.state().cur_hysteresis);
    CHECK(a.state().cur_iter == b.state().cur_iter);
    CHECK(a.state().last_overflow_iter == b.state().last_overflow_iter);
  }
  LossScalerState bad = a.state();
  bad.scale = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(b.set_state(bad), CheckpointError);
  bad = a.state();
  bad.cur_hysteresis = 5;
  CHECK_THROWS_AS(b.set_state(bad), CheckpointError);
}

TEST_CASE("config validation") {
  CHECK_THROWS_AS(LossScaler(dyn(16, 0, 2, false)), ConfigError);
  CHECK_THROWS_AS(LossScaler(dyn(16, 10, 0, false)), ConfigError);
  CHECK_THROWS_AS(LossScaler(dyn(16, 10, 2, false, 0.0f)), ConfigError);
  CHECK_THROWS_AS(LossScaler(dyn(200, 10, 2, false)), ConfigError);
  LossScalerConfig c;
  c.loss_scale = -1.0f;
  CHECK_THROWS_AS(LossScaler{c}, ConfigError);
}

TEST_CASE("has_inf_or_nan") {
  std::vector<float> x(10000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 1e30f * (i % 2 ? -1.0f : 1.0f);
  x[1] = std::numeric_limits<float>::max();
  x[2] = std::numeric_limits<float>::denorm_min();
  CHECK_FALSE(has_inf_or_nan(x.data(), x.size()));
  CHECK_FALSE(has_inf_or_nan(x.data(), 0));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t pos : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9999}}) {
      std::vector<float> y = x;
      y[pos] = bad;
      CHECK(has_inf_or_nan(y.data(), y.size()));
      CHECK_FALSE(has_inf_or_nan(y.data(), pos));
    }
  }
}
