// Builds the native model from a TrainConfig, imports Hugging Face weights (config.json,
// safetensors, PEFT adapters) and exports the trained model in the same formats.
#include "train/model_factory.h"

#include "core/check.h"
#include "core/input_file.h"
#include "core/log.h"
#include "model/peft.h"
#include "model/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

namespace dtrain::train {

namespace fs = std::filesystem;

// ----------------------------------------------------------------------------
namespace {

// A model whose fp32 weights and gradients (what the Model allocates when it is built)
// exceed this host's memory cannot train here: a ConfigError naming the sizes, instead of
// std::bad_alloc (exit 1, retried) or the OOM killer.
void model_memory_check(const model::ModelConfig& m, const std::string& source) {
  size_t params = 0;
  for (const auto& b : model::layout_build(m)) params += b.size;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;  // unknown: let the allocation decide
  const double host = static_cast<double>(pages) * static_cast<double>(page);
  const double need = 8.0 * static_cast<double>(params);
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  DT_ENFORCE(need <= host, ConfigError,
             "{}: the model (d_model {}, {} layers, d_ff {}, vocab {}) has {} parameters; its fp32 weights and "
             "gradients alone need {:.1f} GiB, more than this host's {:.1f} GiB of memory: choose a smaller model",
             source, m.d_model, m.n_layer, m.d_ff, m.vocab_size, params, need / GiB, host / GiB);
}

model::ModelConfig::Arch arch_parse(const std::string& s, const std::string& where) {
  model::ModelConfig::Arch a{};
  if (model::arch_parse(s, &a)) return a;
  DT_THROW(ConfigError, "{}: unknown architecture '{}' (use gpt2, llama, qwen2, qwen3 or mistral)", where, s);
}

model::ModelConfig from_hf(const model::HfModelConfig& h) {
  model::ModelConfig m;
  m.arch = arch_parse(h.arch, "config.json model_type");
  m.vocab_size = h.vocab_size;
  m.max_seq_len = h.max_seq_len;
  m.n_layer = h.n_layer;
  m.n_head = h.n_head;
  m.n_kv_head = h.n_kv_head;
  m.d_model = h.d_model;
  m.d_ff = h.d_ff;
  m.norm_eps = h.norm_eps;
  m.rope_theta = h.rope_theta;
  m.tie_embeddings = h.tie_embeddings;
  m.head_size = h.head_dim;
  m.qkv_bias = h.qkv_bias;
  m.o_bias = h.o_bias;
  m.mlp_bias = h.mlp_bias;
  m.qk_norm = h.qk_norm;
  m.sliding_window = h.sliding_window;
  m.rope_scaling = h.rope_scaling;
  m.rope_factor = h.rope_factor;
  m.rope_low_freq_factor = h.rope_low_freq_factor;
  m.rope_high_freq_factor = h.rope_high_freq_factor;
  m.rope_original_max_pos = h.rope_original_max_pos;
  return m;
}

model::HfModelConfig to_hf(const model::ModelConfig& m) {
  model::HfModelConfig h;
  h.arch = model::arch_name(m.arch);
  h.vocab_size = m.vocab_size;
  h.max_seq_len = m.max_seq_len;
  h.n_layer = m.n_layer;
  h.n_head = m.n_head;
  h.n_kv_head = m.n_kv_head;
  h.d_model = m.d_model;
  h.d_ff = m.d_ff;
  h.norm_eps = m.norm_eps;
  h.rope_theta = m.rope_theta;
  h.tie_embeddings = m.tie_embeddings;
  h.head_dim = m.head_size;
  h.qkv_bias = m.qkv_bias;
  h.o_bias = m.o_bias;
  h.mlp_bias = m.mlp_bias;
  h.qk_norm = m.qk_norm;
  h.sliding_window = m.sliding_window;
  h.rope_scaling = m.rope_scaling;
  h.rope_factor = m.rope_factor;
  h.rope_low_freq_factor = m.rope_low_freq_factor;
  h.rope_high_freq_factor = m.rope_high_freq_factor;
  h.rope_original_max_pos = m.rope_original_max_pos;
  return h;
}

// A config size given next to init_from must agree with the checkpoint's.
void check_same(const std::optional<int64_t>& given, int actual, const char* key, const std::string& dir) {
  if (given && *given != actual)
    DT_THROW(ConfigError, "model.{} = {} disagrees with {}/config.json ({}); remove model.{} from the config", key,
             *given, dir, actual, key);
}

// The safetensors files of a checkpoint and which one holds each tensor. A tensor in two
// files is an error (which copy would be meant?), as is, with an index, any disagreement
// between model.safetensors.index.json's weight_map and the shards.
struct WeightSet {
  std::vector<model::SafetensorsFile> files;
  std::unordered_map<std::string, size_t> file_of;
};

WeightSet weights_open(const std::vector<std::string>& paths) {
  WeightSet w;
  for (const auto& p : paths) w.files.emplace_back(p);
  for (size_t i = 0; i < w.files.size(); ++i)
    for (const auto& n : w.files[i].names()) {
      auto [it, fresh] = w.file_of.emplace(n, i);
      DT_ENFORCE(fresh, IoError, "tensor {} is in both {} and {}: a checkpoint names each weight once", n,
                 w.files[it->second].path(), w.files[i].path());
    }
  return w;
}

// The weight files of an HF directory: model.safetensors; else the shards
// model.safetensors.index.json names (with its weight_map, to validate them against);
// else every model-*.safetensors (a complete set). The names are looked for with lstat
// (input_present): a model.safetensors that is a broken link or a link loop is that file,
// named when it is opened, not a reason to look for shards instead. Opens no weight file.
struct WeightFiles {
  std::vector<std::string> paths;
  std::string index;                       // "" without one
  std::map<std::string, std::string> map;  // the index's tensor -> shard file name
};

WeightFiles weight_files_find(const std::string& dir) {
  input_dir_check(dir, "model directory");
  WeightFiles out;
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (input_present(single.string(), "safetensors file")) {
    out.paths.push_back(single.string());
    return out;
  }
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (input_present(index.string(), "safetensors index")) {
    const std::string ip = index.string();
    out.index = ip;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(input_file_read(ip, "safetensors index", kInputMetaMaxBytes));
    } catch (const nlohmann::json::parse_error& e) {
      DT_THROW(IoError, "{}: invalid JSON: {}", ip, e.what());
    }
    DT_ENFORCE(
        j.is_object() && j.contains("weight_map") && j.at("weight_map").is_object() && !j.at("weight_map").empty(),
        IoError, "{}: no \"weight_map\" object naming each tensor's shard", ip);
    std::set<std::string> shards;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      DT_ENFORCE(file.is_string() && !file.get<std::string>().empty() &&
                     file.get<std::string>().find('/') == std::string::npos,
                 IoError, "{}: weight_map[\"{}\"] must be a file name in {}, got {}", ip, name, dir, file.dump());
      out.map[name] = file.get<std::string>();
      shards.insert(file.get<std::string>());
    }
    for (const auto& f : shards) {
      const fs::path p = fs::path(dir) / f;
      DT_ENFORCE(input_present(p.string(), "safetensors shard"), IoError, "{} names shard {}, which is not in {}", ip,
                 f, dir);
      out.paths.push_back(p.string());
    }
    return out;
  }
  std::vector<std::string>& shards = out.paths;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model-", 0) == 0 && e.path().extension() == ".safetensors") shards.push_back(e.path().string());
  }
  std::sort(shards.begin(), shards.end());
  DT_ENFORCE(!shards.empty(), IoError,
             "{}: no model.safetensors, model.safetensors.index.json or model-*.safetensors shards found", dir);
  // Shards named model-0000k-of-0000n without their index: only a complete set loads (an
  // interrupted copy or export holds a part of the model, and its missing tensors could
  // otherwise be taken from nowhere or from a stale file).
  int of = -1;
  std::set<int> have;
  for (const auto& p : shards) {
    int k = 0, n = 0;
    char tail = 0;
    const std::string name = fs::path(p).filename().string();
    if (std::sscanf(name.c_str(), "model-%5d-of-%5d.safetensor%c", &k, &n, &tail) != 3 || tail != 's' ||
        name.size() != std::string("model-00001-of-00001.safetensors").size())
      continue;
    DT_ENFORCE(of < 0 || of == n, IoError, "{}: shards of {} and of {} files side by side; keep one export", dir, of,
               n);
    of = n;
    have.insert(k);
  }
  if (of > 0)
    for (int k = 1; k <= of; ++k)
      DT_ENFORCE(have.count(k) != 0, IoError,
                 "{}: model-{:05d}-of-{:05d}.safetensors is missing and there is no model.safetensors.index.json: an "
                 "incomplete (interrupted?) export; export again",
                 dir, k, of);
  return out;
}

