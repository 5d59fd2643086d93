// Derived values and the checks that relate several keys (fp16 vs bf16, heads vs d_model,
// LoRA targets per architecture, scheduler parameters), and the "is this a runnable job"
// check. Messages name the key and where its value came from.
#include "config/load_detail.h"
#include "config/schema.h"

#include "core/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>

namespace dtrain::config {

// ---------------------------------------------------------------------------
// Tables

bool scheduler_param_applies(const std::optional<std::string>& type, std::string_view param) {
  static const std::map<std::string, std::vector<std::string>, std::less<>> kParams = {
      {"WarmupLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}},
      {"WarmupDecayLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"}},
      {"WarmupCosineLR", {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"}},
  };
  if (!type) return false;
  auto it = kParams.find(*type);
  return it != kParams.end() && std::find(it->second.begin(), it->second.end(), param) != it->second.end();
}

const std::vector<std::string>& lora_modules_for(std::string_view architecture) {
  static const std::vector<std::string> kLlama = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};
  static const std::vector<std::string> kGpt2 = {"c_attn", "c_proj", "c_fc"};
  static const std::vector<std::string> kNone;
  if (architecture == "llama") return kLlama;
  if (architecture == "gpt2") return kGpt2;
  return kNone;
}

std::optional<uint64_t> byte_size_parse(std::string_view text) {
  size_t i = 0, n = text.size();
  while (i < n && text[i] == ' ') ++i;
  while (n > i && text[n - 1] == ' ') --n;
  const std::string_view s = text.substr(i, n - i);
  size_t num_end = 0;
  bool dot = false, digit = false;
  for (; num_end < s.size(); ++num_end) {
    const char c = s[num_end];
    if (c >= '0' && c <= '9') digit = true;
    else if (c == '.' && !dot) dot = true;
    else break;
  }
  if (!digit) return std::nullopt;
  std::string unit(s.substr(num_end));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, uint64_t> kUnits[] = {{"", 1},
                                                            {"b", 1},
                                                            {"kb", 1000},
                                                            {"mb", 1000000},
                                                            {"gb", 1000000000},
                                                            {"tb", 1000000000000},
                                                            {"kib", 1ull << 10},
                                                            {"mib", 1ull << 20},
                                                            {"gib", 1ull << 30},
                                                            {"tib", 1ull << 40}};
  const auto u = std::find_if(std::begin(kUnits), std::end(kUnits), [&](const auto& e) { return unit == e.first; });
  if (u == std::end(kUnits)) return std::nullopt;
  const std::string num(s.substr(0, num_end));
  constexpr uint64_t kMax = uint64_t{1} << 63;
  uint64_t v = 0;
  if (!dot) {
    // Whole numbers exactly (a byte count beyond 2^53 would lose digits in a double).
    for (char c : num) {
      if (v > (kMax - static_cast<uint64_t>(c - '0')) / 10) return std::nullopt;
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    if (u->second != 0 && v > kMax / u->second) return std::nullopt;
    v *= u->second;
  } else {
    if (unit.empty() || unit == "b") return std::nullopt;  // a byte count is a whole number
    const double d = std::stod(num) * static_cast<double>(u->second);
    if (!(d < 9.2e18)) return std::nullopt;
    v = static_cast<uint64_t>(d);  // HF: int(value * multiplier)
  }
  if (v == 0) return std::nullopt;
  return v;
}

namespace {

// Llama's FFN size rule: 2/3 of 4*d, rounded up to a multiple of 256.
int64_t llama_d_ff(int64_t d_model) {
  const int64_t multiple_of = 256;
  int64_t hidden = 8 * d_model / 3;
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

std::string default_name(const std::string& source) {
  std::string stem = std::filesystem::path(source).stem().string();
  std::string out;
  for (char c : stem)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  while (!out.empty() && out.front() == '.') out.erase(out.begin());
  return out.empty() ? "dtrain" : out;
}

// ---------------------------------------------------------------------------
// Derivation

void derive(TrainConfig& cfg, const Origins& o) {
  ModelConfig& m = cfg.model;
  if (cfg.training.name.empty()) cfg.training.name = default_name(cfg.source);
  if (cfg.training.output_dir.empty()) cfg.training.output_dir = "runs/" + cfg.training.name;
  if (!m.n_kv_head && m.n_head) m.n_kv_head = m.n_head;
  if (!m.d_ff && m.d_model && m.architecture)
    m.d_ff = *m.architecture == "llama" ? llama_d_ff(*m.d_model) : 4 * *m.d_model;
  if (!m.tie_embeddings && m.architecture) m.tie_embeddings = *m.architecture == "gpt2";
  if (!cfg.data.seq_len && m.max_seq_len) cfg.data.seq_len = m.max_seq_len;
  if (!m.max_seq_len && cfg.data.seq_len) m.max_seq_len = cfg.data.seq_len;

  SchedulerConfig& s = cfg.scheduler;
  if (scheduler_param_applies(s.type, "warmup_max_lr") && !s.warmup_max_lr) s.warmup_max_lr = cfg.optimizer.lr;
  if (scheduler_param_applies(s.type, "total_num_steps") && !s.total_num_steps && cfg.training.max_steps)
    s.total_num_steps = cfg.training.max_steps;

  if (cfg.lora.r > 0 && cfg.lora.target_modules.empty() && m.architecture)
    cfg.lora.target_modules =
        *m.architecture == "llama" ? std::vector<std::string>{"q_proj", "v_proj"} : std::vector<std::string>{"c_attn"};
  ActivationCheckpointingConfig& ac = cfg.activation_checkpointing;
  if (!ac.enabled && !ac.layers && o.sections_seen.count("activation_checkpointing")) ac.enabled = true;
  if (ac.enabled && !*ac.enabled && ac.layers && *ac.layers > 0)
    DT_THROW(ConfigError, "{}: activation_checkpointing.layers: {} layers recompute, but enabled is false: give one",
             o.at("activation_checkpointing.layers"), *ac.layers);

  // DeepSpeed's older booleans mean what the offload sections say.
  ZeroConfig& z = cfg.zero;
  if (z.cpu_offload && z.offload_optimizer_device == "none") z.offload_optimizer_device = "cpu";
  if (z.cpu_offload_params && z.offload_param_device == "none") z.offload_param_device = "cpu";
  if (z.cpu_offload_use_pin_memory) {
    if (!o.given.count("zero_optimization.offload_optimizer.pin_memory")) z.offload_optimizer_pin_memory = true;
    if (!o.given.count("zero_optimization.offload_param.pin_memory")) z.offload_param_pin_memory = true;
  }
}

// ---------------------------------------------------------------------------
// Checks between keys

// The model's shape and the sequence length.
void validate_model(const TrainConfig& cfg, const Origins& o) {
  const ModelConfig& m = cfg.model;
  // A given data.seq_len below 2 fails its own range check; this is the derived one.
  if (cfg.data.seq_len && *cfg.data.seq_len < 2)
    DT_THROW(ConfigError,
             "{}: data.seq_len: {} (taken from model.max_seq_len) leaves no token to predict; a training sequence "
             "needs at least 2 tokens: set data.seq_len and model.max_seq_len to 2 or more",
             o.at("model.max_seq_len"), *cfg.data.seq_len);
  if (m.d_model && m.n_head && *m.d_model % *m.n_head != 0)
    DT_THROW(ConfigError, "{}: model.d_model: {} is not a multiple of model.n_head = {} (at {})", o.at("model.d_model"),
             *m.d_model, *m.n_head, o.at("model.n_head"));
  if (m.n_head && m.n_kv_head) {
    if (*m.n_kv_head > *m.n_head || *m.n_head % *m.n_kv_head != 0)
      DT_THROW(ConfigError, "{}: model.n_kv_head: {} must divide model.n_head = {} (at {})", o.at("model.n_kv_head"),
               *m.n_kv_head, *m.n_head, o.at("model.n_head"));
    if (m.architecture == "gpt2" && *m.n_kv_head != *m.n_head)
      DT_THROW(ConfigError,
               "{}: model.n_kv_head: gpt2 has no grouped-query attention; n_kv_head must equal n_head = {} "
               "(or drop the key)",
               o.at("model.n_kv_head"), *m.n_head);
  }
  if (m.architecture == "llama" && m.d_model && m.n_head && (*m.d_model / *m.n_head) % 2 != 0)
    DT_THROW(ConfigError, "{}: model.d_model: llama needs an even head size for RoPE, d_model / n_head = {}",
             o.at("model.d_model"), *m.d_model / *m.n_head);
  if (cfg.data.seq_len && m.max_seq_len && *cfg.data.seq_len > *m.max_seq_len)
    DT_THROW(ConfigError, "{}: data.seq_len: {} is longer than model.max_seq_len = {} (at {})", o.at("data.seq_len"),
             *cfg.data.seq_len, *m.max_seq_len, o.at("model.max_seq_len"));
}

void warn_zero_switches(const TrainConfig& cfg, const Origins& o, std::vector<std::string>& warnings) {
  // ZeRO switches dtrain has one behaviour for: the DeepSpeed default is what it does.
  if (!cfg.zero.reduce_scatter)
    warnings.push_back(fmt::format(
        "{}: zero_optimization.reduce_scatter: false is ignored: dtrain always reduce-scatters the gradients at "
        "stages 1-3 (each rank receives only its shard), DeepSpeed's default",
        o.at("zero_optimization.reduce_scatter")));
  if (!cfg.zero.contiguous_gradients)
    warnings.push_back(fmt::format(
        "{}: zero_optimization.contiguous_gradients: false is ignored: dtrain always packs gradients into contiguous "
        "reduce buckets as backward produces them, DeepSpeed's default",
        o.at("zero_optimization.contiguous_gradients")));
}

void validate_lora(const TrainConfig& cfg, const Origins& o, std::vector<std::string>& warnings) {
  const ModelConfig& m = cfg.model;
  if (cfg.lora.r == 0 && o.given.count("lora.target_modules") && !cfg.lora.target_modules.empty())
    warnings.push_back(fmt::format("{}: lora.target_modules is given but lora.r is 0: LoRA is off (set lora.r > 0)",
                                   o.at("lora.target_modules")));
  if (m.architecture) {
    const auto& known = lora_modules_for(*m.architecture);
    std::vector<std::string> seen;
    for (const std::string& t : cfg.lora.target_modules) {
      if (std::find(known.begin(), known.end(), t) == known.end()) {
        const auto& other = lora_modules_for(*m.architecture == "llama" ? "gpt2" : "llama");
        bool foreign = std::find(other.begin(), other.end(), t) != other.end();
        std::string hint = foreign ? "" : key_suggest(t, known);
        DT_THROW(ConfigError, "{}: lora.target_modules: '{}' is not a projection of {} (its projections: {}){}",
                 o.at("lora.target_modules"), t, *m.architecture, fmt::join(known, ", "),
                 hint.empty() ? "" : fmt::format("; did you mean {}?", hint));
      }
      if (std::find(seen.begin(), seen.end(), t) != seen.end())
        DT_THROW(ConfigError, "{}: lora.target_modules: '{}' is listed twice", o.at("lora.target_modules"), t);
      seen.push_back(t);
    }
  }
  if (cfg.lora.r > 0 && cfg.lora.target_modules.empty() && m.architecture)
    DT_THROW(ConfigError, "{}: lora.target_modules: empty list with lora.r = {}; name the projections to adapt",
             o.at("lora.target_modules"), cfg.lora.r);
}

// Scheduler: parameters must belong to the type, as DeepSpeed's constructors require.
void validate_scheduler(const TrainConfig& cfg, const Origins& o, std::vector<std::string>& warnings) {
  const SchedulerConfig& s = cfg.scheduler;
  for (const std::string& path : o.given) {
    static const std::string kPrefix = "scheduler.params.";
    if (path.rfind(kPrefix, 0) != 0) continue;
    std::string param = path.substr(kPrefix.size());
    if (!s.type)
      DT_THROW(ConfigError,
               "{}: {}: scheduler parameters without scheduler.type; set scheduler.type to WarmupLR, "
               "WarmupDecayLR or WarmupCosineLR",
               o.at(path), path);
    if (!scheduler_param_applies(s.type, param))
      DT_THROW(ConfigError, "{}: {}: not a parameter of scheduler {} (at {})", o.at(path), path, *s.type,
               o.at("scheduler.type"));
  }
  if (s.type && *s.type != "WarmupLR" && s.total_num_steps && *s.total_num_steps <= s.warmup_num_steps)
    DT_THROW(ConfigError, "{}: scheduler.params.total_num_steps: {} must be greater than warmup_num_steps = {} (at {})",
             o.at("scheduler.params.total_num_steps"), *s.total_num_steps, s.warmup_num_steps,
             o.at("scheduler.params.warmup_num_steps"));
  if (s.warmup_max_lr && *s.warmup_max_lr < s.warmup_min_lr)
    DT_THROW(ConfigError, "{}: scheduler.params.warmup_max_lr: {} is below warmup_min_lr = {}",
             o.at("scheduler.params.warmup_max_lr"), *s.warmup_max_lr, s.warmup_min_lr);
  if (s.type && *s.type != "WarmupLR" && !s.total_num_steps && cfg.training.epochs)
    warnings.push_back(
        fmt::format("{}: scheduler.params.total_num_steps not given: the {} schedule ends at the "
                    "last step of training.epochs",
                    o.at("scheduler.type"), *s.type));
}

// Supervision, elastic bounds, and the names and addresses the job is built from.
void validate_job(const TrainConfig& cfg, const Origins& o) {
  const FaultToleranceConfig& f = cfg.fault_tolerance;
  if (f.heartbeat_timeout <= f.heartbeat_interval)
    DT_THROW(ConfigError, "{}: fault_tolerance.heartbeat_timeout: {} s must be greater than heartbeat_interval = {} s",
             o.at("fault_tolerance.heartbeat_timeout"), f.heartbeat_timeout, f.heartbeat_interval);
  if (f.step_timeout > 0 && f.step_timeout <= f.heartbeat_interval)
    DT_THROW(ConfigError,
             "{}: fault_tolerance.step_timeout: {} s must be 0 (off) or greater than heartbeat_interval = {} s (steps "
             "are reported with the heartbeats)",
             o.at("fault_tolerance.step_timeout"), f.step_timeout, f.heartbeat_interval);
  const ElasticConfig& el = cfg.elastic;
  if (el.max_nodes > 0 && el.min_nodes > el.max_nodes)
    DT_THROW(ConfigError,
             "{}: elastic.min_nodes: {} is above elastic.max_nodes = {} (--nnodes MIN:MAX needs MIN <= MAX)",
             o.at("elastic.min_nodes"), el.min_nodes, el.max_nodes);
  if (cfg.training.name.find('/') != std::string::npos)
    DT_THROW(ConfigError, "{}: training.name: '{}' must not contain '/' (it names runs/<name>)", o.at("training.name"),
             cfg.training.name);
  // An absolute job_name would silently replace output_path (path joining).
  if (!cfg.tensorboard.job_name.empty() && cfg.tensorboard.job_name.front() == '/')
    DT_THROW(ConfigError,
             "{}: tensorboard.job_name: '{}' must be a relative directory name (it goes below "
             "tensorboard.output_path); give the absolute directory as output_path instead",
             o.at("tensorboard.job_name"), cfg.tensorboard.job_name);
  if (cfg.data.tokenizer.empty())
    DT_THROW(ConfigError, "{}: data.tokenizer: empty; give a tokenizer.json path or \"byte\"", o.at("data.tokenizer"));
  if (cfg.cluster.rendezvous.address.empty())
    DT_THROW(ConfigError, "{}: cluster.rendezvous.address: empty; give a host/IP or auto",
             o.at("cluster.rendezvous.address"));
}

// DeepSpeed's communication_data_type is the 16-bit case of communication.compression:
// one of them may be given, or both when they say the same.
void derive_communication(TrainConfig& cfg, const Origins& o) {
  if (!cfg.communication_data_type) return;
  const std::string& dt = *cfg.communication_data_type;
  const std::string method = dt == "fp32" ? "none" : dt;
  if (o.given.count("communication.compression") && cfg.communication.compression != method)
    DT_THROW(ConfigError,
             "{}: communication_data_type: {} means communication.compression {}, but communication.compression "
             "(at {}) is {}; give one of the two keys",
             o.at("communication_data_type"), dt, method, o.at("communication.compression"),
             cfg.communication.compression);
  cfg.communication.compression = method;
}

// PowerSGD and top-k compress the full gradient that stages 0-1 allreduce; from stage 2 on
// each rank reduce-scatters its gradient shards layer by layer, which leaves no full
// matrix to factor and no bucket to select from.
void validate_communication(const TrainConfig& cfg, const Origins& o) {
  const std::string& c = cfg.communication.compression;
  if ((c == "powersgd" || c == "topk") && cfg.zero.stage > 1)
    DT_THROW(ConfigError,
             "{}: communication.compression: {} needs zero_optimization.stage 0 or 1, but the stage is {} (at {}); "
             "use bf16 or fp16 compression at stage {}, or stage 1",
             o.at("communication.compression"), c, cfg.zero.stage, o.at("zero_optimization.stage"), cfg.zero.stage);
}

// ZeRO-Offload: the optimizer offload needs a sharded optimizer (stages 1-3), the parameter
// offload sharded parameters (stage 3) and the optimizer offload too (DeepSpeed's rules);
// NVMe (ZeRO-Infinity) is not built.
void validate_offload(const TrainConfig& cfg, const Origins& o) {
  const ZeroConfig& z = cfg.zero;
  const std::string opt_at = o.given.count("zero_optimization.offload_optimizer.device")
                                 ? o.at("zero_optimization.offload_optimizer.device")
                                 : o.at("zero_optimization.cpu_offload");
  const std::string par_at = o.given.count("zero_optimization.offload_param.device")
                                 ? o.at("zero_optimization.offload_param.device")
                                 : o.at("zero_optimization.cpu_offload_params");
  for (const auto& [dev, where, key] : {std::tuple{z.offload_optimizer_device, opt_at, "offload_optimizer"},
                                        std::tuple{z.offload_param_device, par_at, "offload_param"}})
    if (dev == "nvme")
      DT_THROW(ConfigError,
               "{}: zero_optimization.{}.device: nvme (ZeRO-Infinity) is not built in dtrain; use device cpu "
               "(host memory) or none",
               where, key);
  if (z.offload_optimizer_device == "cpu" && z.stage < 1)
    DT_THROW(ConfigError,
             "{}: zero_optimization.offload_optimizer.device: cpu needs a sharded optimizer, zero_optimization.stage "
             "1, 2 or 3, but the stage is {} (at {})",
             opt_at, z.stage, o.at("zero_optimization.stage"));
  if (z.offload_param_device == "cpu") {
    if (z.stage != 3)
      DT_THROW(ConfigError,
               "{}: zero_optimization.offload_param.device: cpu offloads the parameter shards of "
               "zero_optimization.stage 3, but the stage is {} (at {}); use offload_optimizer at stages 1-2",
               par_at, z.stage, o.at("zero_optimization.stage"));
    if (z.offload_optimizer_device != "cpu")
      DT_THROW(ConfigError,
               "{}: zero_optimization.offload_param.device: cpu needs offload_optimizer.device cpu too (the fp32 "
               "masters the parameters come from live beside the optimizer); add it",
               par_at);
  }
}

void validate_export(const TrainConfig& cfg, const Origins& o) {
  if (!byte_size_parse(cfg.hf_export.max_shard_size))
    DT_THROW(ConfigError,
             "{}: export.max_shard_size: '{}' is not a size; give bytes (e.g. 2000000000) or a number with KB, MB, "
             "GB, TB (powers of 1000, as Hugging Face) or KiB, MiB, GiB, TiB, e.g. 5GB or 500MB",
             o.at("export.max_shard_size"), cfg.hf_export.max_shard_size);
}

void validate(const TrainConfig& cfg, const Origins& o, std::vector<std::string>& warnings) {
  if (cfg.fp16.enabled && cfg.bf16.enabled)
    DT_THROW(ConfigError, "{}: bf16.enabled: fp16.enabled (at {}) and bf16.enabled are both true; enable at most one",
             o.at("bf16.enabled"), o.at("fp16.enabled"));
  if (cfg.training.max_steps && cfg.training.epochs)
    DT_THROW(ConfigError,
             "{}: training.epochs: both training.max_steps (at {}) and training.epochs are given; keep one",
             o.at("training.epochs"), o.at("training.max_steps"));

  if (cfg.training.pref_reference == "adapters_off" && cfg.lora.r == 0 && cfg.training.stage == "dpo" &&
      cfg.training.pref_loss == "sigmoid")
    DT_THROW(ConfigError,
             "{}: training.pref_reference: adapters_off needs LoRA (lora.r > 0): without adapters there is no base "
             "model to switch back to; use precomputed (or auto)",
             o.at("training.pref_reference"));
  validate_model(cfg, o);
  warn_zero_switches(cfg, o, warnings);
  validate_lora(cfg, o, warnings);
  validate_scheduler(cfg, o, warnings);
  validate_job(cfg, o);
  validate_communication(cfg, o);
  validate_offload(cfg, o);
  validate_export(cfg, o);
}

}  // namespace

// ---------------------------------------------------------------------------

// With model.init_from, the model's own tokenizer (its tokenizer.json) and chat template
// (the family's, from tokenizer_config.json's chat_template) unless the config names them:
// the byte tokenizer would spell the chat special tokens out as plain text.
namespace {
void derive_from_model(TrainConfig& cfg, const Origins& o, std::vector<std::string>* notes) {
  if (cfg.model.init_from.empty()) return;
  namespace fs = std::filesystem;
  const fs::path dir(cfg.model.init_from);
  std::error_code ec;
  const bool tokenizer_given = o.given.count("data.tokenizer") > 0;
  if (!tokenizer_given && fs::is_regular_file(dir / "tokenizer.json", ec)) {
    cfg.data.tokenizer = (dir / "tokenizer.json").string();
    if (notes)
      notes->push_back(
          fmt::format("data.tokenizer {} (model.init_from's; data.tokenizer not given)", cfg.data.tokenizer));
  } else if (!tokenizer_given && notes) {
    // Said, not refused: a model of one's own may train on bytes (a template that needs the
    // model's special tokens is refused by the launcher).
    notes->push_back(
        fmt::format("data.tokenizer byte: model.init_from {} holds no tokenizer.json (data.tokenizer "
                    "not given; give it, or put the model's tokenizer.json there)",
                    cfg.model.init_from));
  }
  if (o.given.count("data.template") > 0 || (tokenizer_given && cfg.data.tokenizer == "byte")) return;
  const fs::path tokenizer_dir = cfg.data.tokenizer == "byte" ? fs::path()
                                 : fs::is_directory(cfg.data.tokenizer, ec)
                                     ? fs::path(cfg.data.tokenizer)
                                     : fs::path(cfg.data.tokenizer).parent_path();
  if (tokenizer_dir.empty() || !fs::is_regular_file(tokenizer_dir / "tokenizer_config.json", ec)) return;
  std::ifstream in(tokenizer_dir / "tokenizer_config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.find("\"chat_template\"") == std::string::npos) return;
  cfg.data.template_name = "auto";
  if (notes)
    notes->push_back(fmt::format("data.template auto: the chat_template of {} (data.template not given)",
                                 (tokenizer_dir / "tokenizer_config.json").string()));
}
}  // namespace

void config_derive_validate(TrainConfig& cfg, const Origins& o, std::vector<std::string>& warnings,
                            std::vector<std::string>* notes) {
  derive_from_model(cfg, o, notes);
  derive(cfg, o);
  derive_communication(cfg, o);
  validate(cfg, o, warnings);
  // A config that names any part of a job (model, data, steps) must name all of it; a pure
  // DeepSpeed config (e.g. an HF Trainer ds_config) is checked by config_check_job at launch.
  bool names_job = (o.given_by_user.count("model.architecture") && cfg.model.architecture) ||
                   (o.given_by_user.count("model.init_from") && !cfg.model.init_from.empty()) ||
                   (o.given_by_user.count("data.train") && !cfg.data.train.empty()) ||
                   (o.given_by_user.count("training.max_steps") && cfg.training.max_steps) ||
                   (o.given_by_user.count("training.epochs") && cfg.training.epochs);
  if (names_job) config_check_job(cfg);
}

void config_check_job(const TrainConfig& cfg) {
  const std::string& src = cfg.source;
  const ModelConfig& m = cfg.model;
  if (m.init_from.empty()) {
    std::vector<std::string> missing;
    if (!m.architecture) missing.push_back("model.architecture");
    if (!m.vocab_size) missing.push_back("model.vocab_size");
    if (!m.n_layer) missing.push_back("model.n_layer");
    if (!m.n_head) missing.push_back("model.n_head");
    if (!m.d_model) missing.push_back("model.d_model");
    if (!m.max_seq_len) missing.push_back("model.max_seq_len (or data.seq_len)");
    if (!missing.empty())
      DT_THROW(ConfigError, "{}: {}: required for a job (or set model.init_from to a Hugging Face model directory)",
               src, fmt::join(missing, ", "));
  }
  if (cfg.data.train.empty())
    DT_THROW(ConfigError, "{}: data.train: required for a job; give the training data path", src);
  if (!cfg.training.max_steps && !cfg.training.epochs)
    DT_THROW(ConfigError, "{}: training.max_steps / training.epochs: give exactly one (neither is set)", src);
  if (cfg.training.max_steps && cfg.training.epochs)
    DT_THROW(ConfigError, "{}: training.max_steps / training.epochs: give exactly one (both are set)", src);
}

}  // namespace dtrain::config
