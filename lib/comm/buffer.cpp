// Buffer: host allocations for Gloo, cudaMalloc for NCCL (CUDA builds only; a CPU-only
// build has no device communicators, so a device Buffer is a DeviceError there).
#include "comm/buffer.h"

#include "core/check.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#ifdef DTRAIN_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace dtrain::comm {

Buffer::Buffer(const Communicator& comm, size_t bytes) : bytes_(bytes), on_device_(comm.on_device()) {
  // Zero-byte buffers still get a distinct, valid pointer so callers need no special case.
  const size_t alloc = bytes == 0 ? 64 : bytes;
  if (!on_device_) {
    data_ = std::aligned_alloc(64, (alloc + 63) / 64 * 64);
    if (data_ == nullptr) throw std::bad_alloc();
    return;
  }
#ifdef DTRAIN_HAVE_CUDA
  DT_CUDA_CHECK(cudaMalloc(&data_, alloc));
#else
  DT_THROW(DeviceError, "device buffer of {} bytes requested but dtrain was built without CUDA", bytes);
#endif
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), on_device_(other.on_device_) {
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    on_device_ = other.on_device_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  if (!on_device_) {
    std::free(data_);
  } else {
#ifdef DTRAIN_HAVE_CUDA
    cudaFree(data_);  // a failure here (e.g. after a device error) cannot be reported
#endif
  }
  data_ = nullptr;
}

void* Buffer::at(size_t offset) {
  DT_ENFORCE_LE(offset, bytes_, InternalError, "buffer offset out of range");
  return static_cast<char*>(data_) + offset;
}

void Buffer::copy_from_host(const void* src, size_t bytes, size_t offset) {
  DT_ENFORCE(offset <= bytes_ && bytes <= bytes_ - offset, InternalError,
             "copy of {} bytes at offset {} overruns a {}-byte buffer", bytes, offset, bytes_);
  if (bytes == 0) return;
  if (!on_device_) {
    std::memcpy(static_cast<char*>(data_) + offset, src, bytes);
    return;
  }
#ifdef DTRAIN_HAVE_CUDA
  DT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice));
  // A pageable H2D copy may return before the DMA lands, and the communicator's stream
  // does not order after the legacy stream: wait so the next collective sees the data.
  DT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
#endif
}

void Buffer::copy_to_host(void* dst, size_t bytes, size_t offset) const {
  DT_ENFORCE(offset <= bytes_ && bytes <= bytes_ - offset, InternalError,
             "copy of {} bytes at offset {} overruns a {}-byte buffer", bytes, offset, bytes_);
  if (bytes == 0) return;
  if (!on_device_) {
    std::memcpy(dst, static_cast<const char*>(data_) + offset, bytes);
    return;
  }
#ifdef DTRAIN_HAVE_CUDA
  DT_CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
#endif
}

void Buffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  if (!on_device_) {
    std::memset(data_, value, bytes_);
    return;
  }
#ifdef DTRAIN_HAVE_CUDA
  DT_CUDA_CHECK(cudaMemset(data_, value, bytes_));
  DT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // see copy_from_host
#endif
}

}  // namespace dtrain::comm
