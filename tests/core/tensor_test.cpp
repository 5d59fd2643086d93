// Buffer alignment, zeroing and move semantics; TensorView typed access and numel;
// Tensor allocation and dtype-converting tensor_copy.
#include "core/tensor.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <utility>

using namespace dtrain;

TEST_CASE("Buffer is 64-byte aligned, zeroed and movable") {
  Buffer<float> b(37);
  CHECK(b.size() == 37);
  CHECK(reinterpret_cast<uintptr_t>(b.data()) % 64 == 0);
  for (float v : b) CHECK(v == 0.0f);
  b[3] = 2.5f;
  Buffer<float> c = std::move(b);
  CHECK(b.empty());
  CHECK(b.data() == nullptr);
  CHECK(c[3] == 2.5f);
  c.zero();
  CHECK(c[3] == 0.0f);
  c.resize(5);
  CHECK(c.size() == 5);
  CHECK(c.span().size() == 5);
  Buffer<float> d;
  d = std::move(c);
  CHECK(d.size() == 5);
  Buffer<int32_t> e(0);
  CHECK(e.empty());
}

TEST_CASE("shape helpers") {
  CHECK(shape_numel({}) == 1);
  CHECK(shape_numel({2, 3, 4}) == 24);
  CHECK(shape_numel({2, 0}) == 0);
  CHECK(shape_str({2, 3}) == "[2, 3]");
  CHECK_THROWS_AS(shape_numel({2, -1}), UsageError);
  CHECK_THROWS_AS(shape_numel({int64_t(1) << 40, int64_t(1) << 40}), UsageError);
}

TEST_CASE("Tensor and TensorView typed access") {
  Tensor t(DType::F32, {3, 4});
  CHECK(t.numel() == 12);
  CHECK(t.nbytes() == 48);
  CHECK(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  t.f32()[11] = 1.0f;
  TensorView v = t.view();
  CHECK(v.f32()[11] == 1.0f);
  CHECK(v.nbytes() == 48);
  CHECK_THROWS_AS(v.u16(), UsageError);
  Tensor h(DType::BF16, {5});
  CHECK(h.nbytes() == 10);
  CHECK_THROWS_AS(h.view().f32(), UsageError);
}

TEST_CASE("tensor_copy converts dtypes with round-to-nearest-even") {
  Tensor a(DType::F32, {2, 2});
  float vals[4] = {1.0f, -2.5f, 3.0f + 1.0f / 256, 65504.0f};
  for (int i = 0; i < 4; ++i) a.f32()[i] = vals[i];
  Tensor b(DType::BF16, {4}), f(DType::F16, {4}), back(DType::F32, {4});
  tensor_copy(b.view(), a.view());
  tensor_copy(f.view(), a.view());
  CHECK(b.view().u16()[0] == f32_to_bf16(1.0f));
  CHECK(f.view().u16()[3] == f32_to_f16(65504.0f));
  tensor_copy(back.view(), f.view());
  CHECK(back.f32()[1] == -2.5f);
  CHECK(back.f32()[3] == 65504.0f);
  tensor_copy(back.view(), b.view());
  CHECK(back.f32()[2] == bf16_to_f32(f32_to_bf16(vals[2])));
  Tensor wrong(DType::F32, {3});
  CHECK_THROWS_AS(tensor_copy(wrong.view(), a.view()), UsageError);
}