// The weight files of an HF directory, opened; with an index, validated against it.
WeightSet weights_open_dir(const std::string& dir) {
  const WeightFiles found = weight_files_find(dir);
  WeightSet w = weights_open(found.paths);
  if (found.index.empty()) return w;
  const std::string& ip = found.index;
  for (const auto& [name, file] : found.map) {
    auto it = w.file_of.find(name);
    DT_ENFORCE(it != w.file_of.end(), IoError, "{}: tensor {} is mapped to {}, which does not hold it", ip, name, file);
    DT_ENFORCE(fs::path(w.files[it->second].path()).filename() == file, IoError,
               "{}: tensor {} is mapped to {} but is in {}", ip, name, file, w.files[it->second].path());
  }
  for (const auto& [name, i] : w.file_of)
    DT_ENFORCE(found.map.count(name) != 0, IoError, "{} holds tensor {}, which {} does not list", w.files[i].path(),
               name, ip);
  return w;
}

// The file and name that hold one tensor of the layout (HF's "gpt2" checkpoints omit the
// "transformer." prefix), its shape checked; IoError naming the file and tensor.
std::pair<const model::SafetensorsFile*, std::string> weight_check(const WeightSet& w, const model::TensorSpec& t,
                                                                   const model::ModelConfig& cfg) {
  std::vector<std::string> names{t.name};
  if (cfg.arch == model::ModelConfig::Arch::GPT2 && t.name.rfind("transformer.", 0) == 0)
    names.push_back(t.name.substr(12));
  for (const auto& n : names) {
    auto it = w.file_of.find(n);
    if (it == w.file_of.end()) continue;
    const model::SafetensorsFile& f = w.files[it->second];
    const auto& info = f.info(n);
    std::vector<int64_t> want = t.shape;
    if (t.hf_transposed) std::reverse(want.begin(), want.end());
    if (info.shape != want)
      DT_THROW(IoError, "{}: tensor {} has shape [{}], the model expects [{}]", f.path(), n,
               fmt::join(info.shape, ", "), fmt::join(want, ", "));
    return {&f, n};
  }
  DT_THROW(IoError, "{}: tensor {} is missing", w.files.front().path(), t.name);
}

