// The training config: DeepSpeed key names (train_batch_size, zero_optimization, fp16, ...)
// plus dtrain's own sections (model, data, lora, training, fault_tolerance, cluster).
// Loaded from YAML or DeepSpeed JSON, then env overrides, then --set overrides; every key
// is declared once in the schema (config/schema.cpp). Errors are ConfigError / IoError.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::config {

// Optional fields (std::optional) are "not given": either the value is derived from other
// keys at load time (see each field) or the consumer takes it elsewhere (model sizes from
// model.init_from's config.json). Enum-typed keys are strings holding one allowed value.

struct ModelConfig {
  std::optional<std::string> architecture;  // "gpt2" | "llama"; required unless init_from
  std::optional<int64_t> vocab_size;
  std::optional<int64_t> n_layer;
  std::optional<int64_t> n_head;
  std::optional<int64_t> n_kv_head;  // derived: n_head
  std::optional<int64_t> d_model;
  std::optional<int64_t> d_ff;         // derived: gpt2 4*d_model; llama 256*ceil(int(8*d_model/3)/256)
  std::optional<int64_t> max_seq_len;  // derived: data.seq_len
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  std::optional<bool> tie_embeddings;  // derived: gpt2 true, llama false
  std::string init_from;               // HF model directory ("" = random init)
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::string train;               // path ("" only in a pure DeepSpeed config)
  std::string valid;               // path or "" (no validation)
  std::string format = "auto";     // "text" | "alpaca" | "chat" | "pairwise" | "tokens" | "auto" (from the records)
  std::string tokenizer = "byte";  // path to tokenizer.json, or "byte"
  std::optional<int64_t> seq_len;  // derived: model.max_seq_len
  std::string template_name = "plain";  // YAML key data.template
  bool train_on_prompt = false;
  std::string dataset;               // LLaMA-Factory dataset names (data.train is their dataset_dir)
  std::vector<std::string> mix;      // one weight per data.dataset name; empty = concatenated
  std::optional<bool> pack;          // derived: true, except for pairwise (preference) data, which is never packed
  std::optional<bool> neat_packing;  // derived: true, except for data.format text (attention across documents)
  bool shuffle = true;
  bool operator==(const DataConfig&) const = default;
};

struct LoraConfig {
  int64_t r = 0;  // LoRA is on iff r > 0
  double alpha = 16.0;
  double dropout = 0.0;
  std::vector<std::string> target_modules;  // derived when r > 0 and empty: llama [q_proj, v_proj], gpt2 [c_attn]
  bool enabled() const { return r > 0; }
  bool operator==(const LoraConfig&) const = default;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // "AdamW" | "Adam" (Adam with weight_decay is AdamW: decoupled decay)
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool operator==(const OptimizerConfig&) const = default;
};

struct SchedulerConfig {
  std::optional<std::string> type;  // "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR"; none = constant optimizer.lr
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;  // derived: optimizer.lr (WarmupLR, WarmupDecayLR)
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";         // "log" | "linear"
  std::optional<int64_t> total_num_steps;  // WarmupDecayLR / WarmupCosineLR; derived: training.max_steps
  double warmup_min_ratio = 0.0;           // WarmupCosineLR
  double cos_min_ratio = 0.0001;           // WarmupCosineLR
  bool operator==(const SchedulerConfig&) const = default;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  bool operator==(const Fp16Config&) const = default;
};

struct Bf16Config {
  bool enabled = false;
  bool operator==(const Bf16Config&) const = default;
};

/// The ZeRO stages (zero_optimization.stage), written once: the schema's bounds and the
/// engine's check read them.
inline constexpr int kZeroStageMin = 0, kZeroStageMax = 3;
inline constexpr bool zero_stage_valid(int64_t stage) { return stage >= kZeroStageMin && stage <= kZeroStageMax; }

