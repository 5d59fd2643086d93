// Sharded checkpoint save (shards, CRC exchange, manifest, renames, pruning) and load
// (candidate order, verification, resharding reads from the saved partition). A
// checkpoint that fails verification is set aside (renamed stepK.corrupt-<time>), never
// deleted and never counted by keep_last.
#include "train/checkpoint.h"

#include "core/check.h"
#include "core/input_file.h"
#include "core/crc32c.h"
#include "core/log.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

namespace dtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char SHARD_MAGIC[8] = {'D', 'T', 'R', 'N', 'C', 'K', 'P', '1'};
constexpr int FORMAT_VERSION = 1;

// ----------------------------------------------------------------------------
// Files
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) ::close(fd);
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err = errno) {
  DT_THROW(IoError, "{} {}: {}", what, path, std::strerror(err));
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    // write() of a regular file returns 0 only when nothing more fits (errno is not set).
    if (w <= 0) io_fail("cannot write checkpoint file", path, w < 0 ? errno : ENOSPC);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_path(const std::string& path) {
  Fd d(::open(path.c_str(), O_RDONLY | O_DIRECTORY));
  if (d.fd < 0) io_fail("cannot open directory", path);
  if (::fsync(d.fd) != 0) io_fail("cannot fsync directory", path);
}

// Checkpoints may hold secrets (the config) and are as private as the run directory
// they live in: files get its permission bits without x (0700 -> 0600, 0755 -> 0644),
// directories its bits. The launcher sets the mode of a run directory it created
// (training.run_dir_mode); checkpoint_save bounds the bits by that mode, as an adopted
// directory keeps its own.
mode_t run_dir_mode(const std::string& run_dir) {
  struct stat st {};
  if (::stat(run_dir.c_str(), &st) != 0) return 0700;
  return st.st_mode & 0777;
}

// Writes path durably (write, fsync, close) and returns its CRC32C. A file that cannot be
// written completely is removed at once: on a full disk its partial data would hold the
// space the other ranks and the launcher need. IoError names the file and the reason.
uint32_t file_write(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts, mode_t mode) {
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode & 0666));
  if (f.fd < 0) io_fail("cannot create checkpoint file", path);
  // open's mode is filtered by the umask; the run directory's mode is the rule here.
  ::fchmod(f.fd, mode & 0666);
  uint32_t crc = 0;
  try {
    for (const auto& [p, n] : parts) {
      write_all(f.fd, p, n, path);
      crc = crc32c(p, n, crc);
    }
    // Some filesystems (NFS) report a full disk only at fsync or close.
    if (::fsync(f.fd) != 0) io_fail("cannot fsync checkpoint file", path);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) io_fail("cannot write checkpoint file", path);
  } catch (const IoError&) {
    f = Fd();
    ::unlink(path.c_str());
    throw;
  }
  return crc;
}

void rename_durable(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) io_fail("cannot rename " + from + " to", to);
  fsync_path(fs::path(to).parent_path().string());
}

// `latest` holds one checkpoint's name.
constexpr uint64_t kLatestMaxBytes = 4096;

// A small file of the checkpoints (a manifest, `latest`) through the input rule: "" when
// it cannot be read, with *problem saying why unless it simply does not exist (a FIFO, a
// device or a link loop in its place ends here, never blocking or filling memory).
std::string read_text(const std::string& path, uint64_t max_bytes, std::string* problem = nullptr) {
  std::string why;
  InputFile f = input_file_try_open(path, max_bytes, &why);
  try {
    if (why.empty()) return f.read_all("checkpoint file", max_bytes);
  } catch (const Error& e) {
    why = e.what();
  }
  if (problem && why != "does not exist") *problem = why;
  return {};
}

// ----------------------------------------------------------------------------
// The saved partition: buffer of n elements over W ranks, shard ceil(n / W).
struct Part {
  size_t lo, hi;
};
Part part_of(size_t n, int world, int rank) {
  const size_t s = (n + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
  const size_t lo = std::min(static_cast<size_t>(rank) * s, n);
  return {lo, std::min(lo + s, n)};
}

// Float pairs carry 32-bit values exactly through an fp32 all-gather.
void u32_to_f2(uint32_t x, float* out) {
  out[0] = static_cast<float>(x & 0xffffu);
  out[1] = static_cast<float>(x >> 16);
}
uint32_t f2_to_u32(const float* in) { return static_cast<uint32_t>(in[0]) | (static_cast<uint32_t>(in[1]) << 16); }

int64_t step_of(const std::string& name) {
  if (name.size() < 5 || name.rfind("step", 0) != 0) return -1;
  int64_t k = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    k = k * 10 + (name[i] - '0');
  }
  return k;
}

// "tmp-step<digits>": a checkpoint being written (or an interrupted save). Only these are
// removed as leftovers; another name in checkpoints/ is not ours to delete. (The launcher
// applies the same rule before each round: launch/run_dir.h.)
bool partial_name(const std::string& name) { return name.rfind("tmp-", 0) == 0 && step_of(name.substr(4)) >= 0; }

// A manifest names its files; they must be bare names inside the checkpoint directory,
// or a crafted manifest could make us open (and report on) any path.
bool bare_file_name(const std::string& n) {
  return !n.empty() && n.find('/') == std::string::npos && n.find('\0') == std::string::npos &&
         n.find("..") == std::string::npos;
}

// Why the value at man[key] (a "/"-separated path) is not an integer in [lo, hi], or "".
std::string manifest_int_problem(const json& man, const std::string& key, int64_t lo, int64_t hi) {
  const json* v = &man;
  for (size_t at = 0; at <= key.size();) {
    const size_t end = std::min(key.find('/', at), key.size());
    const std::string part = key.substr(at, end - at);
    if (!v->is_object() || !v->contains(part)) return "has no \"" + key + "\"";
    v = &v->at(part);
    at = end + 1;
  }
  bool ok = false;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    ok = u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo;  // hi >= 0: the cast is exact here
  } else if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    ok = i >= lo && i <= hi;
  }
  if (ok) return "";
  return "\"" + key + "\" is " + v->dump() + ", not an integer from " + std::to_string(lo) + " to " +
         std::to_string(hi);
}