// A NaN or infinity in a weight file would train to "loss is nan" at the first step, which
// blames the learning rate: IoError naming the file, the tensor and the first bad element.
void finite_check(const float* v, size_t n, const model::SafetensorsFile& f, const std::string& name) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      DT_THROW(IoError,
               "{}: tensor {} holds {} at element {}: the weights are damaged (or were saved from a run that "
               "diverged); use another checkpoint",
               f.path(), name, v[i], i);
}

// Reads one tensor of the layout from the file that holds it, transposing Conv1D.
void load_tensor(const WeightSet& w, const model::TensorSpec& t, float* dst, const model::ModelConfig& cfg) {
  const auto [f, n] = weight_check(w, t, cfg);
  if (!t.hf_transposed) {
    f->read_f32(n, dst, t.numel());
    finite_check(dst, t.numel(), *f, n);
    return;
  }
  std::vector<float> tmp(t.numel());
  f->read_f32(n, tmp.data(), tmp.size());
  finite_check(tmp.data(), tmp.size(), *f, n);
  const int64_t rows = t.shape[0], cols = t.shape[1];  // ours [rows, cols] = HF [cols, rows]
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = tmp[static_cast<size_t>(j * rows + i)];
}

void load_all(model::Model& m, const WeightSet& w) {
  for (auto& pb : m.params())
    for (const auto& t : pb.layout.tensors) load_tensor(w, t, pb.host_f32() + t.offset, m.config());
}

}  // namespace

