// Hugging Face safetensors files: u64 little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}}, padded with
// spaces to 8 bytes), then the tensor bytes. Atomic writer and validating mmap reader.
#pragma once

#include "core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace dtrain::model {

/// A tensor to write, not owned: `data` holds numel(shape) * dtype_size(dtype) bytes in
/// row-major order (little-endian, as every supported host is).
struct StTensorRef {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  ///< {} is a scalar (1 element)
  const void* data;
};

/// Writes a safetensors file byte-identical to what huggingface/safetensors writes for the
/// same tensors: tensors sorted by dtype (wider first: F32, BF16, F16) then name, compact
/// JSON with "__metadata__" first (omitted when empty), header padded with spaces to a
/// multiple of 8. Written to "<path>.tmp.<pid>", fsynced, then renamed over path.
/// Throws InternalError for duplicate or empty names or negative dims, IoError on I/O errors.
void safetensors_write(const std::string& path, const std::vector<StTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// A tensor whose bytes are produced when the writer reaches it: fill writes
/// numel(shape) * dtype_size(dtype) bytes to dst. Lets a file be written one tensor at a
/// time (the Hugging Face export converts each tensor as it goes, never the whole model).
struct StTensorSource {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::function<void(void* dst)> fill;
};

/// safetensors_write for tensors filled on demand: the same bytes, the same atomic
/// write; one buffer of the largest tensor's bytes is held at a time.
void safetensors_write_stream(const std::string& path, const std::vector<StTensorSource>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

/// The header bytes (JSON plus padding, without the 8-byte length) safetensors_write
/// would produce; exposed for tests and size estimates.
std::string safetensors_header(const std::vector<StTensorRef>& tensors,
                               const std::map<std::string, std::string>& metadata);

/// One tensor's header entry.
struct StTensorInfo {
  std::string name;
  std::string dtype_name;  ///< as in the file: "F32", "BF16", "F16", "I64", ...
  size_t elem_size = 0;    ///< bytes per element of dtype_name
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  ///< data_offsets, relative to the start of the data section
  int64_t numel() const;
  /// True (and *out set) for F32, BF16 and F16: the dtypes read_f32 converts.
  bool dtype(DType* out) const;
};

/// A validated, memory-mapped safetensors file. Every check huggingface/safetensors makes
/// is made here: header length within the file and <= 100 MB, UTF-8 JSON object, known
/// dtype, shape x dtype size == end - begin, offsets sorted contiguous from 0 and ending
/// exactly at the end of the file, metadata values strings. Any violation throws IoError
/// naming the file (and the tensor).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// Tensor names in data (offset) order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// Throws IoError naming the file when the tensor is absent.
  const StTensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The tensor's raw bytes inside the mapping (valid while this object lives; may be
  /// unaligned when the writer did not pad the header).
  const uint8_t* raw(const std::string& name) const;
  /// Converts an F32/BF16/F16 tensor to fp32 into out; n must equal its numel. Throws
  /// IoError for another dtype or a different n.
  void read_f32(const std::string& name, float* out, size_t n) const;

 private:
  void close();
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_start_ = 0;
  std::vector<StTensorInfo> tensors_;  // offset order
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dtrain::model
