// Buffer casts, rounding and adds against the scalar conversions of core/dtype.h, element
// by element, at sizes that run threaded (and bit-identical between 1 and 3 threads).
#include "ops/cast.h"

#include "core/error.h"
#include "ops/parallel.h"
#include "reference.h"

#include <doctest/doctest.h>

#include <cstring>

using namespace dtrain;
using namespace dtrain::ops;

TEST_CASE("cast, round_to and add_inplace equal the scalar conversions at threaded sizes") {
  const size_t n = 3 * PARALLEL_MIN_WORK + 5;
  Rng r(5);
  auto x = ref::rand_floats(r, n, 100.0f), y = ref::rand_floats(r, n);
  x[0] = 1e30f;   // overflows fp16
  x[1] = 1e-30f;  // underflows
  x[2] = -0.0f;
  for (int th : {1, 3}) {
    set_num_threads(th);
    std::vector<uint16_t> b(n), h(n);
    std::vector<float> back(n), rb = x, rh = x, sum = x;
    cast(b.data(), DType::BF16, x.data(), DType::F32, n);
    cast(h.data(), DType::F16, x.data(), DType::F32, n);
    cast(back.data(), DType::F32, b.data(), DType::BF16, n);
    round_to(rb.data(), n, DType::BF16);
    round_to(rh.data(), n, DType::F16);
    add_inplace(sum.data(), y.data(), n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      bad += b[i] != f32_to_bf16(x[i]);
      bad += h[i] != f32_to_f16(x[i]);
      bad += std::memcmp(&back[i], &rb[i], 4) != 0;
      const float rh_ref = f16_to_f32(f32_to_f16(x[i]));
      bad += std::memcmp(&rh[i], &rh_ref, 4) != 0;
      const float s = x[i] + y[i];
      bad += std::memcmp(&sum[i], &s, 4) != 0;
    }
    CHECK(bad == 0);
  }
  std::vector<float> same(n);
  cast(same.data(), DType::F32, x.data(), DType::F32, n);
  CHECK(same == x);
  set_num_threads(2);
}
