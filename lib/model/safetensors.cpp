// safetensors writer (header built by hand to match serde_json's compact output) and
// reader (mmap, then every huggingface/safetensors validation, reported as IoError).
#include "model/safetensors.h"

#include "core/check.h"
#include "core/input_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <limits>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dtrain::model {

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // huggingface/safetensors' limit

// ----------------------------------------------------------------------------
// The safetensors dtype table: name, size, and the order HF sorts by (its enum order).
struct StDtype {
  const char* name;
  size_t size;
};
constexpr StDtype kDtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
                               {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
                               {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8}};

const StDtype* st_dtype_find(const std::string& name) {
  for (const StDtype& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* st_dtype_name(DType t) { return t == DType::F32 ? "F32" : t == DType::BF16 ? "BF16" : "F16"; }
int st_dtype_rank(DType t) { return t == DType::F32 ? 2 : t == DType::BF16 ? 1 : 0; }

uint64_t ref_bytes(const StTensorRef& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) {
    DT_ENFORCE_GE(d, int64_t{0}, InternalError, "safetensors: tensor '{}' has a negative dimension", t.name);
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string json_string(const std::string& s) {
  // serde_json and nlohmann escape identically: \" \\ \b \f \n \r \t, other controls as
  // lowercase \u00xx, UTF-8 passed through.
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
}

std::vector<const StTensorRef*> write_order(const std::vector<StTensorRef>& tensors) {
  std::vector<const StTensorRef*> order;
  order.reserve(tensors.size());
  for (const StTensorRef& t : tensors) {
    DT_ENFORCE(!t.name.empty(), InternalError, "safetensors: tensor with an empty name");
    DT_ENFORCE(t.name != "__metadata__", InternalError, "safetensors: '__metadata__' is not a tensor name");
    order.push_back(&t);
  }
  std::stable_sort(order.begin(), order.end(), [](const StTensorRef* a, const StTensorRef* b) {
    if (st_dtype_rank(a->dtype) != st_dtype_rank(b->dtype)) return st_dtype_rank(a->dtype) > st_dtype_rank(b->dtype);
    return a->name < b->name;
  });
  for (size_t i = 1; i < order.size(); ++i)
    DT_ENFORCE(order[i - 1]->name != order[i]->name, InternalError, "safetensors: duplicate tensor name '{}'",
               order[i]->name);
  return order;
}

// ----------------------------------------------------------------------------
// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      DT_THROW(IoError, "cannot write {}: {}", path, std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  DT_THROW(IoError, "{}: not a valid safetensors file: {}", path, why);
}

}  // namespace

// ----------------------------------------------------------------------------
std::string safetensors_header(const std::vector<StTensorRef>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  const std::vector<const StTensorRef*> order = write_order(tensors);
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first_kv = true;
    for (const auto& [k, v] : metadata) {
      if (!first_kv) h += ',';
      first_kv = false;
      h += json_string(k) + ':' + json_string(v);
    }
    h += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const StTensorRef* t : order) {
    if (!first) h += ',';
    first = false;
    h += json_string(t->name) + ":{\"dtype\":\"" + st_dtype_name(t->dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < t->shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(t->shape[i]);
    }
    const uint64_t end = offset + ref_bytes(*t);
    h += "],\"data_offsets\":[" + std::to_string(offset) + ',' + std::to_string(end) + "]}";
    offset = end;
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

namespace {

// Writes the 8-byte length and header, then `body` (the tensor bytes), to
// "<path>.tmp.<pid>", fsyncs it and renames it over path: a reader never sees a partial file.
void atomic_file_write(const std::string& path, const std::string& header,
                       const std::function<void(int fd, const std::string& tmp)>& body) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) DT_THROW(IoError, "cannot create {}: {}", tmp, std::strerror(errno));
    uint8_t len[8];
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    write_all(f.fd, len, 8, tmp);
    write_all(f.fd, header.data(), header.size(), tmp);
    body(f.fd, tmp);
    if (::fsync(f.fd) != 0) DT_THROW(IoError, "cannot fsync {}: {}", tmp, std::strerror(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DT_THROW(IoError, "cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd >= 0) ::fsync(d.fd);
}

}  // namespace

void safetensors_write(const std::string& path, const std::vector<StTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  const std::vector<const StTensorRef*> order = write_order(tensors);
  atomic_file_write(path, header, [&](int fd, const std::string& tmp) {
    for (const StTensorRef* t : order) {
      const uint64_t bytes = ref_bytes(*t);
      DT_ENFORCE(bytes == 0 || t->data != nullptr, InternalError, "safetensors: tensor '{}' has no data", t->name);
      write_all(fd, t->data, bytes, tmp);
    }
  });
}

void safetensors_write_stream(const std::string& path, const std::vector<StTensorSource>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // The header and order from data-less refs; each ref's index is its source's.
  std::vector<StTensorRef> refs;
  refs.reserve(tensors.size());
  for (const StTensorSource& t : tensors) refs.push_back({t.name, t.dtype, t.shape, nullptr});
  const std::string header = safetensors_header(refs, metadata);
  const std::vector<const StTensorRef*> order = write_order(refs);
  atomic_file_write(path, header, [&](int fd, const std::string& tmp) {
    std::vector<uint8_t> buf;
    for (const StTensorRef* r : order) {
      const StTensorSource& t = tensors[static_cast<size_t>(r - refs.data())];
      const uint64_t bytes = ref_bytes(*r);
      if (bytes == 0) continue;
      DT_ENFORCE(static_cast<bool>(t.fill), InternalError, "safetensors: tensor '{}' has no data", t.name);
      buf.resize(bytes);
      t.fill(buf.data());
      write_all(fd, buf.data(), bytes, tmp);
    }
  });
}

// ----------------------------------------------------------------------------
int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool StTensorInfo::dtype(DType* out) const { return dtype_parse(dtype_name, out); }

// ----------------------------------------------------------------------------
// Reading: the header's parts

namespace {

// The header JSON of file `path` (hb[0 .. n)), refusing a key given twice in one object.
nlohmann::json header_parse(const std::string& path, const char* hb, uint64_t n) {
  // A JSON parser keeps the last of two equal keys; the file would then hold a tensor (or a
  // dtype, a shape) that no reader agrees on. Keys are recorded per open object as the
  // parser meets them, and the first repeat is named.
  struct Open {
    std::set<std::string> keys;
    std::string last;
  };
  std::vector<Open> open;
  std::string duplicate;
  const auto track = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      open.emplace_back();
    } else if (ev == E::object_end && !open.empty()) {
      open.pop_back();
    } else if (ev == E::key && !open.empty()) {
      std::string k = parsed.get<std::string>();
      if (duplicate.empty() && !open.back().keys.insert(k).second)
        duplicate = open.size() == 1 ? fmt::format("'{}'", k)
                                     : fmt::format("'{}' (in the entry of '{}')", k, open[open.size() - 2].last);
      open.back().last = std::move(k);
    }
    return true;
  };
  nlohmann::json h = nlohmann::json::parse(hb, hb + n, track, false);
  if (h.is_discarded() || !h.is_object()) bad_file(path, "the header is not a valid UTF-8 JSON object");
  if (!duplicate.empty())
    bad_file(path, fmt::format("the header has the key {} twice (a damaged or forged file)", duplicate));
  return h;
}

// One tensor's header entry, checked: a known dtype, a shape whose bytes do not overflow,
// data_offsets that hold exactly those bytes.
StTensorInfo tensor_entry_parse(const std::string& path, const std::string& key, const nlohmann::json& val) {
  const auto bad_tensor = [&](const std::string& why) { bad_file(path, fmt::format("tensor '{}': {}", key, why)); };
  if (!val.is_object()) bad_tensor("header entry is not an object");
  StTensorInfo t;
  t.name = key;
  const auto dt = val.find("dtype");
  if (dt == val.end() || !dt->is_string()) bad_tensor("missing string 'dtype'");
  t.dtype_name = dt->get<std::string>();
  const StDtype* d = st_dtype_find(t.dtype_name);
  if (!d) bad_tensor(fmt::format("unknown dtype '{}'", t.dtype_name));
  t.elem_size = d->size;
  const auto sh = val.find("shape");
  if (sh == val.end() || !sh->is_array()) bad_tensor("missing array 'shape'");
  uint64_t bytes = t.elem_size;
  for (const auto& dim : *sh) {
    if (!dim.is_number_unsigned()) bad_tensor("shape entries must be non-negative integers");
    const uint64_t v = dim.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (v != 0 && bytes > std::numeric_limits<uint64_t>::max() / v))
      bad_tensor("shape overflows");
    bytes *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  const auto off = val.find("data_offsets");
  if (off == val.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    bad_tensor("data_offsets must be [begin, end] non-negative integers");
  t.begin = (*off)[0].get<uint64_t>();
  t.end = (*off)[1].get<uint64_t>();
  if (t.end < t.begin) bad_tensor(fmt::format("data_offsets [{}, {}] end before begin", t.begin, t.end));
  if (t.end - t.begin != bytes)
    bad_tensor(fmt::format("data_offsets [{}, {}] hold {} bytes but shape x {} needs {}", t.begin, t.end,
                           t.end - t.begin, t.dtype_name, bytes));
  return t;
}

// Sorts the tensors into offset order and checks they tile the data exactly.
void tensors_check_cover(const std::string& path, std::vector<StTensorInfo>& tensors, uint64_t data_size) {
  std::sort(tensors.begin(), tensors.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (const StTensorInfo& t : tensors) {
    if (t.begin != expect)
      bad_file(path, fmt::format("tensor '{}': data_offsets [{}, {}] {} (expected begin {})", t.name, t.begin, t.end,
                                 t.begin < expect ? "overlap the previous tensor" : "leave a gap", expect));
    expect = t.end;
  }
  if (expect != data_size)
    bad_file(path, fmt::format("tensors cover {} data bytes but the file holds {} after the header{}", expect,
                               data_size, expect > data_size ? " (truncated file)" : ""));
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // The input rule: a FIFO (which would block the open), a device or a link loop is a
  // ConfigError naming the file before anything is mapped.
  const InputFile f = input_file_open(path, "safetensors file");
  const uint64_t size = f.size();
  if (size < 8) bad_file(path, fmt::format("{} bytes is shorter than the 8-byte header length", size));
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd(), 0);
  if (m == MAP_FAILED) DT_THROW(IoError, "cannot mmap {}: {}", path, std::strerror(errno));
  map_ = static_cast<const uint8_t*>(m);
  map_size_ = size;
  try {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(map_[i]) << (8 * i);
    if (n > kMaxHeaderSize) bad_file(path, fmt::format("header length {} exceeds the 100 MB limit", n));
    if (8 + n > size)
      bad_file(path, fmt::format("header length {} runs past the end of the file ({} bytes); the file is truncated", n,
                                 size));
    data_start_ = 8 + n;
    const char* hb = reinterpret_cast<const char*>(map_ + 8);
    if (n == 0 || hb[0] != '{') bad_file(path, "the header does not start with '{'");
    const nlohmann::json h = header_parse(path, hb, n);
    for (const auto& [key, val] : h.items()) {
      if (key == "__metadata__") {
        if (!val.is_object()) bad_file(path, "__metadata__ is not an object");
        for (const auto& [mk, mv] : val.items()) {
          if (!mv.is_string()) bad_file(path, fmt::format("__metadata__ value of '{}' is not a string", mk));
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      tensors_.push_back(tensor_entry_parse(path, key, val));
    }
    tensors_check_cover(path, tensors_, size - data_start_);
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    close();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { close(); }

void SafetensorsFile::close() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const StTensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    DT_THROW(IoError, "{}: no tensor named '{}' ({} tensors in the file)", path_, name, tensors_.size());
  return tensors_[it->second];
}

const uint8_t* SafetensorsFile::raw(const std::string& name) const { return map_ + data_start_ + info(name).begin; }

void SafetensorsFile::read_f32(const std::string& name, float* out, size_t n) const {
  const StTensorInfo& t = info(name);
  DType dt;
  DT_ENFORCE(t.dtype(&dt), IoError, "{}: tensor '{}' has dtype {}; only F32, BF16 and F16 convert to fp32", path_, name,
             t.dtype_name);
  DT_ENFORCE_EQ(static_cast<int64_t>(n), t.numel(), IoError, "{}: tensor '{}' (shape size) does not match the buffer",
                path_, name);
  const uint8_t* p = map_ + data_start_ + t.begin;
  switch (dt) {
    case DType::F32: std::memcpy(out, p, n * 4); break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
  }
  // The tensor is read once (into the caller's fp32 copy): its file pages leave this
  // process's resident set, so loading a model larger than a rank's share never holds
  // the whole file resident. The pages stay in the page cache; a later read maps them in
  // again. Read-only private pages: dropping them loses nothing.
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (page > 0 && n > 0) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), ps = static_cast<uintptr_t>(page);
    const uintptr_t lo = a / ps * ps, hi = (a + n * dtype_size(dt) + ps - 1) / ps * ps;
    ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  }
}

}  // namespace dtrain::model