// ----------------------------------------------------------------------------
model::ModelConfig model_config_from(const config::TrainConfig& cfg) {
  const auto& c = cfg.model;
  if (!c.init_from.empty()) {
    const std::string path = (fs::path(c.init_from) / "config.json").string();
    model::ModelConfig m = from_hf(model::hf_config_read(path));
    if (c.architecture && arch_parse(*c.architecture, "model.architecture") != m.arch)
      DT_THROW(ConfigError, "model.architecture = {} disagrees with {} ({})", *c.architecture, path,
               model::arch_name(m.arch));
    check_same(c.vocab_size, m.vocab_size, "vocab_size", c.init_from);
    check_same(c.n_layer, m.n_layer, "n_layer", c.init_from);
    check_same(c.n_head, m.n_head, "n_head", c.init_from);
    check_same(c.d_model, m.d_model, "d_model", c.init_from);
    check_same(c.d_ff, m.d_ff, "d_ff", c.init_from);
    check_same(c.n_kv_head, m.n_kv_head, "n_kv_head", c.init_from);
    if (cfg.data.seq_len)
      DT_ENFORCE(*cfg.data.seq_len <= m.max_seq_len, ConfigError,
                 "data.seq_len = {} is longer than the max_seq_len {} of {}", *cfg.data.seq_len, m.max_seq_len, path);
    m.validate();
    return m;
  }
  DT_ENFORCE(c.architecture.has_value(), ConfigError, "{}: model.architecture is required without model.init_from",
             cfg.source);
  auto need = [&](const std::optional<int64_t>& v, const char* key) -> int {
    DT_ENFORCE(v.has_value(), ConfigError, "{}: model.{} is required without model.init_from", cfg.source, key);
    return static_cast<int>(*v);
  };
  model::ModelConfig m;
  m.arch = arch_parse(*c.architecture, cfg.source + ": model.architecture");
  m.vocab_size = need(c.vocab_size, "vocab_size");
  m.n_layer = need(c.n_layer, "n_layer");
  m.n_head = need(c.n_head, "n_head");
  m.n_kv_head = c.n_kv_head ? static_cast<int>(*c.n_kv_head) : m.n_head;
  m.d_model = need(c.d_model, "d_model");
  m.d_ff = need(c.d_ff, "d_ff");
  m.max_seq_len = c.max_seq_len ? static_cast<int>(*c.max_seq_len) : need(cfg.data.seq_len, "max_seq_len");
  m.norm_eps = static_cast<float>(c.norm_eps);
  m.rope_theta = static_cast<float>(c.rope_theta);
  m.tie_embeddings = c.tie_embeddings.value_or(m.arch == model::ModelConfig::Arch::GPT2);
  m.validate();
  return m;
}

model::LoraConfig lora_config_from(const config::TrainConfig& cfg, const model::ModelConfig& mcfg) {
  model::LoraConfig l;
  l.rank = static_cast<int>(cfg.lora.r);
  l.alpha = static_cast<float>(cfg.lora.alpha);
  l.dropout = static_cast<float>(cfg.lora.dropout);
  l.targets = cfg.lora.target_modules;
  if (l.targets.empty())
    l.targets = !mcfg.is_gpt2() ? std::vector<std::string>{"q_proj", "v_proj"} : std::vector<std::string>{"c_attn"};
  l.seed = static_cast<uint64_t>(cfg.training.seed);
  l.validate(mcfg);
  return l;
}

void model_load_safetensors(model::Model& m, const std::vector<std::string>& paths) {
  DT_ENFORCE(!paths.empty(), InternalError, "model_load_safetensors: no files");
  load_all(m, weights_open(paths));
}

void model_load_hf_weights(model::Model& m, const std::string& dir) { load_all(m, weights_open_dir(dir)); }

void model_files_check(const std::string& dir) {
  for (const std::string& p : weight_files_find(dir).paths) input_file_check(p, "safetensors file");
  for (const char* name : {"adapter_config.json", "adapter_model.safetensors"}) {
    const std::string p = (fs::path(dir) / name).string();
    if (input_present(p, "LoRA adapter file")) input_file_check(p, "LoRA adapter file");
  }
}

bool model_weights_present(const std::string& dir) {
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"})
    if (input_present((fs::path(dir) / name).string(), "safetensors file")) return true;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model-", 0) == 0 && e.path().extension() == ".safetensors") return true;
  }
  return false;
}

void model_load_adapter(model::Model& m, const std::string& path) {
  DT_ENFORCE(m.lora_on(), InternalError, "model_load_adapter: LoRA is not enabled");
  const WeightSet w = weights_open({path});
  // Through a host copy of each adapter buffer: the model may live on a device.
  std::vector<float> host;
  for (size_t k = 0; k < m.lora_params().size(); ++k) {
    const model::ParamBuffer& pb = m.lora_params()[k];
    host.assign(pb.size, 0.0f);
    for (const auto& t : pb.layout.tensors) load_tensor(w, t, host.data() + t.offset, m.config());
    m.buffer_from_host(m.params().size() + k, host.data());
  }
}

