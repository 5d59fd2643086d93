// Sharded checkpoint load: candidate order, verification (every data-parallel group's
// shards), resharding reads from the saved partition of the rank's own group (a checkpoint
// saved at any world size or ZeRO stage), and the masters of a checkpoint read one range at
// a time (CheckpointMasters).
#include "train/checkpoint.h"

#include "core/check.h"
#include "core/input_file.h"
#include "core/crc32c.h"
#include "core/log.h"
#include "train/checkpoint_files.h"

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

namespace dtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Why a shard file's header is not what the load reads (typed entries, has_rng, the
// group's AdamW step where recorded), or "".
std::string shard_head_problem(const json& h) {
  if (!h.is_object() || !h.contains("entries") || !h.at("entries").is_array()) return "has no \"entries\" list";
  for (const json& e : h.at("entries")) {
    if (!e.is_object() || !e.contains("kind") || !e.at("kind").is_string()) return "has an entry without a \"kind\"";
    for (const char* k : {"buffer", "lo", "count", "offset"})
      if (!e.contains(k) || !e.at(k).is_number_unsigned())
        return std::string("has an entry whose \"") + k + "\" is not a non-negative integer";
  }
  if (!h.contains("has_rng") || !h.at("has_rng").is_boolean()) return "has no \"has_rng\" flag";
  if (h.contains("optimizer_step") &&
      (!h.at("optimizer_step").is_number_integer() || h.at("optimizer_step").get<int64_t>() < 0))
    return "has an \"optimizer_step\" that is not a non-negative integer";
  return "";
}

// Why a shard's header says it is another shard than the manifest lists at its place (rank
// `rank` of group `group` of `groups`, world `world`), or "": a file copied in from another
// group or another checkpoint, whose CRC the manifest may even have recorded. The group
// fields are absent in a checkpoint written before data-parallel groups (group 0 of 1).
std::string shard_identity_problem(const json& h, int rank, int world, int group, int groups) {
  auto field = [&](const char* k, int64_t absent) -> int64_t {
    if (!h.contains(k)) return absent;
    return h.at(k).is_number_integer() ? h.at(k).get<int64_t>() : -1;
  };
  const int64_t r = field("rank", -1), w = field("world_size", -1), g = field("group", 0),
                n = field("data_parallel_groups", 1);
  if (r == rank && w == world && g == group && n == groups) return "";
  return fmt::format(
      "holds rank {} of {} in data-parallel group {} of {}, but the manifest lists it as rank {} of {} in group {} "
      "of {}: a shard file of another group or another checkpoint",
      r, w, g, n, rank, world, group, groups);
}

// One verified checkpoint: its manifest and, for the data-parallel group this rank loads,
// its open shard files with their entry tables. Files are indexed as the manifest lists
// them: group by group, rank by rank.
struct Opened {
  json manifest;
  int world = 0;                   // ranks per data-parallel group: the saved partition
  int groups = 1;                  // data-parallel groups the checkpoint holds
  int group = -1;                  // the group whose shards are open; -1: none (the job has another number of groups)
  std::vector<std::string> names;  // per file
  std::vector<ckpt::Fd> fds;       // per file; open for `group`'s only
  std::vector<json> heads;         // per file whose checksum was verified (null for the others)
  std::vector<uint64_t> data_start;
  // The file of rank q of the open group.
  size_t at(int q) const { return static_cast<size_t>(group) * static_cast<size_t>(world) + static_cast<size_t>(q); }
};

