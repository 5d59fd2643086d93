// The Hugging Face export: save_pretrained's shard plan and index, tensors converted one
// at a time while each safetensors file is written, config.json / adapter / merged model /
// tokenizer files, all in a staging directory renamed into place when complete.
#include "train/hf_export.h"

#include "core/check.h"
#include "core/output_path.h"
#include "device/device.h"
#include "model/peft.h"
#include "model/safetensors.h"
#include "train/model_factory.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

namespace dtrain::train {

namespace fs = std::filesystem;

// ----------------------------------------------------------------------------
bool hf_export_dtype_parse(const std::string& s, DType* out) {
  if (s == "bf16") *out = DType::BF16;
  else if (s == "fp32") *out = DType::F32;
  else return false;
  return true;
}

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const config::TrainConfig& cfg) {
  static const char* kNames[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                 "generation_config.json", "tokenizer.model"};
  std::vector<std::pair<std::string, std::string>> out;
  auto from_dir = [&](const fs::path& d) {
    std::error_code ec;
    for (const char* n : kNames)
      if (fs::is_regular_file(d / n, ec)) out.emplace_back((d / n).string(), n);
  };
  if (!cfg.model.init_from.empty()) from_dir(cfg.model.init_from);
  if (!out.empty()) return out;
  const std::string& tok = cfg.data.tokenizer;
  std::error_code ec;
  if (tok.empty() || tok == "byte") return out;
  if (fs::is_directory(tok, ec)) from_dir(tok);
  else if (fs::is_regular_file(tok, ec)) out.emplace_back(tok, "tokenizer.json");
  return out;
}

HfExportOptions hf_export_options(const config::TrainConfig& cfg) {
  HfExportOptions o;
  DT_ENFORCE(hf_export_dtype_parse(cfg.hf_export.dtype, &o.dtype), ConfigError,
             "{}: export.dtype: '{}' is not bf16 or fp32", cfg.source, cfg.hf_export.dtype);
  const auto size = config::byte_size_parse(cfg.hf_export.max_shard_size);
  DT_ENFORCE(size.has_value(), ConfigError,
             "{}: export.max_shard_size: '{}' is not a size; give bytes or a number with KB, MB, GB, TB (powers of "
             "1000) or KiB, MiB, GiB, TiB, e.g. 5GB",
             cfg.source, cfg.hf_export.max_shard_size);
  o.max_shard_size = *size;
  o.merge_lora = cfg.hf_export.merge_lora;
  o.extra_files = hf_tokenizer_files(cfg);
  return o;
}

HfExportOptions hf_export_options(const config::TrainConfig& cfg, const HfExportFlags& flags) {
  HfExportOptions o = hf_export_options(cfg);
  if (!flags.dtype.empty())
    DT_ENFORCE(hf_export_dtype_parse(flags.dtype, &o.dtype), UsageError, "--dtype {}: give bf16 or fp32", flags.dtype);
  if (!flags.max_shard_size.empty()) {
    const auto size = config::byte_size_parse(flags.max_shard_size);
    DT_ENFORCE(size.has_value(), UsageError,
               "--max-shard-size {}: not a size; give bytes or a number with KB, MB, GB, TB (powers of 1000) or KiB, "
               "MiB, GiB, TiB, e.g. 5GB or 500MB",
               flags.max_shard_size);
    o.max_shard_size = *size;
  }
  if (flags.merge_lora) o.merge_lora = true;
  o.into_dir = flags.into_dir;
  return o;
}

ShardPlan shard_plan(const std::vector<uint64_t>& bytes, uint64_t max_shard_size) {
  ShardPlan p;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    p.total_size += bytes[i];
    if (bytes[i] > max_shard_size) {
      p.shards.push_back({i});
      continue;
    }
    if (current_size + bytes[i] > max_shard_size) {
      p.shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += bytes[i];
  }
  if (!current.empty()) p.shards.push_back(std::move(current));
  return p;
}