int recompute_layers_of(const config::TrainConfig& cfg, int n_layer) {
  const auto& ac = cfg.activation_checkpointing;
  if (ac.layers) {
    DT_ENFORCE(*ac.layers <= n_layer, ConfigError,
               "{}: activation_checkpointing.layers: {} is more than the model's {} layers (model.n_layer)", cfg.source,
               *ac.layers, n_layer);
    return static_cast<int>(*ac.layers);
  }
  return ac.enabled.value_or(false) ? n_layer : 0;
}

namespace {

// LoRA when the config asks for it, its adapters loaded from init_from's
// adapter_model.safetensors when that file exists; recompute as configured.
void lora_and_recompute(model::Model& m, const config::TrainConfig& cfg, const model::ModelConfig& mcfg) {
  if (cfg.lora.enabled()) {
    m.lora_enable(lora_config_from(cfg, mcfg));
    const fs::path adapter = fs::path(cfg.model.init_from) / "adapter_model.safetensors";
    if (!cfg.model.init_from.empty() && input_present(adapter.string(), "LoRA adapter"))
      model_load_adapter(m, adapter.string());
  }
  m.set_recompute_layers(recompute_layers_of(cfg, mcfg.n_layer));
}

}  // namespace

std::unique_ptr<model::Model> model_create(const config::TrainConfig& cfg) {
  const model::ModelConfig mcfg = model_config_from(cfg);
  model_memory_check(mcfg, cfg.source);
  // Under LoRA the base is frozen: no gradient array is allocated for it.
  auto m = cfg.lora.enabled() ? std::make_unique<model::Model>(mcfg, model::Model::FrozenBase{})
                              : std::make_unique<model::Model>(mcfg);
  if (cfg.model.init_from.empty()) {
    m->init_weights(static_cast<uint64_t>(cfg.training.seed));
  } else {
    model_load_hf_weights(*m, cfg.model.init_from);
    log_info("model: loaded {} ({} parameters)", cfg.model.init_from, m->num_params());
  }
  lora_and_recompute(*m, cfg, mcfg);
  return m;
}

DeferredModel model_create_deferred(const config::TrainConfig& cfg, device::Device& dev, DType dtype) {
  const model::ModelConfig mcfg = model_config_from(cfg);
  DeferredModel d;
  d.model = std::make_unique<model::Model>(mcfg, model::Model::Deferred{}, dev, dtype);
  model::Model* m = d.model.get();
  if (cfg.model.init_from.empty()) {
    const auto seed = static_cast<uint64_t>(cfg.training.seed);
    d.fill = [m, seed](size_t i, float* host) { m->init_buffer_values(i, seed, host); };
  } else {
    auto w = std::make_shared<WeightSet>(weights_open_dir(cfg.model.init_from));
    // Every tensor is looked up now, so a checkpoint that lacks one fails before training.
    for (const auto& pb : m->params())
      for (const auto& t : pb.layout.tensors) weight_check(*w, t, mcfg);
    d.fill = [m, w](size_t i, float* host) {
      const model::ParamBuffer& pb = m->params()[i];
      std::fill(host, host + pb.size, 0.0f);
      for (const auto& t : pb.layout.tensors) load_tensor(*w, t, host + t.offset, m->config());
    };
    log_info("model: {} ({} parameters) loads buffer by buffer, straight into the ZeRO engine", cfg.model.init_from,
             m->num_params());
  }
  lora_and_recompute(*m, cfg, mcfg);
  return d;
}

std::unique_ptr<model::Model> model_load_hf_dir(const std::string& dir) {
  const model::ModelConfig mcfg = from_hf(model::hf_config_read((fs::path(dir) / "config.json").string()));
  model_memory_check(mcfg, (fs::path(dir) / "config.json").string());
  auto m = std::make_unique<model::Model>(mcfg);
  model_load_hf_weights(*m, dir);
  const fs::path acfg = fs::path(dir) / "adapter_config.json";
  if (input_present(acfg.string(), "LoRA adapter config")) {
    const model::LoraAdapterConfig a = model::peft_config_read(acfg.string());
    model::LoraConfig l;
    l.rank = a.r;
    l.alpha = a.lora_alpha;
    l.dropout = a.lora_dropout;
    l.targets = a.target_modules;
    l.validate(mcfg);
    m->lora_enable(l);
    model_load_adapter(*m, (fs::path(dir) / "adapter_model.safetensors").string());
  }
  return m;
}

model::HfModelConfig model_hf_config(const model::ModelConfig& m) { return to_hf(m); }

}  // namespace dtrain::train