// Why a buffer's "tensors" list (name, offset, shape, decay of each tensor, as
// layout_json writes them) is not well typed or does not lie inside the buffer's "size",
// or "". Typed here like the rest, so the comparison with the model (layout_check) only
// ever meets the types it reads.
std::string manifest_tensors_problem(const json& buf, const std::string& at) {
  if (!buf.contains("tensors") || !buf.at("tensors").is_array())
    return at + ".tensors is " + (buf.contains("tensors") ? buf.at("tensors").dump() : std::string("missing")) +
           ", not a list";
  const uint64_t size = buf.at("size").get<uint64_t>();
  const json& ts = buf.at("tensors");
  for (size_t t = 0; t < ts.size(); ++t) {
    const json& e = ts[t];
    const std::string tat = at + ".tensors[" + std::to_string(t) + "]";
    auto shown = [&](const char* k) { return e.contains(k) ? e.at(k).dump() : std::string("missing"); };
    if (!e.is_object()) return tat + " is " + e.dump() + ", not an object";
    if (!e.contains("name") || !e.at("name").is_string()) return tat + ".name is " + shown("name") + ", not a string";
    if (!e.contains("offset") || !e.at("offset").is_number_unsigned())
      return tat + ".offset is " + shown("offset") + ", not a non-negative integer";
    if (!e.contains("decay") || !e.at("decay").is_boolean())
      return tat + ".decay is " + shown("decay") + ", not true or false";
    if (!e.contains("shape") || !e.at("shape").is_array() || e.at("shape").empty() || e.at("shape").size() > 8)
      return tat + ".shape is " + shown("shape") + ", not a list of 1 to 8 dimensions";
    // The product in double: a forged shape must not wrap around to a small count.
    double numel = 1;
    for (const json& d : e.at("shape")) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() == 0)
        return tat + ".shape is " + e.at("shape").dump() + ", not a list of positive integers";
      numel *= static_cast<double>(d.get<uint64_t>());
    }
    if (static_cast<double>(e.at("offset").get<uint64_t>()) + numel > static_cast<double>(size))
      return tat + " (" + e.at("name").dump() + ", offset " + e.at("offset").dump() + ", shape " +
             e.at("shape").dump() + ") ends past its buffer's " + std::to_string(size) + " elements";
  }
  return "";
}

// The training state a manifest records, checked before anything is loaded: a step that is
// not the one the directory is named after, or a negative or out-of-range counter (a
// damaged or hand-edited manifest; the manifest has no checksum of its own) makes the
// checkpoint unusable like a bad shard, instead of resuming "from step -5".
std::string manifest_state_problem(const fs::path& dir, const json& man) {
  constexpr int64_t kI32 = std::numeric_limits<int32_t>::max(), kI64 = std::numeric_limits<int64_t>::max();
  const std::pair<const char*, std::pair<int64_t, int64_t>> ranges[] = {
      {"step", {0, kI32}},  // training.max_steps is a 32-bit key
      {"optimizer_step", {0, kI64}}, {"scheduler_step", {0, kI64}}, {"zero_stage", {0, 3}},
      {"forward_count", {0, kI64}},  {"sampler/epoch", {0, kI64}},  {"sampler/offset", {0, kI64}},
  };
  for (const auto& [key, r] : ranges)
    if (std::string why = manifest_int_problem(man, key, r.first, r.second); !why.empty()) return why;
  const int64_t named = step_of(dir.filename().string());
  if (named >= 0 && man.at("step").get<int64_t>() != named)
    return "\"step\" is " + man.at("step").dump() + " but the directory is " + dir.filename().string();
  if (!man.contains("config_yaml") || !man.at("config_yaml").is_string()) return "has no \"config_yaml\" string";
  if (!man.contains("buffers") || !man.at("buffers").is_array()) return "has no \"buffers\" list";
  // Typed here, so that comparing them with the model (layout_check) cannot meet a
  // string where a size belongs: a wrong field makes the checkpoint unusable, and the
  // load falls back to the previous complete one.
  const json& bufs = man.at("buffers");
  for (size_t b = 0; b < bufs.size(); ++b) {
    const json& e = bufs[b];
    const std::string at = "\"buffers\"[" + std::to_string(b) + "]";
    if (!e.is_object()) return at + " is " + e.dump() + ", not an object";
    if (!e.contains("name") || !e.at("name").is_string())
      return at + ".name is " + (e.contains("name") ? e.at("name").dump() : "missing") + ", not a string";
    if (!e.contains("size") || !e.at("size").is_number_unsigned())
      return at + ".size is " + (e.contains("size") ? e.at("size").dump() : "missing") + ", not a non-negative integer";
    if (!e.contains("trainable") || !e.at("trainable").is_boolean())
      return at + ".trainable is " + (e.contains("trainable") ? e.at("trainable").dump() : "missing") +
             ", not true or false";
    if (std::string why = manifest_tensors_problem(e, at); !why.empty()) return why;
  }
  for (const char* k : {"compute_dtype", "master_dtype"})
    if (!man.contains(k) || !man.at(k).is_string() ||
        (man.at(k).get<std::string>() != "float32" && man.at(k).get<std::string>() != "bfloat16" &&
         man.at(k).get<std::string>() != "float16"))
      return std::string("\"") + k + "\" is " + (man.contains(k) ? man.at(k).dump() : std::string("missing")) +
             ", not \"float32\", \"bfloat16\" or \"float16\"";
  if (!man.contains("loss_scaler")) return "has no \"loss_scaler\"";
  const json& sc = man.at("loss_scaler");
  if (!sc.is_null()) {
    if (!sc.is_object() || !sc.contains("scale") || !sc.at("scale").is_number() ||
        !(sc.at("scale").get<double>() > 0) || !std::isfinite(sc.at("scale").get<double>()))
      return "\"loss_scaler\" has no positive finite \"scale\"";
    for (const char* k : {"loss_scaler/cur_iter", "loss_scaler/last_overflow_iter"})
      if (std::string why = manifest_int_problem(man, k, -1, kI64); !why.empty()) return why;
    if (std::string why = manifest_int_problem(man, "loss_scaler/cur_hysteresis", 0, kI32); !why.empty()) return why;
  }
  return "";
}