struct ZeroConfig {
  int64_t stage = 0;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = false;
  bool reduce_scatter = true;
  bool contiguous_gradients = true;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  // ZeRO-Offload (DeepSpeed's offload_optimizer / offload_param sections; the legacy
  // cpu_offload* booleans mean device cpu): "none", "cpu" or "nvme" (refused by name).
  std::string offload_optimizer_device = "none";
  bool offload_optimizer_pin_memory = false;
  std::string offload_param_device = "none";
  bool offload_param_pin_memory = false;
  bool cpu_offload = false;
  bool cpu_offload_params = false;
  bool cpu_offload_use_pin_memory = false;
  bool operator==(const ZeroConfig&) const = default;
};

// Gradient compression on the wire (communication.compression): "none", "bf16", "fp16",
// "powersgd" or "topk", with the two methods' parameters.
struct CommunicationConfig {
  std::string compression = "none";
  int64_t powersgd_rank = 1;           // PyTorch's matrix_approximation_rank default
  int64_t powersgd_start_step = 1000;  // PyTorch's start_powerSGD_iter default
  bool powersgd_error_feedback = true;
  double topk_ratio = 0.01;
  bool operator==(const CommunicationConfig&) const = default;
};

struct ActivationCheckpointingConfig {
  // Recompute transformer layers in backward: true = every layer, false = none, not given =
  // the memory plan decides (train/memory_plan.h recompute_choice: none when everything
  // fits, else the fewest layers that do). True when the activation_checkpointing section is
  // present and says neither enabled nor layers.
  std::optional<bool> enabled;
  // How many layers recompute, spread evenly over the depth (Megatron's
  // --recompute-num-layers); not given: all when enabled, none when not, else the plan's.
  std::optional<int64_t> layers;
  bool operator==(const ActivationCheckpointingConfig&) const = default;
};

struct TrainingConfig {
  std::optional<int64_t> max_steps;  // exactly one of max_steps / epochs
  std::optional<int64_t> epochs;
  int64_t save_steps = 0;  // 0 = save only at the end
  int64_t eval_steps = 0;  // 0 = evaluate only at the end (when data.valid is set)
  int64_t keep_last = 2;
  std::string output_dir;  // derived: runs/<name>
  int64_t seed = 1234;
  std::string device = "auto";        // "auto" | "cpu" | "cuda"
  bool cuda_graph = true;             // replay the steady-state step as a CUDA graph (CUDA only)
  std::string name;                   // derived: the config file's stem
  std::string run_dir_mode = "0700";  // run directory permissions; files get them without x
  // Preference training (LLaMA-Factory's key names): stage "sft" or "dpo"; with dpo,
  // pref_loss picks the objective (sigmoid = DPO, orpo, simpo).
  std::string stage = "sft";
  std::string pref_loss = "sigmoid";
  double pref_beta = 0.1;
  double pref_ftx = 0.0;
  double dpo_label_smoothing = 0.0;
  double simpo_gamma = 0.5;
  std::string pref_reference = "auto";  // "auto" | "adapters_off" | "precomputed"
  bool operator==(const TrainingConfig&) const = default;
};

struct FaultToleranceConfig {
  int64_t max_retries = 3;
  double retry_delay = 5.0;             // seconds
  double heartbeat_interval = 2.0;      // seconds
  double heartbeat_timeout = 15.0;      // seconds
  double store_connect_timeout = 30.0;  // seconds an agent tries to reach the launcher's store
  double step_timeout = 0.0;            // seconds without a training step before a rank is hung; 0 = off
  double straggler_factor = 1.5;        // a rank whose compute time exceeds factor x the median ...
  int64_t straggler_window = 5;         // ... in this many consecutive progress records is a straggler
  bool operator==(const FaultToleranceConfig&) const = default;
};

// Elastic node membership (torchrun's --nnodes MIN:MAX).
struct ElasticConfig {
  int64_t min_nodes = 0;          // 0 = not elastic: every selected host, every round
  int64_t max_nodes = 0;          // 0 = every selected host (hosts beyond it are standbys)
  int64_t max_node_failures = 2;  // consecutive failed rounds blamed on one node before it is left out
  double probe_interval = 10.0;   // seconds between probes of the nodes left out while a round runs
  double probe_timeout = 15.0;    // seconds a probe of one host may take
  bool operator==(const ElasticConfig&) const = default;
};

