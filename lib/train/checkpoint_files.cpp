// The checkpoint format's shared parts: durable file writes and renames, bounded reads,
// the saved partition, the data-parallel groups' places and shard names, and the
// manifest's checks (checkpoint.cpp saves, checkpoint_load.cpp loads).
#include "train/checkpoint_files.h"

#include "core/check.h"
#include "core/crc32c.h"
#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <utility>

namespace dtrain::train::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

// ----------------------------------------------------------------------------
// Files

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

// A small file of the checkpoints (a manifest, `latest`) through the input rule: "" when
// it cannot be read, with *problem saying why unless it simply does not exist (a FIFO, a
// device or a link loop in its place ends here, never blocking or filling memory).
std::string read_text(const std::string& path, uint64_t max_bytes, std::string* problem) {
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
Part part_of(size_t n, int world, int rank) {
  const size_t s = (n + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
  const size_t lo = std::min(static_cast<size_t>(rank) * s, n);
  return {lo, std::min(lo + s, n)};
}

// ----------------------------------------------------------------------------
// Data-parallel groups. The groups are found from the communicators themselves, not from
// numbers a caller passes beside them: each group is named by its lowest world rank, and
// the groups are numbered in that order (Communicator::split(r / n, r) makes group k of
// world ranks [k*n, (k+1)*n)). Values ride as floats: world ranks are below 2^24.
GroupPlace group_place(comm::Communicator* world, comm::Communicator* data_parallel, int dp_rank, int dp_size) {
  GroupPlace g;
  g.comm = data_parallel;
  g.rank = dp_rank;
  if (world == nullptr || world == data_parallel || world->size() == dp_size) return g;
  const int W = world->size();
  float lead = -static_cast<float>(world->rank());  // MAX of the negated ranks: the lowest
  if (data_parallel != nullptr) data_parallel->allreduce_host(&lead, 1, DType::F32, comm::ReduceOp::MAX);
  const float mine[2] = {-lead, static_cast<float>(dp_size)};
  std::vector<float> all(static_cast<size_t>(W) * 2);
  world->all_gather_host(mine, all.data(), 2, DType::F32);
  std::vector<int> leads;
  for (int q = 0; q < W; ++q) {
    const int size = static_cast<int>(all[static_cast<size_t>(q) * 2 + 1]);
    DT_ENFORCE(size == dp_size, UsageError,
               "world rank {} is in a data-parallel group of {} ranks but world rank {} in one of {}: a sharded "
               "checkpoint needs data-parallel groups of one size",
               world->rank(), dp_size, q, size);
    leads.push_back(static_cast<int>(all[static_cast<size_t>(q) * 2]));
  }
  std::sort(leads.begin(), leads.end());
  leads.erase(std::unique(leads.begin(), leads.end()), leads.end());
  DT_ENFORCE(static_cast<int64_t>(leads.size()) * dp_size == W, UsageError,
             "{} data-parallel groups of {} ranks do not make up the world of {} ranks", leads.size(), dp_size, W);
  g.groups = static_cast<int>(leads.size());
  g.group = static_cast<int>(std::lower_bound(leads.begin(), leads.end(), static_cast<int>(-lead)) - leads.begin());
  g.comm = world;
  g.rank = world->rank();
  return g;
}

std::string shard_name(int group, int groups, int rank) {
  const std::string r = "rank" + std::to_string(rank) + ".bin";
  return groups > 1 ? "group" + std::to_string(group) + "-" + r : r;
}

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
std::string manifest_read(const fs::path& dir, json& man, int& world, int& groups) {
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
    // Absent in a checkpoint written before data-parallel groups: one group.
    groups = 1;
    if (man.contains("data_parallel_groups")) {
      if (std::string why = manifest_int_problem(man, "data_parallel_groups", 1, 1 << 24); !why.empty())
        return mpath.string() + ": " + why;
      groups = man.at("data_parallel_groups").get<int>();
      if (static_cast<int64_t>(groups) * world > (1 << 24))
        return mpath.string() + ": " + std::to_string(groups) + " data_parallel_groups of world_size " +
               std::to_string(world) + " is more ranks than a job has";
    }
    if (!man.contains("files") || !man.at("files").is_array()) return mpath.string() + ": has no \"files\" list";
    const auto& files = man.at("files");
    if (static_cast<int64_t>(files.size()) != static_cast<int64_t>(world) * groups)
      return mpath.string() + (groups == 1 ? ": file list does not match world_size"
                                           : ": file list does not match world_size x data_parallel_groups");
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
  int world = 0, groups = 1;
  std::string why = manifest_read(dir, man, world, groups);
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

}  // namespace dtrain::train::ckpt