// Parses dir/manifest.json and checks its file list (count, bare names). Returns "" or
// why the checkpoint is unusable; touches no file the manifest names.
std::string manifest_read(const fs::path& dir, json& man, int& world) {
  const fs::path mpath = dir / "manifest.json";
  std::string unreadable;
  const std::string text = read_text(mpath.string(), kInputMetaMaxBytes, &unreadable);
  if (!unreadable.empty()) return mpath.string() + ": " + unreadable;
  if (text.empty()) return mpath.string() + ": missing or empty";
  try {
    man = json::parse(text);
    if (!man.is_object()) return mpath.string() + ": not a JSON object";
    if (std::string why = manifest_int_problem(man, "format", 0, INT32_MAX); !why.empty())
      return mpath.string() + ": " + why;
    if (man.at("format").get<int64_t>() != FORMAT_VERSION)
      return mpath.string() + ": unsupported format " + man.at("format").dump();
    if (std::string why = manifest_int_problem(man, "world_size", 1, 1 << 24); !why.empty())
      return mpath.string() + ": " + why;
    world = man.at("world_size").get<int>();
    if (!man.contains("files") || !man.at("files").is_array()) return mpath.string() + ": has no \"files\" list";
    const auto& files = man.at("files");
    if (static_cast<int64_t>(files.size()) != world) return mpath.string() + ": file list does not match world_size";
    for (size_t i = 0; i < files.size(); ++i) {
      const json& f = files[i];
      const std::string at = mpath.string() + ": \"files\"[" + std::to_string(i) + "]";
      if (!f.is_object() || !f.contains("name") || !f.at("name").is_string()) return at + ".name is not a string";
      const std::string n = f.at("name").get<std::string>();
      if (!bare_file_name(n))
        return mpath.string() + ": names file " + json(n).dump() +
               ", not a bare file name inside the checkpoint directory (a damaged or forged manifest)";
      if (!f.contains("bytes") || !f.at("bytes").is_number_unsigned())
        return at + ".bytes is not a non-negative integer";
      if (std::string why = manifest_int_problem(f, "crc32c", 0, UINT32_MAX); !why.empty()) return at + ": " + why;
    }
    if (std::string why = manifest_state_problem(dir, man); !why.empty()) return mpath.string() + ": " + why;
  } catch (const json::exception& e) {
    return mpath.string() + ": malformed (" + e.what() + ")";
  }
  return "";
}

// The cheap part of verification (manifest, names, every file present at its recorded
// size), for pruning, which must not read whole checkpoints at every save.
std::string checkpoint_check_sizes(const fs::path& dir) {
  json man;
  int world = 0;
  std::string why = manifest_read(dir, man, world);
  if (!why.empty()) return why;
  for (const auto& f : man.at("files")) {
    const fs::path p = dir / f.at("name").get<std::string>();
    std::string why;
    const InputFile in = input_file_try_open(p.string(), kInputAnySize, &why);
    if (!why.empty()) return p.string() + (why == "does not exist" ? ": missing" : ": " + why);
    const uint64_t size = in.size();
    if (size != f.at("bytes").get<uint64_t>())
      return p.string() + ": truncated or extended (" + std::to_string(size) + " bytes, manifest says " +
             f.at("bytes").dump() + ")";
  }
  return "";
}

// Renames a checkpoint that failed verification to <name>.corrupt-<UTC time>: kept for a
// post-mortem, invisible to loading and pruning. Returns the new path ("" when it failed).
std::string checkpoint_set_aside(const fs::path& dir) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  fs::path to = dir;
  to += std::string(".corrupt-") + stamp;
  std::error_code ec;
  for (int i = 1; fs::exists(to, ec); ++i) {
    to = dir;
    to += std::string(".corrupt-") + stamp + "-" + std::to_string(i);
  }
  if (::rename(dir.c_str(), to.c_str()) != 0) return "";
  return to.string();
}

// The config without cluster.env: env.set typically carries tokens and passwords for the
// ranks, and checkpoints get copied around (exported, shared) far more than the run
// directory's config.yaml. Drops the `env:` block under top-level `cluster:` (block
// YAML as config_to_yaml writes it).
std::string config_without_cluster_env(const std::string& yaml) {
  std::istringstream in(yaml);
  std::string out, line;
  bool in_cluster = false;
  int skip_deeper_than = -1;  // >= 0: dropping lines indented more than this
  auto indent_of = [](const std::string& l) { return static_cast<int>(l.find_first_not_of(' ')); };
  while (std::getline(in, line)) {
    const bool blank = line.find_first_not_of(" \t\r") == std::string::npos || line[line.find_first_not_of(' ')] == '#';
    const int ind = blank ? -1 : indent_of(line);
    if (skip_deeper_than >= 0) {
      if (blank || ind > skip_deeper_than) continue;
      skip_deeper_than = -1;
    }
    if (!blank && ind == 0) in_cluster = line.rfind("cluster:", 0) == 0;
    if (in_cluster && !blank && ind > 0 && line.compare(static_cast<size_t>(ind), 4, "env:") == 0) {
      out += line.substr(0, static_cast<size_t>(ind)) +
             "# env: not copied into checkpoints (it may hold secrets); see the run directory's config.yaml\n";
      skip_deeper_than = ind;
      continue;
    }
    out += line + "\n";
  }
  return out;
}

json layout_json(const std::vector<ZeroBufferView>& views) {
  json bufs = json::array();
  for (const auto& v : views) {
    json tensors = json::array();
    for (const auto& t : v.buffer->layout.tensors)
      tensors.push_back({{"name", t.name}, {"offset", t.offset}, {"shape", t.shape}, {"decay", t.decay}});
    bufs.push_back(
        {{"name", v.buffer->layout.name}, {"size", v.buffer->size}, {"trainable", v.trainable}, {"tensors", tensors}});
  }
  return bufs;
}

}  // namespace

// ----------------------------------------------------------------------------
namespace {

// Rank 0: a fresh tmp-step<k>/ (and no unconfirmed step<k>/ of an earlier attempt), with
// the run directory's mode.
void prepare_save_dir(const fs::path& root, const fs::path& tmp, const fs::path& final_dir, mode_t mode) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::remove_all(final_dir, ec);  // an unconfirmed earlier attempt at this step
  fs::create_directories(tmp, ec);
  DT_ENFORCE(!ec, IoError, "cannot create checkpoint directory {}: {}", tmp.string(), ec.message());
  fs::permissions(root, static_cast<fs::perms>(mode), ec);
  fs::permissions(tmp, static_cast<fs::perms>(mode), ec);
}

struct ShardWritten {
  uint32_t crc;
  uint64_t bytes;
};