HfExportSource hf_export_source(const model::Model& m) {
  HfExportSource s;
  s.config = m.config();
  std::vector<const model::ParamBuffer*> bufs;
  for (const auto& pb : m.params()) {
    s.base.push_back(pb.layout);
    bufs.push_back(&pb);
  }
  if (m.lora_on()) {
    s.lora_config = m.lora_config();
    for (const auto& pb : m.lora_params()) {
      s.lora.push_back(pb.layout);
      bufs.push_back(&pb);
    }
  }
  s.read = [bufs](size_t b, size_t lo, size_t hi, float* dst) {
    DT_CHECK(b < bufs.size() && lo <= hi && hi <= bufs[b]->size);
    const float* src = bufs[b]->host_f32();
    std::copy(src + lo, src + hi, dst);
  };
  return s;
}

// ----------------------------------------------------------------------------
namespace {

// One tensor of the export: where it lies and its shape in the file.
struct ExportTensor {
  size_t buffer;
  const model::TensorSpec* spec;
  std::vector<int64_t> hf_shape;
};

// The tensors in the order transformers' state_dict lists them (the order save_pretrained
// fills its shards in): the layout's order, except that a Llama-family decoder layer
// registers its two norms after self_attn and mlp.
std::vector<ExportTensor> export_order(const HfExportSource& src) {
  std::vector<ExportTensor> out;
  const bool gpt2 = src.config.is_gpt2();
  auto norm_last = [&](const model::TensorSpec& t) {
    return !gpt2 &&
           (t.name.ends_with(".input_layernorm.weight") || t.name.ends_with(".post_attention_layernorm.weight"));
  };
  for (size_t b = 0; b < src.base.size(); ++b) {
    std::vector<const model::TensorSpec*> ts;
    for (const auto& t : src.base[b].tensors) ts.push_back(&t);
    std::stable_partition(ts.begin(), ts.end(), [&](const model::TensorSpec* t) { return !norm_last(*t); });
    for (const model::TensorSpec* t : ts) {
      std::vector<int64_t> shape = t->shape;
      if (t->hf_transposed) std::reverse(shape.begin(), shape.end());
      out.push_back({b, t, shape});
    }
  }
  return out;
}

// Fills the fp32 values of one tensor in HF layout: read, merged with its adapter when
// asked, transposed for a Conv1D weight. `scratch` is reused across tensors.
class TensorFiller {
 public:
  TensorFiller(const HfExportSource& src, bool merge) : src_(src) {
    if (!merge) return;
    for (size_t lb = 0; lb < src.lora.size(); ++lb)
      for (const auto& t : src.lora[lb].tensors) lora_[t.name] = {src.base.size() + lb, &t};
  }

  void fill(const ExportTensor& e, DType dtype, void* dst) {
    const model::TensorSpec& t = *e.spec;
    const size_t n = t.numel();
    values_.resize(n);
    src_.read(e.buffer, t.offset, t.offset + n, values_.data());
    merge(t);
    const float* v = values_.data();
    if (t.hf_transposed) {
      const int64_t rows = t.shape[0], cols = t.shape[1];  // ours [rows, cols] = HF [cols, rows]
      transposed_.resize(n);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) transposed_[static_cast<size_t>(j * rows + i)] = v[i * cols + j];
      v = transposed_.data();
    }
    if (dtype == DType::F32) {
      std::memcpy(dst, v, n * sizeof(float));
    } else {
      auto* out = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(v[i]);
    }
  }

 private:
  // W += scale * B A when this weight has an adapter (PEFT's merge_and_unload).
  void merge(const model::TensorSpec& t) {
    if (lora_.empty() || !t.name.ends_with(".weight")) return;
    const std::string module = t.name.substr(0, t.name.size() - 7);
    const auto a = lora_.find(model::lora_tensor_name(module, false));
    const auto b = lora_.find(model::lora_tensor_name(module, true));
    if (a == lora_.end() || b == lora_.end()) return;
    const model::TensorSpec &ta = *a->second.second, &tb = *b->second.second;
    a_.resize(ta.numel());
    b_.resize(tb.numel());
    src_.read(a->second.first, ta.offset, ta.offset + ta.numel(), a_.data());
    src_.read(b->second.first, tb.offset, tb.offset + tb.numel(), b_.data());
    DT_CHECK(t.shape.size() == 2 && tb.shape[0] == t.shape[0] && ta.shape[1] == t.shape[1]);
    model::lora_merge_weight(device::cpu(), values_.data(), a_.data(), b_.data(), static_cast<int>(t.shape[0]),
                             static_cast<int>(t.shape[1]), src_.lora_config);
  }