struct SshConfig {
  std::string user;  // "" = the launcher's user
  int64_t port = 22;
  std::string identity_file;  // "" = ssh-agent / default keys
  std::string known_hosts = "~/.ssh/known_hosts";
  std::string host_key_policy = "strict";  // "strict" | "accept-new" | "off"
  double connect_timeout = 10.0;           // seconds
  double keepalive_interval = 15.0;        // seconds, 0 = off
  bool operator==(const SshConfig&) const = default;
};

struct RendezvousConfig {
  std::string address = "auto";  // "auto" = the launcher's address on network_interface
  int64_t port = 29500;          // 0 = pick a free one
  // dtrain run (ranks started by another launcher): where the job token comes from, and
  // how long a process waits for the store and its peers (pods that start late).
  std::string token_file;
  std::string token_env;
  double join_timeout = 300.0;
  bool operator==(const RendezvousConfig&) const = default;
};

struct EnvConfig {
  std::vector<std::string> forward_prefixes{"NCCL_", "CUDA_", "DTRAIN_", "OMP_", "OPENBLAS_"};
  std::map<std::string, std::string> set;
  bool operator==(const EnvConfig&) const = default;
};

// The Hugging Face files `dtrain export` and the trainer's final/ write (YAML section export).
struct ExportConfig {
  std::string dtype = "bf16";          // "bf16" | "fp32": the weights' dtype in the files
  std::string max_shard_size = "5GB";  // bytes, or a number with KB/MB/GB/TB (10^3) or KiB/MiB/GiB/TiB
  bool merge_lora = false;             // LoRA runs: also a merged full model in <dir>/merged
  bool operator==(const ExportConfig&) const = default;
};

/// A byte count as Hugging Face's max_shard_size takes it: plain digits (bytes), or a
/// number (decimals allowed) followed by B, KB, MB, GB, TB (powers of 1000, as HF) or
/// KiB, MiB, GiB, TiB (powers of 1024), case-insensitive, spaces allowed before the unit.
/// nullopt for anything else, for 0 and for a value beyond 2^63.
std::optional<uint64_t> byte_size_parse(std::string_view text);

struct TensorboardConfig {
  bool enabled = false;
  std::string output_path = "tensorboard";  // relative: against the run directory
  std::string job_name;                     // "" = none; else a subdirectory of output_path
  bool operator==(const TensorboardConfig&) const = default;
};

// `dtrain doctor` and the quick preflight before every launch round (lib/doctor).
struct DoctorConfig {
  bool preflight = true;        // quick checks on every node before each round
  double min_free_gb = 1.0;     // free space the run directory's filesystem must have
  double max_clock_skew = 5.0;  // seconds a node's clock may differ from the launcher's
  double slow_factor = 2.0;     // a node this many times below the median bandwidth is flagged
  double link_seconds = 0.5;    // time budget per link direction of the bandwidth table
  double timeout = 30.0;        // seconds for every node to answer (after the SSH connect)
  bool operator==(const DoctorConfig&) const = default;
};

// The resource monitor of every rank process (lib/monitor).
struct MonitorConfig {
  bool enabled = true;
  double interval = 10.0;        // seconds between samples
  double min_free_memory = 1.0;  // GiB of node MemAvailable under which an alert is raised; 0 = off
  double min_network = 0.05;     // MB/s under which a node whose job waits in a collective is idle; 0 = off
  std::string nvml_library = "libnvidia-ml.so.1";
  bool memory_trace = false;  // per-phase peak resident memory in each rank's log
  bool operator==(const MonitorConfig&) const = default;
};

// The links the cluster plan (`dtrain launch --dry-run`, lib/plan/plan_cluster.h) prices
// the collectives on, per GPU.
struct LinkConfig {
  double intra_node_gbytes = 360.0;  // NCCL bus bandwidth inside a node (NVLink/NVSwitch), GB/s
  double inter_node_gbits = 400.0;   // network per GPU (InfiniBand/RoCE), Gb/s
  bool operator==(const LinkConfig&) const = default;
};

