// Owned, 64-byte aligned storage (Buffer<T>, Tensor with shape and dtype) and the
// non-owning TensorView used to pass typed, shaped memory between modules (the model's
// flat parameter buffers, safetensors import/export, collectives).
#pragma once

#include "core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace dtrain {

inline constexpr size_t TENSOR_ALIGN = 64;

/// Number of elements of a shape (1 for a scalar shape {}); throws UsageError on a
/// negative dimension or overflow.
int64_t shape_numel(const std::vector<int64_t>& shape);
/// "[2, 3, 4]"
std::string shape_str(const std::vector<int64_t>& shape);

/// A zero-initialised, 64-byte aligned array of trivially copyable T. Move-only.
template <typename T>
requires std::is_trivially_copyable_v<T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) { resize(n); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = o.data_;
      size_ = o.size_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  ~Buffer() { release(); }

  /// Reallocates to n elements, all zero (old contents are discarded).
  void resize(size_t n) {
    release();
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
    data_ = static_cast<T*>(aligned_zalloc(bytes));
    size_ = n;
  }
  void zero() {
    if (size_) zero_bytes(data_, size_ * sizeof(T));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }

 private:
  static void* aligned_zalloc(size_t bytes) {
    void* p = std::aligned_alloc(TENSOR_ALIGN, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }
  static void zero_bytes(void* p, size_t bytes) { std::memset(p, 0, bytes); }
  void release() {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

/// Non-owning view: pointer, dtype and shape (row-major, contiguous).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  /// Typed access; throws UsageError unless dtype is F32.
  float* f32() const;
  /// Typed access to the raw 16-bit patterns; throws UsageError unless dtype is BF16/F16.
  uint16_t* u16() const;
};

/// An owned tensor: shape, dtype and aligned, zeroed storage.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  TensorView view() { return TensorView{bytes_.data(), dtype_, shape_}; }
  float* f32() { return view().f32(); }

 private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  Buffer<std::byte> bytes_;
};

/// Copies src into dst converting dtypes element by element (RNE); shapes must have
/// the same number of elements.
void tensor_copy(const TensorView& dst, const TensorView& src);

}  // namespace dtrain