  const HfExportSource& src_;
  std::unordered_map<std::string, std::pair<size_t, const model::TensorSpec*>> lora_;
  std::vector<float> values_, transposed_, a_, b_;
};

void text_write(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    DT_ENFORCE(out.good(), IoError, "cannot write {}", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  DT_ENFORCE(!ec, IoError, "cannot write {}: {}", path.string(), ec.message());
}

// The weights of a full model into dir: one file, or shards + index.
void weights_write(const fs::path& dir, const std::vector<ExportTensor>& tensors, TensorFiller& filler,
                   const HfExportOptions& opts) {
  std::vector<uint64_t> bytes;
  for (const auto& e : tensors) bytes.push_back(e.spec->numel() * dtype_size(opts.dtype));
  const ShardPlan plan = shard_plan(bytes, opts.max_shard_size);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < plan.shards.size(); ++k) {
    const std::string file = plan.shards.size() == 1
                                 ? "model.safetensors"
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, plan.shards.size());
    std::vector<model::StTensorSource> sources;
    for (size_t i : plan.shards[k]) {
      const ExportTensor& e = tensors[i];
      sources.push_back({e.spec->name, opts.dtype, e.hf_shape,
                         [&filler, &e, dt = opts.dtype](void* dst) { filler.fill(e, dt, dst); }});
      weight_map[e.spec->name] = file;
    }
    model::safetensors_write_stream((dir / file).string(), sources, {{"format", "pt"}});
  }
  if (plan.shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", plan.total_size}}}, {"weight_map", weight_map}};
    text_write(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }
}

// A full HF model directory (weights, config.json, extra files) in dir.
void model_dir_write(const HfExportSource& src, const fs::path& dir, const HfExportOptions& opts, bool merge) {
  TensorFiller filler(src, merge);
  weights_write(dir, export_order(src), filler, opts);
  model::HfModelConfig h = model_hf_config(src.config);
  h.bos_token_id = opts.bos_id;
  h.eos_token_id = opts.eos_id;
  h.torch_dtype = opts.dtype == DType::BF16 ? "bfloat16" : "float32";
  model::hf_config_write((dir / "config.json").string(), h);
  for (const auto& [from, name] : opts.extra_files) {
    std::error_code ec;
    fs::copy_file(from, dir / name, fs::copy_options::overwrite_existing, ec);
    DT_ENFORCE(!ec, IoError, "cannot copy {} into {}: {}", from, dir.string(), ec.message());
  }
}

void adapter_write(const HfExportSource& src, const fs::path& dir) {
  std::vector<model::StTensorSource> sources;
  std::vector<float> values;
  for (size_t lb = 0; lb < src.lora.size(); ++lb)
    for (const auto& t : src.lora[lb].tensors)
      sources.push_back({t.name, DType::F32, t.shape, [&src, &values, &t, b = src.base.size() + lb](void* dst) {
                           values.resize(t.numel());
                           src.read(b, t.offset, t.offset + t.numel(), values.data());
                           std::memcpy(dst, values.data(), values.size() * sizeof(float));
                         }});
  model::safetensors_write_stream((dir / "adapter_model.safetensors").string(), sources, {{"format", "pt"}});
  model::LoraAdapterConfig a;
  const auto& l = src.lora_config;
  a.r = l.rank;
  a.lora_alpha = l.alpha;
  a.lora_dropout = l.dropout;
  a.target_modules = l.targets;
  a.fan_in_fan_out = src.config.is_gpt2();
  a.base_model_name_or_path = ".";
  model::peft_config_write((dir / "adapter_config.json").string(), a);
}

}  // namespace