// This rank's shard: its partition slice of every buffer's master, m and v, behind a JSON
// header saying where each lies.
ShardWritten write_shard(const fs::path& tmp, const ZeroCheckpointView& view, const TrainState& state, mode_t mode) {
  const int W = view.world, rank = view.rank;
  const auto& views = view.buffers;
  json entries = json::array();
  std::vector<std::pair<const void*, size_t>> data;
  size_t offset = 0;
  for (size_t b = 0; b < views.size(); ++b) {
    const auto& v = views[b];
    const Part p = part_of(v.buffer->size, W, rank);
    const size_t cnt = p.hi - p.lo;
    DT_CHECK(cnt == 0 || (p.lo >= v.lo && p.hi <= v.hi));
    std::vector<std::pair<const char*, const float*>> kinds{{"master", v.master}};
    if (v.trainable) {
      kinds.emplace_back("m", v.m);
      kinds.emplace_back("v", v.v);
    }
    for (const auto& [kind, src] : kinds) {
      entries.push_back({{"buffer", b}, {"kind", kind}, {"lo", p.lo}, {"count", cnt}, {"offset", offset}});
      if (cnt) data.emplace_back(src + (p.lo - v.lo), cnt * sizeof(float));
      offset += cnt * sizeof(float);
    }
  }
  // The rank's own error-feedback state: not a partition of anything, so its entries are
  // "rank_state" number i, whole.
  for (size_t i = 0; i < view.rank_state.size(); ++i) {
    const auto& [ptr, cnt] = view.rank_state[i];
    entries.push_back({{"buffer", i}, {"kind", "rank_state"}, {"lo", 0}, {"count", cnt}, {"offset", offset}});
    if (cnt) data.emplace_back(ptr, cnt * sizeof(float));
    offset += cnt * sizeof(float);
  }
  json head{{"format", FORMAT_VERSION},
            {"rank", rank},
            {"world_size", W},
            {"step", state.step},
            {"has_rng", state.has_rng},
            {"rng", state.rng},
            {"forward_count", state.forward_count},
            {"entries", entries}};
  const std::string head_text = head.dump();
  const uint64_t head_len = head_text.size();
  std::vector<std::pair<const void*, size_t>> parts{{SHARD_MAGIC, 8}, {&head_len, 8}, {head_text.data(), head_len}};
  parts.insert(parts.end(), data.begin(), data.end());
  const std::string shard_name = "rank" + std::to_string(rank) + ".bin";
  const uint32_t crc = file_write((tmp / shard_name).string(), parts, mode);
  return {crc, 16 + head_len + offset};
}

// Every rank confirms its shard (size, CRC) to every other; returns the manifest's "files"
// (on every rank; rank 0 writes it).
json confirm_shards(comm::Communicator* comm, int W, const ShardWritten& mine_written) {
  std::vector<float> mine(6), all(static_cast<size_t>(W) * 6);
  u32_to_f2(mine_written.crc, mine.data());
  u32_to_f2(static_cast<uint32_t>(mine_written.bytes & 0xffffffffu), mine.data() + 2);
  u32_to_f2(static_cast<uint32_t>(mine_written.bytes >> 32), mine.data() + 4);
  if (comm) comm->all_gather_host(mine.data(), all.data(), 6, DType::F32);
  else all = mine;
  json files = json::array();
  for (int r = 0; r < W; ++r) {
    const float* f = all.data() + static_cast<size_t>(r) * 6;
    const uint64_t sz = static_cast<uint64_t>(f2_to_u32(f + 2)) | (static_cast<uint64_t>(f2_to_u32(f + 4)) << 32);
    files.push_back({{"name", "rank" + std::to_string(r) + ".bin"}, {"bytes", sz}, {"crc32c", f2_to_u32(f)}});
  }
  return files;
}

json manifest_json(const ZeroCheckpointView& view, const TrainState& state, const json& files) {
  json scaler = nullptr;
  if (state.has_scaler)
    scaler = {{"scale", state.scaler.scale},
              {"cur_iter", state.scaler.cur_iter},
              {"last_overflow_iter", state.scaler.last_overflow_iter},
              {"cur_hysteresis", state.scaler.cur_hysteresis}};
  return json{{"format", FORMAT_VERSION},
              {"step", state.step},
              {"world_size", view.world},
              {"zero_stage", view.stage},
              {"compute_dtype", dtype_name(view.compute_dtype)},
              {"master_dtype", "float32"},
              {"optimizer_step", view.step_count},
              {"scheduler_step", state.scheduler_step},
              {"loss_scaler", scaler},
              {"sampler", {{"epoch", state.sampler.epoch}, {"offset", state.sampler.offset}}},
              {"forward_count", state.forward_count},
              {"shard_layout", "buffer of n elements: rank r holds [r*ceil(n/W), min((r+1)*ceil(n/W), n))"},
              {"buffers", layout_json(view.buffers)},
              {"files", files},
              {"config_yaml", config_without_cluster_env(state.config_yaml)}};
}

// Keep the newest keep_last checkpoints that verify (`name`, which every rank just
// confirmed, always among them). A damaged one is set aside, not counted: keeping it in
// place of a good older one would leave nothing to fall back to. Directories newer than
// `step` were never confirmed; loading ignores them and a save at their step replaces
// them, so they are left alone here.
void prune_checkpoints(const fs::path& root, const std::string& name, int64_t step, int64_t keep_last) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (partial_name(n)) {  // an earlier save that did not complete
      if (e.is_directory(ec)) fs::remove_all(e.path(), ec);
      continue;
    }
    const int64_t k = step_of(n);
    if (k >= 0 && k <= step && e.is_directory()) steps.emplace_back(k, e.path());
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const size_t keep = static_cast<size_t>(std::max<int64_t>(1, keep_last));
  size_t kept = 0;
  for (const auto& [k, dir] : steps) {
    if (dir.filename().string() == name) {
      ++kept;
      continue;
    }
    const std::string why = checkpoint_check_sizes(dir);
    if (!why.empty()) {
      const std::string to = checkpoint_set_aside(dir);
      log_warn("checkpoint {} is damaged ({}); {}", dir.string(), why,
               to.empty() ? "it could not be renamed and is left in place" : "set aside as " + to);
      continue;
    }
    if (kept < keep) ++kept;
    else fs::remove_all(dir, ec);
  }
}

}  // namespace