struct ClusterConfig {
  SshConfig ssh;
  RendezvousConfig rendezvous;
  std::string network_interface;  // "" = the interface of the default route
  EnvConfig env;
  std::string workdir;      // "" = the launcher's working directory
  std::string dtrain_path;  // "" = the launcher's own binary path
  LinkConfig link;
  bool operator==(const ClusterConfig&) const = default;
};

struct TrainConfig {
  // DeepSpeed's batch keys as given (nullopt = not given or "auto").
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  // Filled by config_resolve_batch (0 until then).
  int64_t resolved_train_batch_size = 0;
  int64_t resolved_micro_batch_size = 0;
  int64_t resolved_grad_accum_steps = 0;
  int64_t resolved_dp_world_size = 0;

  double gradient_clipping = 0.0;  // max global grad norm, 0 = off
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;

  ModelConfig model;
  DataConfig data;
  LoraConfig lora;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero;  // YAML section zero_optimization
  CommunicationConfig communication;
  // DeepSpeed's communication_data_type ("fp16", "bf16", "fp32"): the 16-bit wire of
  // communication.compression (fp32 = none); derive() folds it in.
  std::optional<std::string> communication_data_type;
  ActivationCheckpointingConfig activation_checkpointing;
  TrainingConfig training;
  FaultToleranceConfig fault_tolerance;
  ElasticConfig elastic;
  TensorboardConfig tensorboard;  // DeepSpeed's tensorboard section
  ExportConfig hf_export;         // YAML section export (a C++ keyword)
  ClusterConfig cluster;
  DoctorConfig doctor;
  MonitorConfig monitor;

  std::string source;  // the file path, or the name given to config_load_string

  bool operator==(const TrainConfig&) const = default;
};

struct LoadedConfig {
  TrainConfig cfg;
  std::vector<std::string> warnings;  // for the caller to print (the library prints nothing)
  std::vector<std::string> notes;     // choices made for keys not given, for the dry run to say
};

// The largest config file config_load_file reads; a larger one (or a device such as
// /dev/zero) is a ConfigError naming the file.
inline constexpr uintmax_t kConfigMaxBytes = uintmax_t{16} << 20;

// Loads path (one YAML document, or DeepSpeed JSON, // and /* */ comments allowed), applies
// env overrides then `sets` ("key.path=value"). Throws IoError if the file cannot be read,
// ConfigError for anything wrong in it (message starts with file:line:column: key.path:). A
// config with any dtrain section (model, data, lora, training) must be a complete job
// (config_check_job); a pure DeepSpeed config need not. Relative input paths (data.train,
// data.valid, data.tokenizer, model.init_from, cluster.ssh.identity_file / known_hosts)
// come back absolute: from the file against its directory, from env or `sets` against the
// working directory.
LoadedConfig config_load_file(const std::string& path, const std::vector<std::string>& sets = {});
// Same from text; `name` stands for the file name in messages and in cfg.source, and
// `base_dir` for the file's directory ("" = leave the text's relative paths as written).
LoadedConfig config_load_string(std::string_view text, const std::string& name,
                                const std::vector<std::string>& sets = {}, const std::string& base_dir = "");

// config_load_file(path, sets), or, when path is "", the embedded default job
// (kDefaultConfigYaml, its relative paths against kDefaultConfigDir) with `sets`.
LoadedConfig config_load_or_default(const std::string& path, const std::vector<std::string>& sets = {});

// Throws ConfigError unless cfg describes a runnable job: model (architecture and sizes, or
// model.init_from), data.train, and one of training.max_steps / training.epochs.
void config_check_job(const TrainConfig& cfg);

// DeepSpeed's rule train_batch_size = micro * grad_accum * dp_world_size: fills the three
// resolved_* fields (and resolved_dp_world_size) from what was given; ConfigError otherwise.
void config_resolve_batch(TrainConfig& cfg, int dp_world_size);

