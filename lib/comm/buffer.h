// Buffer: an RAII allocation in the memory a Communicator works on (host memory for
// Gloo, cudaMalloc'd device memory for NCCL), so tests and the bench are written once
// for every backend.
#pragma once

#include "comm/communicator.h"

#include <cstddef>

namespace dtrain::comm {

/// Owns `bytes` bytes of host memory (64-byte aligned) or, when comm.on_device(),
/// device memory on the calling thread's current CUDA device. Copies are synchronous
/// and not ordered after asynchronous collectives: call comm.synchronize() before
/// copy_to_host() reads a collective's result.
class Buffer {
 public:
  Buffer(const Communicator& comm, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool on_device() const { return on_device_; }
  /// data() advanced by `offset` bytes (device pointers cannot be indexed on the host).
  void* at(size_t offset);

  /// Copy `bytes` bytes from host memory `src` to data()+offset.
  void copy_from_host(const void* src, size_t bytes, size_t offset = 0);
  /// Copy `bytes` bytes from data()+offset to host memory `dst`.
  void copy_to_host(void* dst, size_t bytes, size_t offset = 0) const;
  /// Set every byte to `value`.
  void fill_bytes(unsigned char value);

 private:
  void release() noexcept;

  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool on_device_ = false;
};

}  // namespace dtrain::comm
