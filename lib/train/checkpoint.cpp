// Sharded checkpoint save: shards (every data-parallel group's), CRC exchange, manifest,
// renames, pruning (checkpoint_load.cpp loads; checkpoint_files.cpp holds the format's
// shared parts). A checkpoint that fails verification is set aside (renamed
// stepK.corrupt-<time>), never deleted and never counted by keep_last.
#include "train/checkpoint.h"

#include "core/check.h"
#include "core/log.h"
#include "train/checkpoint_files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>
#include <vector>

namespace dtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Float pairs carry 32-bit values exactly through an fp32 all-gather.
void u32_to_f2(uint32_t x, float* out) {
  out[0] = static_cast<float>(x & 0xffffu);
  out[1] = static_cast<float>(x >> 16);
}
uint32_t f2_to_u32(const float* in) { return static_cast<uint32_t>(in[0]) | (static_cast<uint32_t>(in[1]) << 16); }

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
// header saying where each lies and whose shard it is (group, rank, the group's AdamW step).
ShardWritten write_shard(const fs::path& tmp, const ZeroCheckpointView& view, const ckpt::GroupPlace& place,
                         const TrainState& state, mode_t mode) {
  const int W = view.world, rank = view.rank;
  const auto& views = view.buffers;
  json entries = json::array();
  std::vector<std::pair<const void*, size_t>> data;
  size_t offset = 0;
  for (size_t b = 0; b < views.size(); ++b) {
    const auto& v = views[b];
    const ckpt::Part p = ckpt::part_of(v.buffer->size, W, rank);
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
  json head{{"format", ckpt::FORMAT_VERSION},
            {"rank", rank},
            {"world_size", W},
            {"group", place.group},
            {"data_parallel_groups", place.groups},
            {"optimizer_step", view.step_count},
            {"step", state.step},
            {"has_rng", state.has_rng},
            {"rng", state.rng},
            {"forward_count", state.forward_count},
            {"entries", entries}};
  const std::string head_text = head.dump();
  const uint64_t head_len = head_text.size();
  std::vector<std::pair<const void*, size_t>> parts{{ckpt::SHARD_MAGIC, 8},
                                                    {&head_len, 8},
                                                    {head_text.data(), head_len}};
  parts.insert(parts.end(), data.begin(), data.end());
  const uint32_t crc =
      ckpt::file_write((tmp / ckpt::shard_name(place.group, place.groups, rank)).string(), parts, mode);
  return {crc, 16 + head_len + offset};
}

// Every rank of the job confirms its shard (size, CRC, whose it is) to every other;
// returns the manifest's "files", group by group, rank by rank (on every rank; rank 0 of
// place.comm writes it). W: one data-parallel group's size.
json confirm_shards(const ckpt::GroupPlace& place, int W, int rank, const ShardWritten& mine_written) {
  constexpr size_t k = 8;
  const int n = W * place.groups;  // the ranks of place.comm
  std::vector<float> mine(k), all(static_cast<size_t>(n) * k);
  u32_to_f2(mine_written.crc, mine.data());
  u32_to_f2(static_cast<uint32_t>(mine_written.bytes & 0xffffffffu), mine.data() + 2);
  u32_to_f2(static_cast<uint32_t>(mine_written.bytes >> 32), mine.data() + 4);
  u32_to_f2(static_cast<uint32_t>(place.group * W + rank), mine.data() + 6);
  if (place.comm) place.comm->all_gather_host(mine.data(), all.data(), k, DType::F32);
  else all = mine;
  std::vector<json> files(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    const float* f = all.data() + static_cast<size_t>(q) * k;
    const uint64_t sz = static_cast<uint64_t>(f2_to_u32(f + 2)) | (static_cast<uint64_t>(f2_to_u32(f + 4)) << 32);
    const uint32_t at = f2_to_u32(f + 6);
    DT_CHECK(at < static_cast<uint32_t>(n) && files[at].is_null());
    const int g = static_cast<int>(at) / W, r = static_cast<int>(at) % W;
    files[at] = {{"name", ckpt::shard_name(g, place.groups, r)}, {"bytes", sz}, {"crc32c", f2_to_u32(f)}};
  }
  return json(files);
}

json manifest_json(const ZeroCheckpointView& view, int groups, const TrainState& state, const json& files) {
  json scaler = nullptr;
  if (state.has_scaler)
    scaler = {{"scale", state.scaler.scale},
              {"cur_iter", state.scaler.cur_iter},
              {"last_overflow_iter", state.scaler.last_overflow_iter},
              {"cur_hysteresis", state.scaler.cur_hysteresis}};
  return json{{"format", ckpt::FORMAT_VERSION},
              {"step", state.step},
              {"world_size", view.world},
              {"data_parallel_groups", groups},
              {"zero_stage", view.stage},
              {"compute_dtype", dtype_name(view.compute_dtype)},
              {"master_dtype", "float32"},
              {"optimizer_step", view.step_count},
              {"scheduler_step", state.scheduler_step},
              {"loss_scaler", scaler},
              {"sampler", {{"epoch", state.sampler.epoch}, {"offset", state.sampler.offset}}},
              {"forward_count", state.forward_count},
              {"shard_layout", groups == 1 ? "buffer of n elements: rank r holds [r*ceil(n/W), min((r+1)*ceil(n/W), n))"
                                           : "buffer of n elements: rank r of each data-parallel group g holds "
                                             "[r*ceil(n/W), min((r+1)*ceil(n/W), n)) of that group's state, in "
                                             "group<g>-rank<r>.bin (W = world_size, the ranks of one group)"},
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
    if (ckpt::partial_name(n)) {  // an earlier save that did not complete
      if (e.is_directory(ec)) fs::remove_all(e.path(), ec);
      continue;
    }
    const int64_t k = ckpt::step_of(n);
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
    const std::string why = ckpt::checkpoint_check_sizes(dir);
    if (!why.empty()) {
      const std::string to = ckpt::checkpoint_set_aside(dir);
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
  // Every collective below runs over the whole job, every data-parallel group in it.
  const ckpt::GroupPlace place = ckpt::group_place(view.world_comm, view.comm, view.rank, view.world);
  comm::Communicator* comm = place.comm;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = "step" + std::to_string(state.step);
  const fs::path tmp = root / ("tmp-" + name), final_dir = root / name;
  const std::string latest_now = ckpt::read_text((root / "latest").string(), ckpt::kLatestMaxBytes);
  // The same step is already the confirmed checkpoint (a save right after resuming),
  // unless that checkpoint is damaged or was set aside: then it is written again. Every
  // rank sees the same files, so every rank decides the same.
  if (latest_now == name && ckpt::checkpoint_check_sizes(final_dir).empty()) {
    if (comm) comm->barrier();
    return final_dir.string();
  }
  const mode_t mode = ckpt::run_dir_mode(run_dir) & (opts.max_mode & 0777);
  if (place.rank == 0) prepare_save_dir(root, tmp, final_dir, mode);
  if (comm) comm->barrier();

  const ShardWritten shard = write_shard(tmp, view, place, state, mode);
  if (opts.fault_hook) opts.fault_hook("shard_written");
  const json files = confirm_shards(place, view.world, view.rank, shard);

  if (place.rank == 0) {
    const std::string text = manifest_json(view, place.groups, state, files).dump(1);
    ckpt::file_write((tmp / "manifest.json").string(), {{text.data(), text.size()}}, mode);
    ckpt::fsync_path(tmp.string());
    ckpt::rename_durable(tmp.string(), final_dir.string());
    if (opts.fault_hook) opts.fault_hook("renamed");
    const std::string lt = (root / "latest.tmp").string();
    ckpt::file_write(lt, {{name.data(), name.size()}}, mode);
    ckpt::rename_durable(lt, (root / "latest").string());
    prune_checkpoints(root, name, state.step, opts.keep_last);
  }
  if (comm) comm->barrier();
  return final_dir.string();
}

}  // namespace dtrain::train