// What one rank's batch needs, known before anything is allocated (cfg resolved by
// config_resolve_batch). Lower bounds: the activation arena, weights and the host copies of
// the step's micro-batches are counted with the fewest bytes they can take, so a job refused
// on them can never run. 0 where the model's sizes are not in the config (model.init_from).
struct BatchFootprint {
  int64_t tokens_per_micro = 0;  // micro-batch x data.seq_len: the model's 32-bit row count
  double batch_bytes = 0;        // the step's token ids and targets (micro x accumulation), host
  double activation_bytes = 0;   // one micro-batch's activations and logits
  double weight_bytes = 0;       // the model's weights (a stage-3 shard of them)
  double total() const { return batch_bytes + activation_bytes + weight_bytes; }
};
BatchFootprint config_batch_footprint(const TrainConfig& cfg);

// The rules the footprint above shares with the trainer's memory plan (train/memory_plan.h),
// written once here. The host bytes of a step's token ids and targets (int32 each): the
// step's micro-batches (resolved_grad_accum_steps, at least 1) of `tokens_per_micro` tokens.
double config_batch_token_bytes(const TrainConfig& cfg, double tokens_per_micro);
// The activation sets an arena of n_layer layers keeps with `recomputed` of them recomputed
// in backward: one per kept layer, and one the recomputed layers share.
double config_activation_sets(double n_layer, double recomputed);

// ConfigError naming train_micro_batch_size_per_gpu (and gradient_accumulation_steps) when
// the widths the trainer uses cannot hold the batch: micro x seq_len tokens above INT32_MAX.
// Called by config_resolve_batch.
void config_check_batch_widths(const TrainConfig& cfg);

// ConfigError with the numbers when `ranks` ranks' footprints exceed `memory_bytes`
// (`memory_what` says whose memory: "this machine's 23.4 GiB of memory").
void config_check_batch_memory(const TrainConfig& cfg, int ranks, double memory_bytes, const std::string& memory_what);

// config_check_batch_memory against this machine's memory (config_host_memory_bytes), which
// `ranks` CPU ranks share: whole_job = the launcher's check (all the job's ranks run here),
// else a rank's (its node's ranks; the launcher may be on another machine).
void config_check_host_batch_memory(const TrainConfig& cfg, int ranks, bool whole_job);

// This machine's physical memory in bytes (0 when unknown).
double config_host_memory_bytes();

// monitor.min_free_memory (GiB) in bytes, for a node with memory_bytes of memory (0 =
// unknown). The low_memory alert compares the node's available memory with it, which never
// exceeds the node's memory: a threshold at or above that would alert from the first sample
// and never end the episode (1e10, bytes where GiB are meant), so it is a ConfigError naming
// the key and the node's memory.
int64_t config_min_free_memory_bytes(const TrainConfig& cfg, double memory_bytes);

// An elastic round's batch: cfg resolved at ref_world (the full membership) carried to
// `world` ranks. The global batch stays when it divides exactly into micro-batches of the
// same size (gradient accumulation changes); otherwise micro-batch and accumulation stay
// and the global batch follows the world size, and `note` says so. The returned config
// has all three batch keys given and is resolved for `world`.
struct ElasticBatch {
  TrainConfig cfg;
  bool global_changed = false;
  std::string note;  // "train_batch_size 24 kept: gradient_accumulation_steps 1 -> 2 on 4 ranks" ...
};
ElasticBatch config_elastic_batch(const TrainConfig& cfg, int ref_world, int world);

// Complete YAML for cfg (every key, derived values explicit); loading it gives an equal
// config (source aside).
std::string config_to_yaml(const TrainConfig& cfg);

// Every key given or defaulted, in schema order, as (path, value as YAML flow text): the
// canonical form two processes compare to tell whether they run the same config.
std::vector<std::pair<std::string, std::string>> config_key_values(const TrainConfig& cfg);

// Every key: path, type, default, env override and help; the env knobs; every environment
// variable dtrain reads (core's env table); then the accepted DeepSpeed keys dtrain does not
// act on. For `dtrain launch --help-config`.
std::string config_help();

// The embedded default job: the contents of configs/tiny-sft.yaml at build time, and the
// directory its relative paths resolve against (the source tree's configs/).
extern const char* const kDefaultConfigYaml;
extern const char* const kDefaultConfigDir;

}  // namespace dtrain::config