// The manifest's buffers against the shards' own entry tables (CRC-checked, where the
// manifest has no checksum): each rank's shard must hold its partition of every buffer
// (the master, and m and v of a trainable one) at the manifest's size, inside the file.
// A size the shards do not hold is a damaged manifest, and the load falls back to an older
// checkpoint, instead of comparing it with the model and blaming the config. "" or why.
std::string shard_layout_problem(const Opened& o) {
  const json& bufs = o.manifest.at("buffers");
  const json& files = o.manifest.at("files");
  for (size_t i = 0; i < o.heads.size(); ++i) {
    if (o.heads[i].is_null()) continue;  // not verified here: another group's, on another rank
    const int q = static_cast<int>(i % static_cast<size_t>(o.world));
    std::map<std::pair<uint64_t, std::string>, const json*> entry;
    for (const json& e : o.heads[i].at("entries"))
      entry[{e.at("buffer").get<uint64_t>(), e.at("kind").get<std::string>()}] = &e;
    const uint64_t bytes = files.at(i).at("bytes").get<uint64_t>();
    const uint64_t start = o.data_start[i];
    const std::string& shard = o.names[i];
    if (start > bytes) return shard + ": header past its end";
    const uint64_t data_bytes = bytes - start;
    for (size_t b = 0; b < bufs.size(); ++b) {
      const uint64_t n = bufs[b].at("size").get<uint64_t>();
      const ckpt::Part p = ckpt::part_of(static_cast<size_t>(n), o.world, q);
      std::vector<const char*> kinds{"master"};
      if (bufs[b].at("trainable").get<bool>()) kinds.insert(kinds.end(), {"m", "v"});
      for (const char* kind : kinds) {
        auto it = entry.find({b, kind});
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

// Verifies dir and opens the shards of data-parallel group `group` of `groups` (the job's):
// the manifest present and parsable, every file of every group present at its recorded
// size, and the CRC32C and header of the group's files (of every group's with verify_all).
// Returns "" or why it is unusable, naming the file. A checkpoint of another number of
// groups than `groups` is not damaged: nothing is opened (out.group == -1), and the caller
// says so once every rank agreed on it (checkpoint_read).
std::string checkpoint_open(const fs::path& dir, Opened& out, int group, int groups, bool verify_all) {
  const fs::path mpath = dir / "manifest.json";
  if (std::string why = ckpt::manifest_read(dir, out.manifest, out.world, out.groups); !why.empty()) return why;
  if (out.groups != groups) return "";
  out.group = group;
  try {
    const auto& files = out.manifest.at("files");
    for (size_t i = 0; i < files.size(); ++i) {
      const auto& f = files.at(i);
      const int g = static_cast<int>(i / static_cast<size_t>(out.world));
      const int q = static_cast<int>(i % static_cast<size_t>(out.world));
      out.names.push_back(f.at("name").get<std::string>());
      out.fds.emplace_back();
      out.heads.emplace_back();
      out.data_start.push_back(0);
      const fs::path p = dir / out.names.back();
      std::string unusable;
      InputFile in = input_file_try_open(p.string(), kInputAnySize, &unusable);
      if (!unusable.empty()) return p.string() + (unusable == "does not exist" ? ": missing" : ": " + unusable);
      ckpt::Fd fd(in.release());
      struct stat st {};
      if (::fstat(fd.fd, &st) != 0) return p.string() + ": cannot stat";
      const uint64_t want = f.at("bytes").get<uint64_t>();
      if (static_cast<uint64_t>(st.st_size) != want)
        return p.string() + ": truncated or extended (" + std::to_string(st.st_size) + " bytes, manifest says " +
               std::to_string(want) + ")";
      if (g != group && !verify_all) continue;  // another group's: its own ranks verify it
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
      if (::pread(fd.fd, magic, 8, 0) != 8 || std::memcmp(magic, ckpt::SHARD_MAGIC, 8) != 0 ||
          ::pread(fd.fd, &hl, 8, 8) != 8 || hl > static_cast<uint64_t>(st.st_size))
        return p.string() + ": not a dtrain shard file";
      std::string head(hl, '\0');
      if (::pread(fd.fd, head.data(), hl, 16) != static_cast<ssize_t>(hl)) return p.string() + ": short header";
      json h = json::parse(head);
      if (std::string why = shard_head_problem(h); !why.empty()) return p.string() + ": header " + why;
      if (std::string why = shard_identity_problem(h, q, out.world, g, out.groups); !why.empty())
        return p.string() + ": " + why;
      out.heads.back() = std::move(h);
      out.data_start.back() = 16 + hl;
      if (g == group) out.fds.back() = std::move(fd);
    }
    if (std::string why = shard_layout_problem(out); !why.empty()) return mpath.string() + ": " + why;
  } catch (const json::exception& e) {
    return mpath.string() + ": malformed (" + e.what() + ")";
  }
  return "";
}

// Reads elements [a, b) of (buffer, kind) from the open group's saved partition into dst.
void read_range(Opened& o, size_t buffer, const char* kind, size_t n, size_t a, size_t b, float* dst,
                const std::string& dir) {
  for (int q = 0; q < o.world && a < b; ++q) {
    const ckpt::Part p = ckpt::part_of(n, o.world, q);
    const size_t x = std::max(a, p.lo), y = std::min(b, p.hi);
    if (x >= y) continue;
    const size_t i = o.at(q);
    const json* entry = nullptr;
    for (const auto& e : o.heads[i].at("entries"))
      if (e.at("buffer").get<size_t>() == buffer && e.at("kind").get<std::string>() == kind) entry = &e;
    DT_ENFORCE(entry != nullptr, CheckpointError, "{}/{} has no {} slice of buffer {}", dir, o.names[i], kind, buffer);
    DT_ENFORCE(entry->at("lo").get<size_t>() == p.lo && entry->at("count").get<size_t>() == p.hi - p.lo,
               CheckpointError, "{}/{}: the {} slice of buffer {} does not follow the shard layout", dir, o.names[i],
               kind, buffer);
    const uint64_t off = o.data_start[i] + entry->at("offset").get<uint64_t>() + (x - p.lo) * sizeof(float);
    const size_t bytes = (y - x) * sizeof(float);
    const ssize_t r = ::pread(o.fds[i].fd, dst + (x - a), bytes, static_cast<off_t>(off));
    DT_ENFORCE(r == static_cast<ssize_t>(bytes), CheckpointError, "{}/{}: short read", dir, o.names[i]);
  }
}

// The view's rank_state from this rank's own shard (in its own group), when the checkpoint
// was saved at the same group size with the same state lengths; zeros (and a warning)
// otherwise.
void rank_state_read(Opened& o, const ZeroCheckpointView& view, const std::string& dir) {
  if (view.rank_state.empty()) return;
  std::vector<const json*> found(view.rank_state.size(), nullptr);
  const bool same_world = o.world == view.world && view.rank < o.world;
  if (same_world)
    for (const auto& e : o.heads[o.at(view.rank)].at("entries"))
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
  const size_t q = o.at(view.rank);
  for (size_t i = 0; i < found.size(); ++i) {
    const size_t bytes = view.rank_state[i].second * sizeof(float);
    const uint64_t off = o.data_start[q] + found[i]->at("offset").get<uint64_t>();
    const ssize_t r = ::pread(o.fds[q].fd, view.rank_state[i].first, bytes, static_cast<off_t>(off));
    DT_ENFORCE(r == static_cast<ssize_t>(bytes), CheckpointError, "{}/{}: short read", dir, o.names[q]);
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

// ConfigError when the saved buffers (typed by ckpt::manifest_state_problem) are not the
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
      const int64_t k = ckpt::step_of(e.path().filename().string());
      std::error_code entry_ec;  // a step<N> that is a link loop is no checkpoint, not a crash
      if (k >= 0 && e.is_directory(entry_ec)) steps.emplace_back(k, e.path());
    }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string unreadable;
  latest = ckpt::read_text((root / "latest").string(), ckpt::kLatestMaxBytes, &unreadable);
  // A `latest` that cannot be read names no checkpoint: the complete ones are tried newest
  // first, and the reason is kept.
  if (!unreadable.empty()) res.skipped.push_back((root / "latest").string() + ": " + unreadable);
  while (!latest.empty() && std::isspace(static_cast<unsigned char>(latest.back()))) latest.pop_back();
  std::vector<fs::path> candidates;
  int64_t limit = INT64_MAX;
  if (!latest.empty()) {
    candidates.push_back(root / latest);
    limit = ckpt::step_of(latest);
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

// When dir failed verification on any rank of the job (every rank, of every data-parallel
// group, must pick the same checkpoint): records why in res (setting dir aside when rank
// 0, which verifies every group's shards, saw the damage itself) and returns true.
bool candidate_refused(const fs::path& dir, std::string why, const ckpt::GroupPlace& place, bool set_aside_damaged,
                       CheckpointLoadResult& res) {
  std::error_code ec;
  float bad = why.empty() ? 0.0f : 1.0f;
  if (place.comm) place.comm->allreduce_host(&bad, 1, DType::F32, comm::ReduceOp::MAX);
  if (bad == 0.0f) return false;
  // Only damage rank 0 saw itself sets the checkpoint aside: another rank's failure
  // may be its own passing trouble (a mount, a cached stat) on a good checkpoint.
  const bool own = !why.empty();
  if (why.empty()) why = dir.string() + ": unusable on another rank";
  // Set aside once every rank has looked (the allreduce above), so no rank still
  // reads it; a later save then neither counts it for keep_last nor keeps it instead
  // of the checkpoint we fall back to.
  std::string aside;
  if (set_aside_damaged && own && place.rank == 0 && fs::is_directory(dir, ec)) aside = ckpt::checkpoint_set_aside(dir);
  if (!aside.empty()) why += " (set aside as " + fs::path(aside).filename().string() + ")";
  log_warn("checkpoint {} is unusable: {}; falling back to the previous complete checkpoint", dir.string(), why);
  res.skipped.push_back(why);
  return true;
}

// ConfigError when the checkpoint holds another number of data-parallel groups than the
// job loading it (o.group == -1, checkpoint_open): every group resumes from its own
// group's shards, so none may take another's, nor one group's state be copied into several.
// Every retry would meet it again: a config error (exit 2), not a damaged checkpoint.
void groups_check(const Opened& o, int groups, const std::string& dir) {
  if (o.group >= 0) return;
  auto said = [](int n) {
    return n == 1 ? std::string("one data-parallel group") : fmt::format("{} data-parallel groups", n);
  };
  const json& files = o.manifest.at("files");
  const std::string first = files.empty() ? "" : files.front().at("name").get<std::string>();
  const std::string last = files.empty() ? "" : files.back().at("name").get<std::string>();
  DT_THROW(ConfigError,
           "{}/manifest.json: the checkpoint holds the shards of {} of {} rank(s) ({} .. {}) but is loaded by {}: "
           "each group resumes only from its own shards; resume with {} (of any number of ranks: the shards are "
           "resliced within each group), or start a new run with --output-dir",
           dir, said(o.groups), o.world, first, last, said(groups), said(o.groups));
}

// Every view's master (and the trainable ones' m and v) from a verified checkpoint (its
// own data-parallel group's shards), this rank's state, and the trainer state into res.
void checkpoint_read(Opened& o, const fs::path& dir, const ZeroCheckpointView& view, int groups,
                     CheckpointLoadResult& res) {
  const std::string d = dir.string();
  const json& man = o.manifest;
  groups_check(o, groups, d);
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
  // The group's own AdamW step (its shards record it; a checkpoint before groups: the
  // manifest's, which is rank 0's).
  const json& head0 = o.heads[o.at(0)];
  view.loaded(head0.contains("optimizer_step") ? head0.at("optimizer_step").get<int64_t>()
                                               : man.at("optimizer_step").get<int64_t>());

  TrainState& st = res.state;
  state_from_manifest(man, st);
  if (view.rank < o.world) {
    const json& h = o.heads[o.at(view.rank)];
    st.has_rng = h.at("has_rng").get<bool>();
    st.rng = h.at("rng").get<Rng::State>();
  }
  res.loaded = true;
  res.dir = d;
  res.saved_world_size = o.world;
  res.saved_stage = man.at("zero_stage").get<int>();
}

// `latest` must not keep naming a checkpoint that was set aside: status and the next
// save's "already saved" test read it. Every rank read it before the load's allreduces,
// so rank 0 may switch it now to dir, the one loaded.
void latest_repoint(const std::string& run_dir, const fs::path& root, const fs::path& dir) {
  const std::string name = dir.filename().string();
  const std::string lt = (root / "latest.tmp").string();
  // checkpoints/ has the bits the saves gave it (bounded by training.run_dir_mode).
  ckpt::file_write(lt, {{name.data(), name.size()}}, ckpt::run_dir_mode(run_dir) & ckpt::run_dir_mode(root.string()));
  ckpt::rename_durable(lt, (root / "latest").string());
}

}  // namespace

std::string checkpoint_problem(const std::string& dir) { return ckpt::checkpoint_check_sizes(fs::path(dir)); }

CheckpointLoadResult checkpoint_load(const std::string& run_dir, const ZeroCheckpointView& view,
                                     bool set_aside_damaged) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  CheckpointLoadResult res;
  std::error_code ec;
  // Collective over the whole job: every data-parallel group agrees on one checkpoint.
  const ckpt::GroupPlace place = ckpt::group_place(view.world_comm, view.comm, view.rank, view.world);

  std::string latest;
  const std::vector<fs::path> candidates = load_candidates(root, res, latest);
  if (candidates.empty()) {
    DT_ENFORCE(res.skipped.empty() || !set_aside_damaged, CheckpointError, "no usable checkpoint under {}: {}",
               root.string(), res.skipped.front());
    return res;
  }

  for (const auto& dir : candidates) {
    Opened o;
    // Rank 0 verifies every group's shards, so that it sees (and sets aside) damage in any.
    const std::string why = checkpoint_open(dir, o, place.group, place.groups, place.rank == 0);
    if (candidate_refused(dir, why, place, set_aside_damaged, res)) continue;
    checkpoint_read(o, dir, view, place.groups, res);
    if (!res.skipped.empty()) {
      log_warn("resumed from {} after skipping {} damaged checkpoint(s)", dir.string(), res.skipped.size());
      if (set_aside_damaged && place.rank == 0 && !fs::exists(candidates.front(), ec) && !latest.empty() &&
          latest != dir.filename().string())
        latest_repoint(run_dir, root, dir);
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
    // One process reads one model: a checkpoint of several data-parallel groups holds one
    // state per group, and none of them is the model (groups_check says so).
    const std::string why = checkpoint_open(dir, o, 0, 1, true);
    if (!why.empty()) {
      im.result.skipped.push_back(why);
      continue;
    }
    groups_check(o, 1, dir.string());
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