bool hf_export_owned_name(const std::string& n) {
  static const std::set<std::string> kOwned = {"model.safetensors",
                                               "model.safetensors.index.json",
                                               "config.json",
                                               "adapter_model.safetensors",
                                               "adapter_config.json",
                                               "merged",
                                               "tokenizer.json",
                                               "tokenizer_config.json",
                                               "special_tokens_map.json",
                                               "generation_config.json",
                                               "tokenizer.model",
                                               kHfExportMarker};
  return kOwned.count(n) != 0 || (n.starts_with("model-") && n.ends_with(".safetensors"));
}

namespace {

// "<name>.partial-<pid>" of a process that is gone: an interrupted export's staging.
bool stale_partial(const std::string& entry, const std::string& name) {
  const std::string prefix = name + ".partial-";
  if (!entry.starts_with(prefix) || entry.size() == prefix.size()) return false;
  const std::string pid = entry.substr(prefix.size());
  if (pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) return false;
  return ::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH;
}

void fsync_dir(const fs::path& d) {
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Replaces dir by the complete staging directory: dir is renamed aside, staging renamed
// to dir, the files of the old one that the export does not own moved in, the old one
// removed. No moment shows a directory with part of an export in it, and a foreign file
// is always in dir or in the old one (named in the error).
void dir_publish(const fs::path& staging, const fs::path& dir) {
  std::error_code ec;
  fsync_dir(staging);
  if (!fs::exists(dir, ec)) {
    fs::rename(staging, dir, ec);
    DT_ENFORCE(!ec, IoError, "cannot rename {} to {}: {}", staging.string(), dir.string(), ec.message());
    fsync_dir(dir.parent_path());
    return;
  }
  DT_ENFORCE(fs::is_directory(dir, ec), IoError, "{} exists and is not a directory: choose another output directory",
             dir.string());
  const fs::path old = dir.parent_path() / (dir.filename().string() + ".old-" + std::to_string(::getpid()));
  fs::remove_all(old, ec);
  fs::rename(dir, old, ec);
  DT_ENFORCE(!ec, IoError, "cannot rename {} aside to {}: {}", dir.string(), old.string(), ec.message());
  fs::rename(staging, dir, ec);
  if (ec) {
    std::error_code back;
    fs::rename(old, dir, back);
    DT_THROW(IoError, "cannot rename {} to {}: {}", staging.string(), dir.string(), ec.message());
  }
  fsync_dir(dir.parent_path());
  for (const auto& e : fs::directory_iterator(old, ec)) {
    const std::string n = e.path().filename().string();
    if (hf_export_owned_name(n) || fs::exists(dir / n)) continue;
    std::error_code mv;
    fs::rename(e.path(), dir / n, mv);
    DT_ENFORCE(!mv, IoError, "cannot move {} into the new export {}: {} (the old export's other files are in {})",
               e.path().string(), dir.string(), mv.message(), old.string());
  }
  fs::remove_all(old, ec);
}

// The export's entries in its staging directory, written there by stage().
void stage(const HfExportSource& src, const fs::path& staging, const HfExportOptions& opts) {
  std::error_code ec;
  model_dir_write(src, staging, opts, false);
  if (!src.lora.empty()) {
    adapter_write(src, staging);
    if (opts.merge_lora) {
      fs::create_directories(staging / "merged", ec);
      DT_ENFORCE(!ec, IoError, "cannot create {}: {}", (staging / "merged").string(), ec.message());
      model_dir_write(src, staging / "merged", opts, true);
      fsync_dir(staging / "merged");
    }
  }
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The export command's way into a user's directory (core/output_path.h): dir itself is
// never renamed, re-created or chmodded. The export is staged in dir/.dtrain-export.json.partial-
// <pid>; the marker, listing the old and the new entries, says "incomplete" while the staged
// entries are renamed over their namesakes; the old export's entries the new one lacks
// (shards of another plan) are removed; the marker then lists the new entries, complete.
// An interrupted export leaves a directory the next export still recognises as its own.
void export_into(const HfExportSource& src, const fs::path& dir, const HfExportOptions& opts) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    DT_ENFORCE(!ec, IoError, "cannot create {}: {}", dir.string(), ec.message());
  }
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (stale_partial(e.path().filename().string(), kHfExportMarker)) fs::remove_all(e.path(), ec);
  const fs::path staging = dir / (std::string(kHfExportMarker) + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(staging, ec);
  fs::create_directory(staging, ec);
  DT_ENFORCE(!ec, IoError, "cannot create {}: {}", staging.string(), ec.message());
  try {
    stage(src, staging, opts);
    fsync_dir(staging);
    bool marked = false;
    std::vector<std::string> old = output_dir_marker_files(dir.string(), kHfExportMarker, kHfExportKind, &marked);
    if (!marked)  // an older dtrain's export (the default RUN_DIR/export) or an empty directory
      for (const auto& n : entries(dir))
        if (hf_export_owned_name(n)) old.push_back(n);
    const std::vector<std::string> fresh = entries(staging);
    std::vector<std::string> both = old;
    for (const auto& n : fresh)
      if (std::find(both.begin(), both.end(), n) == both.end()) both.push_back(n);
    text_write(dir / kHfExportMarker, output_dir_marker_text(kHfExportKind, both, false));
    for (const auto& n : fresh) {
      // A directory entry (merged/) cannot be renamed over a non-empty one: the old goes first.
      if (fs::is_directory(staging / n, ec) && fs::is_directory(dir / n, ec)) fs::remove_all(dir / n, ec);
      fs::rename(staging / n, dir / n, ec);
      DT_ENFORCE(!ec, IoError, "cannot move {} into {}: {}", (staging / n).string(), dir.string(), ec.message());
    }
    for (const auto& n : old)
      if (std::find(fresh.begin(), fresh.end(), n) == fresh.end() && n != kHfExportMarker) fs::remove_all(dir / n, ec);
    text_write(dir / kHfExportMarker, output_dir_marker_text(kHfExportKind, fresh, true));
    fs::remove_all(staging, ec);
    fsync_dir(dir);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

}  // namespace

// ----------------------------------------------------------------------------
void hf_export_write(const HfExportSource& src, const std::string& dir_in, const HfExportOptions& opts) {
  DT_ENFORCE(opts.dtype == DType::F32 || opts.dtype == DType::BF16, UsageError,
             "export dtype {}: only bf16 and fp32 are written", dtype_name(opts.dtype));
  DT_ENFORCE(opts.max_shard_size > 0, UsageError, "export max_shard_size must be positive");
  fs::path dir = fs::absolute(fs::path(dir_in)).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  if (opts.into_dir) return export_into(src, dir, opts);
  const fs::path parent = dir.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  DT_ENFORCE(!ec, IoError, "cannot create {}: {}", parent.string(), ec.message());
  const std::string name = dir.filename().string();
  for (const auto& e : fs::directory_iterator(parent, ec))
    if (stale_partial(e.path().filename().string(), name)) fs::remove_all(e.path(), ec);
  const fs::path staging = parent / (name + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  DT_ENFORCE(!ec, IoError, "cannot create {}: {}", staging.string(), ec.message());
  try {
    stage(src, staging, opts);
    text_write(staging / kHfExportMarker, output_dir_marker_text(kHfExportKind, entries(staging), true));
    dir_publish(staging, dir);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

void model_export_hf(const model::Model& m, const std::string& dir, const HfExportOptions& opts) {
  hf_export_write(hf_export_source(m), dir, opts);
}

void model_export_hf(model::Model& m, const std::string& dir, int bos_id, int eos_id) {
  HfExportOptions o;
  o.dtype = DType::F32;
  o.bos_id = bos_id;
  o.eos_id = eos_id;
  model_export_hf(m, dir, o);
}

}  // namespace dtrain::train