std::string checkpoint_save(const std::string& run_dir, const ZeroCheckpointView& view, const TrainState& state,
                            const CheckpointSaveOptions& opts) {
  comm::Communicator* comm = view.comm;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = "step" + std::to_string(state.step);
  const fs::path tmp = root / ("tmp-" + name), final_dir = root / name;
  const std::string latest_now = read_text((root / "latest").string(), kLatestMaxBytes);
  // The same step is already the confirmed checkpoint (a save right after resuming),
  // unless that checkpoint is damaged or was set aside: then it is written again. Every
  // rank sees the same files, so every rank decides the same.
  if (latest_now == name && checkpoint_check_sizes(final_dir).empty()) {
    if (comm) comm->barrier();
    return final_dir.string();
  }
  const mode_t mode = run_dir_mode(run_dir) & (opts.max_mode & 0777);
  if (view.rank == 0) prepare_save_dir(root, tmp, final_dir, mode);
  if (comm) comm->barrier();

  const ShardWritten shard = write_shard(tmp, view, state, mode);
  if (opts.fault_hook) opts.fault_hook("shard_written");
  const json files = confirm_shards(comm, view.world, shard);

  if (view.rank == 0) {
    const std::string text = manifest_json(view, state, files).dump(1);
    file_write((tmp / "manifest.json").string(), {{text.data(), text.size()}}, mode);
    fsync_path(tmp.string());
    rename_durable(tmp.string(), final_dir.string());
    if (opts.fault_hook) opts.fault_hook("renamed");
    const std::string lt = (root / "latest.tmp").string();
    file_write(lt, {{name.data(), name.size()}}, mode);
    rename_durable(lt, (root / "latest").string());
    prune_checkpoints(root, name, state.step, opts.keep_last);
  }
  if (comm) comm->barrier();
  return final_dir.string();
}

