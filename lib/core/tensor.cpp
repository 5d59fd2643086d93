// Aligned allocation, shape helpers and dtype-converting copies for core/tensor.h.
#include "core/tensor.h"

#include "core/check.h"

#include <cstring>
#include <limits>

namespace dtrain {

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DT_ENFORCE_GE(d, 0, UsageError, "tensor shape {} has a negative dimension", shape_str(shape));
    DT_ENFORCE(d == 0 || n <= std::numeric_limits<int64_t>::max() / d, UsageError, "tensor shape {} overflows int64",
               shape_str(shape));
    n *= d;
  }
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------
float* TensorView::f32() const {
  DT_ENFORCE(dtype == DType::F32, UsageError, "tensor of dtype {} accessed as float32", dtype_name(dtype));
  return static_cast<float*>(data);
}

uint16_t* TensorView::u16() const {
  DT_ENFORCE(dtype != DType::F32, UsageError, "float32 tensor accessed as 16-bit");
  return static_cast<uint16_t*>(data);
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  bytes_.resize(static_cast<size_t>(shape_numel(shape_)) * dtype_size(dtype_));
}

void tensor_copy(const TensorView& dst, const TensorView& src) {
  int64_t n = src.numel();
  DT_ENFORCE_EQ(dst.numel(), n, UsageError, "tensor_copy from {} to {}", shape_str(src.shape), shape_str(dst.shape));
  if (dst.dtype == src.dtype) {
    std::memcpy(dst.data, src.data, src.nbytes());
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    dtype_store(dst.data, static_cast<size_t>(i), dst.dtype, dtype_load(src.data, static_cast<size_t>(i), src.dtype));
}

}  // namespace dtrain
