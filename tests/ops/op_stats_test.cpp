// op_stats: a scope counts only while enabled, only its outermost level (a fused op that
// calls another counts once), and reset clears the counters. Asserts no timing values,
// only which class received time.
#include "ops/op_stats.h"

#include <doctest/doctest.h>

#include <string>
#include <thread>

using namespace dtrain::ops;

TEST_CASE("op scopes count the outermost class only while enabled") {
  op_stats_reset();
  op_stats_enable(false);
  { OpScope s(OpClass::NORM); }
  CHECK(op_stats_seconds()[static_cast<size_t>(OpClass::NORM)] == 0.0);
  op_stats_enable(true);
  {
    OpScope outer(OpClass::LINEAR);
    OpScope inner(OpClass::ACTIVATION);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto s = op_stats_seconds();
  CHECK(s[static_cast<size_t>(OpClass::LINEAR)] > 0.0);
  CHECK(s[static_cast<size_t>(OpClass::ACTIVATION)] == 0.0);
  op_stats_add(OpClass::OPTIMIZER, 0.5);
  CHECK(op_stats_seconds()[static_cast<size_t>(OpClass::OPTIMIZER)] == doctest::Approx(0.5));
  op_stats_enable(false);
  op_stats_reset();
  for (double v : op_stats_seconds()) CHECK(v == 0.0);
  CHECK(std::string(op_class_name(OpClass::CROSS_ENTROPY)) == "cross-entropy");
}