// ----------------------------------------------------------------------------
namespace {

// Why a shard file's header is not what the load reads (typed entries, has_rng), or "".
std::string shard_head_problem(const json& h) {
  if (!h.is_object() || !h.contains("entries") || !h.at("entries").is_array()) return "has no \"entries\" list";
  for (const json& e : h.at("entries")) {
    if (!e.is_object() || !e.contains("kind") || !e.at("kind").is_string()) return "has an entry without a \"kind\"";
    for (const char* k : {"buffer", "lo", "count", "offset"})
      if (!e.contains(k) || !e.at(k).is_number_unsigned())
        return std::string("has an entry whose \"") + k + "\" is not a non-negative integer";
  }
  if (!h.contains("has_rng") || !h.at("has_rng").is_boolean()) return "has no \"has_rng\" flag";
  return "";
}

// One verified checkpoint: its manifest and open shard files with their entry tables.
struct Opened {
  json manifest;
  int world = 0;
  std::vector<Fd> fds;
  std::vector<json> heads;  // per file
  std::vector<uint64_t> data_start;
};

// The manifest's buffers against the shards' own entry tables (CRC-checked, where the
// manifest has no checksum): each rank's shard must hold its partition of every buffer
// (the master, and m and v of a trainable one) at the manifest's size, inside the file.
// A size the shards do not hold is a damaged manifest, and the load falls back to an older
// checkpoint, instead of comparing it with the model and blaming the config. "" or why.
std::string shard_layout_problem(const Opened& o) {
  const json& bufs = o.manifest.at("buffers");
  const json& files = o.manifest.at("files");
  for (int q = 0; q < o.world; ++q) {
    std::map<std::pair<uint64_t, std::string>, const json*> entry;
    for (const json& e : o.heads[static_cast<size_t>(q)].at("entries"))
      entry[{e.at("buffer").get<uint64_t>(), e.at("kind").get<std::string>()}] = &e;
    const uint64_t bytes = files.at(static_cast<size_t>(q)).at("bytes").get<uint64_t>();
    const uint64_t start = o.data_start[static_cast<size_t>(q)];
    if (start > bytes) return files.at(static_cast<size_t>(q)).at("name").get<std::string>() + ": header past its end";
    const uint64_t data_bytes = bytes - start;
    for (size_t b = 0; b < bufs.size(); ++b) {
      const uint64_t n = bufs[b].at("size").get<uint64_t>();
      const Part p = part_of(static_cast<size_t>(n), o.world, q);
      std::vector<const char*> kinds{"master"};
      if (bufs[b].at("trainable").get<bool>()) kinds.insert(kinds.end(), {"m", "v"});
      for (const char* kind : kinds) {
        auto it = entry.find({b, kind});
        const std::string shard = files.at(static_cast<size_t>(q)).at("name").get<std::string>();
        if (it == entry.end())
          return fmt::format("\"buffers\"[{}] ({} elements): {} holds no {} slice of it", b, n, shard, kind);
        const json& e = *it->second;
        const uint64_t lo = e.at("lo").get<uint64_t>(), count = e.at("count").get<uint64_t>();
        const uint64_t offset = e.at("offset").get<uint64_t>();
        if (lo != p.lo || count != p.hi - p.lo)
          return fmt::format(
              "\"buffers\"[{}].size is {}, but {} holds elements [{}, {}) of it where that size puts [{}, {}) at "
              "world size {}: the manifest and its shards disagree (a damaged manifest)",
              b, n, shard, lo, lo + count, p.lo, p.hi, o.world);
        if (count > data_bytes / sizeof(float) || offset > data_bytes - count * sizeof(float))
          return fmt::format("{}: the {} slice of buffer {} ends past the file's data", shard, kind, b);
      }
    }
  }
  return "";
}

// Verifies dir (manifest present and parsable, every file present, of the recorded
// size and CRC32C) and opens it. Returns "" or why it is unusable, naming the file.
std::string checkpoint_open(const fs::path& dir, Opened& out) {
  const fs::path mpath = dir / "manifest.json";
  if (std::string why = manifest_read(dir, out.manifest, out.world); !why.empty()) return why;
  try {
    const auto& files = out.manifest.at("files");
    for (int r = 0; r < out.world; ++r) {
      const auto& f = files.at(static_cast<size_t>(r));
      const fs::path p = dir / f.at("name").get<std::string>();
      std::string unusable;
      InputFile in = input_file_try_open(p.string(), kInputAnySize, &unusable);
      if (!unusable.empty()) return p.string() + (unusable == "does not exist" ? ": missing" : ": " + unusable);
      Fd fd(in.release());
      struct stat st {};
      if (::fstat(fd.fd, &st) != 0) return p.string() + ": cannot stat";
      const uint64_t want = f.at("bytes").get<uint64_t>();
      if (static_cast<uint64_t>(st.st_size) != want)
        return p.string() + ": truncated or extended (" + std::to_string(st.st_size) + " bytes, manifest says " +
               std::to_string(want) + ")";
      uint32_t crc = 0;
      std::vector<char> buf(1 << 20);
      for (;;) {
        const ssize_t n = ::read(fd.fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return p.string() + ": read error " + std::strerror(errno);
        if (n == 0) break;
        crc = crc32c(buf.data(), static_cast<size_t>(n), crc);
      }
      if (crc != f.at("crc32c").get<uint32_t>())
        return p.string() + ": checksum mismatch (CRC32C), the file is corrupt";
      char magic[8];
      uint64_t hl = 0;
      if (::pread(fd.fd, magic, 8, 0) != 8 || std::memcmp(magic, SHARD_MAGIC, 8) != 0 ||
          ::pread(fd.fd, &hl, 8, 8) != 8 || hl > static_cast<uint64_t>(st.st_size))
        return p.string() + ": not a dtrain shard file";
      std::string head(hl, '\0');
      if (::pread(fd.fd, head.data(), hl, 16) != static_cast<ssize_t>(hl)) return p.string() + ": short header";
      json h = json::parse(head);
      if (std::string why = shard_head_problem(h); !why.empty()) return p.string() + ": header " + why;
      out.heads.push_back(std::move(h));
      out.data_start.push_back(16 + hl);
      out.fds.push_back(std::move(fd));
    }
    if (std::string why = shard_layout_problem(out); !why.empty()) return mpath.string() + ": " + why;
  } catch (const json::exception& e) {
    return mpath.string() + ": malformed (" + e.what() + ")";
  }
  return "";
}

// Reads elements [a, b) of (buffer, kind) from the saved partition into dst.
void read_range(Opened& o, size_t buffer, const char* kind, size_t n, size_t a, size_t b, float* dst,
                const std::string& dir) {
  for (int q = 0; q < o.world && a < b; ++q) {
    const Part p = part_of(n, o.world, q);
    const size_t x = std::max(a, p.lo), y = std::min(b, p.hi);
    if (x >= y) continue;
    const json* entry = nullptr;
    for (const auto& e : o.heads[static_cast<size_t>(q)].at("entries"))
      if (e.at("buffer").get<size_t>() == buffer && e.at("kind").get<std::string>() == kind) entry = &e;
    DT_ENFORCE(entry != nullptr, CheckpointError, "{}/rank{}.bin has no {} slice of buffer {}", dir, q, kind, buffer);
    DT_ENFORCE(entry->at("lo").get<size_t>() == p.lo && entry->at("count").get<size_t>() == p.hi - p.lo,
               CheckpointError, "{}/rank{}.bin: the {} slice of buffer {} does not follow the shard layout", dir, q,
               kind, buffer);
    const uint64_t off =
        o.data_start[static_cast<size_t>(q)] + entry->at("offset").get<uint64_t>() + (x - p.lo) * sizeof(float);
    const size_t bytes = (y - x) * sizeof(float);
    const ssize_t r = ::pread(o.fds[static_cast<size_t>(q)].fd, dst + (x - a), bytes, static_cast<off_t>(off));
    DT_ENFORCE(r == static_cast<ssize_t>(bytes), CheckpointError, "{}/rank{}.bin: short read", dir, q);
  }
}

// The view's rank_state from this rank's own shard, when the checkpoint was saved at the
// same world size with the same state lengths; zeros (and a warning) otherwise.
void rank_state_read(Opened& o, const ZeroCheckpointView& view, const std::string& dir) {
  if (view.rank_state.empty()) return;
  std::vector<const json*> found(view.rank_state.size(), nullptr);
  const bool same_world = o.world == view.world && view.rank < o.world;
  if (same_world)
    for (const auto& e : o.heads[static_cast<size_t>(view.rank)].at("entries"))
      if (e.at("kind").get<std::string>() == "rank_state" && e.at("buffer").get<size_t>() < found.size())
        found[e.at("buffer").get<size_t>()] = &e;
  bool all = same_world;
  for (size_t i = 0; i < found.size() && all; ++i)
    all = found[i] != nullptr && found[i]->at("count").get<size_t>() == view.rank_state[i].second;
  if (!all) {
    log_warn("{}: no error-feedback state for rank {} at world size {} (saved at {}); it starts at zero", dir,
             view.rank, view.world, o.world);
    for (const auto& [ptr, cnt] : view.rank_state) std::fill(ptr, ptr + cnt, 0.0f);
    return;
  }
  const auto q = static_cast<size_t>(view.rank);
  for (size_t i = 0; i < found.size(); ++i) {
    const size_t bytes = view.rank_state[i].second * sizeof(float);
    const uint64_t off = o.data_start[q] + found[i]->at("offset").get<uint64_t>();
    const ssize_t r = ::pread(o.fds[q].fd, view.rank_state[i].first, bytes, static_cast<off_t>(off));
    DT_ENFORCE(r == static_cast<ssize_t>(bytes), CheckpointError, "{}/rank{}.bin: short read", dir, q);
  }
}

// Where the elements of one buffer lie in a checkpoint: empty when it lays the buffer out as
// the model does, else one piece per tensor of the model (its offset, the saved tensor's
// offset, its elements), covering the buffer.
struct Piece {
  size_t at = 0, saved = 0, n = 0;
};
using BufferMap = std::vector<Piece>;

// The pieces of buffer b when the checkpoint holds the model's tensors (the same names and
// shapes, each once) in another order: a build before the fused projections kept qwen2's
// and attention_bias / mlp_bias models' biases after their own weights. Empty when not.
BufferMap map_by_name(const json& st, const std::vector<model::TensorSpec>& tensors, size_t size) {
  std::map<std::string, const json*> saved;
  for (const auto& e : st)
    if (!saved.emplace(e.at("name").get<std::string>(), &e).second) return {};
  BufferMap map;
  size_t covered = 0;
  for (const auto& t : tensors) {
    auto it = saved.find(t.name);
    if (it == saved.end() || it->second->at("shape") != json(t.shape)) return {};
    map.push_back({t.offset, it->second->at("offset").get<size_t>(), t.numel()});
    covered += t.numel();
  }
  if (covered != size) return {};
  return map;
}

// ConfigError when the saved buffers (typed by manifest_state_problem) are not the
// model's: the config describes another model than the run trained, which every retry
// would meet again, so it is a config error (exit 2, not restarted), not a damaged checkpoint.
// Returns each buffer's map (BufferMap: empty where the layouts agree).
std::vector<BufferMap> layout_check(const json& saved, const std::vector<ZeroBufferView>& views,
                                    const std::string& dir) {
  const char* fix =
      "the config describes another model than the one this run trained (model sizes, LoRA or "
      "tie_embeddings changed?): resume with the config the run was trained with, or start a new run "
      "with --output-dir";
  DT_ENFORCE_EQ(saved.size(), views.size(), ConfigError,
                "{}: the checkpoint has another number of parameter buffers "
                "than the model; {}",
                dir, fix);
  std::vector<BufferMap> maps(views.size());
  size_t remapped = 0;
  for (size_t b = 0; b < views.size(); ++b) {
    const auto& s = saved[b];
    if (s.at("name").get<std::string>() != views[b].buffer->layout.name ||
        s.at("size").get<uint64_t>() != views[b].buffer->size || s.at("trainable").get<bool>() != views[b].trainable)
      DT_THROW(ConfigError,
               "{}: buffer {} is {} ({} elements{}) in the checkpoint but {} ({} elements{}) in the model; {}", dir, b,
               s.at("name").dump(), s.at("size").dump(), s.at("trainable").get<bool>() ? "" : ", frozen",
               views[b].buffer->layout.name, views[b].buffer->size, views[b].trainable ? "" : ", frozen", fix);
    // Equal sizes can still hold other tensors (d_model and d_ff swapped, another head
    // split of the same projection): the values would load into the wrong places. Where
    // each value lies is what the load depends on, so offsets and shapes are compared, and
    // a checkpoint of a build that named a tensor otherwise still loads. Only where they
    // differ are names read: the same tensors in another order load by name.
    const auto& tensors = views[b].buffer->layout.tensors;
    const json& st = s.at("tensors");
    DT_ENFORCE_EQ(st.size(), tensors.size(), ConfigError,
                  "{}: buffer {} ({}) holds another number of tensors in the "
                  "checkpoint than in the model; {}",
                  dir, b, views[b].buffer->layout.name, fix);
    for (size_t t = 0; t < tensors.size(); ++t) {
      const json shape = tensors[t].shape;
      if (st[t].at("offset").get<uint64_t>() == tensors[t].offset && st[t].at("shape") == shape) continue;
      maps[b] = map_by_name(st, tensors, views[b].buffer->size);
      if (!maps[b].empty()) {
        ++remapped;
        break;
      }
      DT_THROW(ConfigError,
               "{}: buffer {} ({}) tensor {} is {} (offset {}, shape {}) in the checkpoint but {} "
               "(offset {}, shape {}) in the model; {}",
               dir, b, views[b].buffer->layout.name, t, st[t].at("name").dump(), st[t].at("offset").dump(),
               st[t].at("shape").dump(), tensors[t].name, tensors[t].offset, shape.dump(), fix);
    }
  }
  if (remapped > 0)
    log_info(
        "{}: {} buffer(s) hold their tensors in another order than this build lays them out (a checkpoint of "
        "an earlier dtrain); they are read by tensor name",
        dir, remapped);
  return maps;
}

// read_range through a buffer's map: elements [a, b) of the model's layout.
void read_mapped(Opened& o, const BufferMap& map, size_t buffer, const char* kind, size_t n, size_t a, size_t b,
                 float* dst, const std::string& dir) {
  if (map.empty()) return read_range(o, buffer, kind, n, a, b, dst, dir);
  for (const Piece& p : map) {
    const size_t x = std::max(a, p.at), y = std::min(b, p.at + p.n);
    if (x < y) read_range(o, buffer, kind, n, p.saved + (x - p.at), p.saved + (y - p.at), dst + (x - a), dir);
  }
}

// The checkpoints to try, in order: the one `latest` names, then older complete ones,
// newest first. Newer directories than latest were never confirmed by every rank and are
// ignored. A `latest` that names no checkpoint is recorded in res.skipped.
std::vector<fs::path> load_candidates(const fs::path& root, CheckpointLoadResult& res, std::string& latest) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const int64_t k = step_of(e.path().filename().string());
      std::error_code entry_ec;  // a step<N> that is a link loop is no checkpoint, not a crash
      if (k >= 0 && e.is_directory(entry_ec)) steps.emplace_back(k, e.path());
    }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string unreadable;
  latest = read_text((root / "latest").string(), kLatestMaxBytes, &unreadable);
  // A `latest` that cannot be read names no checkpoint: the complete ones are tried newest
  // first, and the reason is kept.
  if (!unreadable.empty()) res.skipped.push_back((root / "latest").string() + ": " + unreadable);
  while (!latest.empty() && std::isspace(static_cast<unsigned char>(latest.back()))) latest.pop_back();
  std::vector<fs::path> candidates;
  int64_t limit = INT64_MAX;
  if (!latest.empty()) {
    candidates.push_back(root / latest);
    limit = step_of(latest);
    if (limit < 0) {
      res.skipped.push_back((root / "latest").string() + ": names '" + latest + "', not a checkpoint");
      candidates.clear();
      limit = INT64_MAX;
    }
  }
  for (const auto& [k, p] : steps)
    if (k < limit) candidates.push_back(p);
  return candidates;
}

// The trainer state a verified manifest records (rng: rank's own shard header).
void state_from_manifest(const json& man, TrainState& st) {
  st.step = man.at("step").get<int64_t>();
  st.scheduler_step = man.at("scheduler_step").get<int64_t>();
  if (!man.at("loss_scaler").is_null()) {
    const auto& s = man.at("loss_scaler");
    st.has_scaler = true;
    st.scaler.scale = s.at("scale").get<float>();
    st.scaler.cur_iter = s.at("cur_iter").get<int64_t>();
    st.scaler.last_overflow_iter = s.at("last_overflow_iter").get<int64_t>();
    st.scaler.cur_hysteresis = s.at("cur_hysteresis").get<int>();
  }
  st.sampler.epoch = man.at("sampler").at("epoch").get<uint64_t>();
  st.sampler.offset = man.at("sampler").at("offset").get<uint64_t>();
  st.forward_count = man.at("forward_count").get<uint64_t>();
  st.config_yaml = man.at("config_yaml").get<std::string>();
}

}  // namespace

std::string checkpoint_problem(const std::string& dir) { return checkpoint_check_sizes(fs::path(dir)); }

CheckpointLoadResult checkpoint_load(const std::string& run_dir, const ZeroCheckpointView& view,
                                     bool set_aside_damaged) {
  comm::Communicator* comm = view.comm;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  CheckpointLoadResult res;
  std::error_code ec;

  std::string latest;
  const std::vector<fs::path> candidates = load_candidates(root, res, latest);
  if (candidates.empty()) {
    DT_ENFORCE(res.skipped.empty() || !set_aside_damaged, CheckpointError, "no usable checkpoint under {}: {}",
               root.string(), res.skipped.front());
    return res;
  }

  for (const auto& dir : candidates) {
    Opened o;
    std::string why = checkpoint_open(dir, o);
    // Every rank must pick the same checkpoint.
    float bad = why.empty() ? 0.0f : 1.0f;
    if (comm) comm->allreduce_host(&bad, 1, DType::F32, comm::ReduceOp::MAX);
    if (bad != 0.0f) {
      // Only damage rank 0 saw itself sets the checkpoint aside: another rank's failure
      // may be its own passing trouble (a mount, a cached stat) on a good checkpoint.
      const bool own = !why.empty();
      if (why.empty()) why = dir.string() + ": unusable on another rank";
      // Set aside once every rank has looked (the allreduce above), so no rank still
      // reads it; a later save then neither counts it for keep_last nor keeps it instead
      // of the checkpoint we fall back to.
      std::string aside;
      if (set_aside_damaged && own && view.rank == 0 && fs::is_directory(dir, ec)) aside = checkpoint_set_aside(dir);
      if (!aside.empty()) why += " (set aside as " + fs::path(aside).filename().string() + ")";
      log_warn("checkpoint {} is unusable: {}; falling back to the previous complete checkpoint", dir.string(), why);
      res.skipped.push_back(why);
      continue;
    }
    const std::string d = dir.string();
    const json& man = o.manifest;
    const std::vector<BufferMap> maps = layout_check(man.at("buffers"), view.buffers, d);

    const auto& views = view.buffers;
    for (size_t b = 0; b < views.size(); ++b) {
      const auto& v = views[b];
      const size_t n = v.buffer->size;
      if (v.resident) read_mapped(o, maps[b], b, "master", n, 0, n, v.full, d);
      else if (v.hi > v.lo) read_mapped(o, maps[b], b, "master", n, v.lo, v.hi, v.master, d);
      if (v.trainable && v.hi > v.lo) {
        read_mapped(o, maps[b], b, "m", n, v.lo, v.hi, v.m, d);
        read_mapped(o, maps[b], b, "v", n, v.lo, v.hi, v.v, d);
      }
    }
    rank_state_read(o, view, d);
    view.loaded(man.at("optimizer_step").get<int64_t>());

    TrainState& st = res.state;
    state_from_manifest(man, st);
    if (view.rank < o.world) {
      const json& h = o.heads[static_cast<size_t>(view.rank)];
      st.has_rng = h.at("has_rng").get<bool>();
      st.rng = h.at("rng").get<Rng::State>();
    }
    res.loaded = true;
    res.dir = d;
    res.saved_world_size = o.world;
    res.saved_stage = man.at("zero_stage").get<int>();
    if (!res.skipped.empty()) {
      log_warn("resumed from {} after skipping {} damaged checkpoint(s)", d, res.skipped.size());
      // `latest` must not keep naming a checkpoint that was set aside: status and the
      // next save's "already saved" test read it. Every rank read it before the
      // allreduces above, so rank 0 may switch it now.
      if (set_aside_damaged && view.rank == 0 && !fs::exists(candidates.front(), ec) && !latest.empty() &&
          latest != dir.filename().string()) {
        const std::string name = dir.filename().string();
        const std::string lt = (root / "latest.tmp").string();
        // checkpoints/ has the bits the saves gave it (bounded by training.run_dir_mode).
        file_write(lt, {{name.data(), name.size()}}, run_dir_mode(run_dir) & run_dir_mode(root.string()));
        rename_durable(lt, (root / "latest").string());
      }
    }
    return res;
  }
  if (!set_aside_damaged) return res;  // read-only: the caller names its way out (--init)
  // One line: the launcher reports a rank's first error line, which must carry the reasons.
  std::string tried;
  for (const auto& s : res.skipped) tried += (tried.empty() ? " " : "; ") + s;
  DT_THROW(CheckpointError, "no usable checkpoint under {}; tried:{}", root.string(), tried);
}

// ----------------------------------------------------------------------------
struct CheckpointMasters::Impl {
  Opened opened;
  std::vector<BufferMap> maps;
  std::vector<model::ParamBuffer> buffers;  // layouts and sizes only: no storage
  std::vector<size_t> sizes;
  CheckpointLoadResult result;
};

CheckpointMasters::CheckpointMasters(const std::string& run_dir,
                                     const std::vector<std::pair<model::BufferLayout, bool>>& buffers)
    : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  for (const auto& [layout, trainable] : buffers) {
    model::ParamBuffer pb;
    pb.layout = layout;
    pb.size = layout.size;
    im.buffers.push_back(std::move(pb));
    im.sizes.push_back(layout.size);
  }
  std::vector<ZeroBufferView> views;
  for (size_t b = 0; b < buffers.size(); ++b) {
    ZeroBufferView v;
    v.buffer = &im.buffers[b];
    v.trainable = buffers[b].second;
    views.push_back(v);
  }
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::string latest;
  for (const auto& dir : load_candidates(root, im.result, latest)) {
    Opened o;
    const std::string why = checkpoint_open(dir, o);
    if (!why.empty()) {
      im.result.skipped.push_back(why);
      continue;
    }
    im.maps = layout_check(o.manifest.at("buffers"), views, dir.string());
    state_from_manifest(o.manifest, im.result.state);
    im.result.loaded = true;
    im.result.dir = dir.string();
    im.result.saved_world_size = o.world;
    im.result.saved_stage = o.manifest.at("zero_stage").get<int>();
    im.opened = std::move(o);
    return;
  }
  std::string tried;
  for (const auto& s : im.result.skipped) tried += "\n  " + s;
  DT_THROW(CheckpointError,
           "{}: no final/ model and no complete checkpoint under {}{}{}; pass --init to use the config's initial "
           "weights instead",
           run_dir, root.string(), tried.empty() ? "" : "; skipped:", tried);
}

CheckpointMasters::~CheckpointMasters() = default;

const CheckpointLoadResult& CheckpointMasters::result() const { return impl_->result; }

void CheckpointMasters::read(size_t buffer, size_t lo, size_t hi, float* dst) {
  DT_ENFORCE(buffer < impl_->sizes.size() && lo <= hi && hi <= impl_->sizes[buffer], InternalError,
             "CheckpointMasters::read: buffer {} [{}, {}) outside the layout", buffer, lo, hi);
  read_mapped(impl_->opened, impl_->maps[buffer], buffer, "master", impl_->sizes[buffer], lo, hi, dst,
              impl_->result.dir);
}

}  // namespace dtrain::train
