// The schema table: every config key once, with its type, bounds, env override and help.
// Defaults are the member initializers of TrainConfig (train_config.h): the table points at
// the field, so a default is written in one place only.
#include "config/schema.h"

#include "core/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace dtrain::config {

#define F(member) [](TrainConfig& c) -> FieldRef { return &c.member; }

namespace {

// Integer keys are int32 unless marked: most are narrowed to int by their consumer. The ZeRO
// element counts are size_t in the engine (zero_options.cpp), and DeepSpeed configs write
// them in the billions, so they take the full int64 range (>= their minimum); so does
// training.seed (a uint64 seed everywhere it is used).
constexpr IntWidth kSizeT = IntWidth::I64;

const std::vector<KeySpec>& build_schema() {
  static const std::vector<KeySpec> keys = {
      // ---- DeepSpeed top level
      {"train_batch_size", KeyType::INT, F(train_batch_size),
       "global batch (sequences per optimizer step) = micro * accumulation * data-parallel "
       "ranks; \"auto\" = not given",
       {}, 1, {}, false, nullptr, "from the other two batch keys and the world size"},
      {"train_micro_batch_size_per_gpu", KeyType::INT, F(train_micro_batch_size_per_gpu),
       "sequences per rank per forward/backward; \"auto\" = not given",
       {}, 1, {}, false, nullptr, "from the other two batch keys and the world size"},
      {"gradient_accumulation_steps", KeyType::INT, F(gradient_accumulation_steps),
       "micro-batches accumulated per optimizer step; \"auto\" = not given",
       {}, 1, {}, false, nullptr, "from the other two batch keys and the world size (1 if only one is given)"},
      {"gradient_clipping", KeyType::FLOAT, F(gradient_clipping),
       "clip the global gradient L2 norm to this value; 0 = off", {}, 0},
      {"steps_per_print", KeyType::INT, F(steps_per_print),
       "log loss, lr and throughput every N optimizer steps", {}, 1},
      {"wall_clock_breakdown", KeyType::BOOL, F(wall_clock_breakdown),
       "log forward/backward/step/communication times per print interval"},

      // ---- optimizer
      {"optimizer.type", KeyType::ENUM, F(optimizer.type),
       "AdamW, or Adam; Adam with weight_decay behaves as AdamW in dtrain (decoupled weight "
       "decay, as DeepSpeed's default adam_w_mode)",
       {"AdamW", "Adam"}},
      {"optimizer.params.lr", KeyType::FLOAT, F(optimizer.lr),
       "learning rate (the peak when a scheduler does not set warmup_max_lr)", {}, 0, {}, true},
      {"optimizer.params.betas", KeyType::FLOAT_PAIR, F(optimizer.betas),
       "Adam betas [beta1, beta2], each in [0, 1)", {}, 0, 1},
      {"optimizer.params.eps", KeyType::FLOAT, F(optimizer.eps), "Adam epsilon", {}, 0, {}, true},
      {"optimizer.params.weight_decay", KeyType::FLOAT, F(optimizer.weight_decay),
       "decoupled (AdamW) weight decay", {}, 0},

      // ---- scheduler (DeepSpeed's names)
      {"scheduler.type", KeyType::ENUM, F(scheduler.type),
       "learning-rate schedule; not given = constant optimizer.params.lr",
       {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}, {}, {}, false, nullptr, "none (constant lr)"},
      {"scheduler.params.warmup_min_lr", KeyType::FLOAT, F(scheduler.warmup_min_lr),
       "WarmupLR/WarmupDecayLR: lr at step 0", {}, 0},
      {"scheduler.params.warmup_max_lr", KeyType::FLOAT, F(scheduler.warmup_max_lr),
       "WarmupLR/WarmupDecayLR: lr reached after warmup (the peak)", {}, 0, {}, true, nullptr,
       "optimizer.params.lr"},
      {"scheduler.params.warmup_num_steps", KeyType::INT, F(scheduler.warmup_num_steps),
       "optimizer steps of warmup", {}, 0},
      {"scheduler.params.warmup_type", KeyType::ENUM, F(scheduler.warmup_type),
       "warmup curve from min to max lr", {"log", "linear"}},
      {"scheduler.params.total_num_steps", KeyType::INT, F(scheduler.total_num_steps),
       "WarmupDecayLR/WarmupCosineLR: step where the decay ends (> warmup_num_steps)", {}, 1, {},
       false, nullptr, "training.max_steps (with epochs: the trainer's step count)"},
      {"scheduler.params.warmup_min_ratio", KeyType::FLOAT, F(scheduler.warmup_min_ratio),
       "WarmupCosineLR: lr at step 0 as a fraction of optimizer.params.lr", {}, 0, 1},
      {"scheduler.params.cos_min_ratio", KeyType::FLOAT, F(scheduler.cos_min_ratio),
       "WarmupCosineLR: final lr as a fraction of optimizer.params.lr", {}, 0, 1},

      // ---- mixed precision
      {"fp16.enabled", KeyType::BOOL, F(fp16.enabled),
       "fp16 compute with fp32 master weights and loss scaling"},
      {"fp16.loss_scale", KeyType::FLOAT, F(fp16.loss_scale), "static loss scale; 0 = dynamic", {}, 0},
      {"fp16.initial_scale_power", KeyType::INT, F(fp16.initial_scale_power),
       "dynamic scaling starts at 2^N", {}, 0, 63},
      {"fp16.loss_scale_window", KeyType::INT, F(fp16.loss_scale_window),
       "steps without overflow before the scale doubles", {}, 1},
      {"fp16.hysteresis", KeyType::INT, F(fp16.hysteresis),
       "overflows tolerated before the scale halves", {}, 1},
      {"fp16.consecutive_hysteresis", KeyType::BOOL, F(fp16.consecutive_hysteresis),
       "refill hysteresis after every step without overflow"},
      {"fp16.min_loss_scale", KeyType::FLOAT, F(fp16.min_loss_scale),
       "training stops (TrainError) when the dynamic scale would go below this", {}, 0, {}, true},
      {"bf16.enabled", KeyType::BOOL, F(bf16.enabled),
       "bf16 compute with fp32 master weights (no loss scaling); exclusive with fp16"},

      // ---- ZeRO
      {"zero_optimization.stage", KeyType::INT, F(zero.stage),
       "0 = plain data parallel, 1 = shard optimizer state, 2 = + gradients, 3 = + parameters",
       {}, 0, 3},
      {"zero_optimization.reduce_bucket_size", KeyType::INT, F(zero.reduce_bucket_size),
       "elements per gradient reduce bucket", {}, 1, {}, false, nullptr, nullptr, kSizeT},
      {"zero_optimization.allgather_bucket_size", KeyType::INT, F(zero.allgather_bucket_size),
       "elements per parameter all-gather bucket", {}, 1, {}, false, nullptr, nullptr, kSizeT},
      {"zero_optimization.overlap_comm", KeyType::BOOL, F(zero.overlap_comm),
       "overlap gradient reduction with backward"},
      {"zero_optimization.reduce_scatter", KeyType::BOOL, F(zero.reduce_scatter),
       "stages 1-3 reduce-scatter the gradients; false is warned about and ignored"},
      {"zero_optimization.contiguous_gradients", KeyType::BOOL, F(zero.contiguous_gradients),
       "gradients are packed into contiguous reduce buckets; false is warned about and ignored"},
      {"zero_optimization.stage3_prefetch_bucket_size", KeyType::INT,
       F(zero.stage3_prefetch_bucket_size), "stage 3: elements of parameters gathered ahead", {}, 0, {}, false, nullptr, nullptr, kSizeT},
      {"zero_optimization.stage3_param_persistence_threshold", KeyType::INT,
       F(zero.stage3_param_persistence_threshold),
       "stage 3: parameters with fewer elements stay unsharded", {}, 0, {}, false, nullptr, nullptr, kSizeT},
      {"zero_optimization.stage3_max_live_parameters", KeyType::INT,
       F(zero.stage3_max_live_parameters), "stage 3: most gathered elements alive at once", {}, 1, {}, false, nullptr, nullptr, kSizeT},

      // ---- activation checkpointing
      {"activation_checkpointing.enabled", KeyType::BOOL, F(activation_checkpointing.enabled),
       "recompute each transformer layer in backward instead of storing its activations; "
       "dtrain's key: when the activation_checkpointing section is present (e.g. DeepSpeed's "
       "partition_activations) and this is not given, it is true"},

      // ---- model (dtrain)
      {"model.architecture", KeyType::ENUM, F(model.architecture),
       "gpt2 (LayerNorm, GELU MLP, learned positions) or llama (RMSNorm, SwiGLU, RoPE, GQA)",
       {"gpt2", "llama"}, {}, {}, false, nullptr, "required unless model.init_from"},
      // The maximum is data::kMaxVocabSize (2^24), the limit on a tokenizer's ids.
      {"model.vocab_size", KeyType::INT, F(model.vocab_size),
       "embedding rows; the byte tokenizer needs >= 256 + its special tokens; at most 2^24", {}, 1, 16777216, false,
       nullptr, "required unless model.init_from"},
      {"model.n_layer", KeyType::INT, F(model.n_layer), "transformer layers", {}, 1, {}, false,
       nullptr, "required unless model.init_from"},
      {"model.n_head", KeyType::INT, F(model.n_head), "attention heads", {}, 1, {}, false, nullptr,
       "required unless model.init_from"},
      {"model.n_kv_head", KeyType::INT, F(model.n_kv_head),
       "llama: key/value heads (grouped-query attention); must divide n_head", {}, 1, {}, false,
       nullptr, "model.n_head"},
      {"model.d_model", KeyType::INT, F(model.d_model), "hidden size; a multiple of n_head", {}, 1,
       {}, false, nullptr, "required unless model.init_from"},
      {"model.d_ff", KeyType::INT, F(model.d_ff), "MLP inner size", {}, 1, {}, false, nullptr,
       "gpt2: 4*d_model; llama: int(8*d_model/3) rounded up to a multiple of 256 (as Llama)"},
      {"model.max_seq_len", KeyType::INT, F(model.max_seq_len),
       "longest sequence (positions / RoPE table)", {}, 1, {}, false, nullptr, "data.seq_len"},
      {"model.rope_theta", KeyType::FLOAT, F(model.rope_theta), "llama: RoPE base", {}, 0, {}, true},
      {"model.norm_eps", KeyType::FLOAT, F(model.norm_eps), "LayerNorm/RMSNorm epsilon", {}, 0, {}, true},
      {"model.tie_embeddings", KeyType::BOOL, F(model.tie_embeddings),
       "share the token embedding with the output head", {}, {}, {}, false, nullptr,
       "gpt2: true, llama: false"},
      {"model.init_from", KeyType::STRING, F(model.init_from),
       "HF model directory (config.json + *.safetensors) to start from; its config.json gives "
       "the architecture and sizes, so those keys become optional (given ones must match)"},

      // ---- data (dtrain)
      {"data.train", KeyType::STRING, F(data.train),
       "training data path (file or directory; with data.dataset, LLaMA-Factory's dataset_dir)", {},
       {}, {}, false, nullptr, "required for a job"},
      {"data.valid", KeyType::STRING, F(data.valid), "validation data path; \"\" = none"},
      {"data.format", KeyType::ENUM, F(data.format),
       "text (plain text), alpaca (JSONL instruction/input/output), chat (JSONL messages), "
       "tokens (pre-tokenized shards)",
       {"text", "alpaca", "chat", "tokens"}},
      {"data.tokenizer", KeyType::STRING, F(data.tokenizer),
       "path to a HF tokenizer.json, or \"byte\" (256 byte tokens + specials)"},
      {"data.seq_len", KeyType::INT, F(data.seq_len),
       "tokens per training sequence (<= model.max_seq_len); at least 2: a token and the next one it predicts",
       {}, 2, {}, false, nullptr, "model.max_seq_len"},
      {"data.template", KeyType::ENUM, F(data.template_name),
       "SFT prompt/chat template, as the model family's own chat_template renders it: plain (alpaca is "
       "another name for it), chatml, qwen (ChatML with Qwen2.5's default system message), qwen3 (thinking off), "
       "llama3, llama2, mistral; auto reads it from the chat_template in tokenizer_config.json beside "
       "data.tokenizer",
       {"plain", "alpaca", "chatml", "qwen", "qwen3", "llama3", "llama2", "mistral", "auto"}},
      {"data.dataset", KeyType::STRING, F(data.dataset),
       "LLaMA-Factory dataset names (comma-separated) from the dataset_info.json of the directory data.train "
       "names (its dataset_dir); \"\" = data.train is a data file"},
      {"data.mix", KeyType::STRING_LIST, F(data.mix),
       "one weight per data.dataset name: each contributes that share of the records; [] = the datasets one after "
       "the other"},
      {"data.train_on_prompt", KeyType::BOOL, F(data.train_on_prompt),
       "SFT: train on the prompt tokens too (LLaMA-Factory's train_on_prompt); false = only the assistant turns"},
      {"data.pack", KeyType::BOOL, F(data.pack), "pack several examples into one sequence"},
      {"data.shuffle", KeyType::BOOL, F(data.shuffle), "shuffle examples each epoch (seeded)"},

      // ---- LoRA (dtrain)
      {"lora.r", KeyType::INT, F(lora.r), "LoRA rank; 0 = off (full fine-tuning), > 0 = LoRA on",
       {}, 0},
      {"lora.alpha", KeyType::FLOAT, F(lora.alpha), "LoRA scaling numerator (scale = alpha / r)",
       {}, 0, {}, true},
      {"lora.dropout", KeyType::FLOAT, F(lora.dropout), "dropout on the LoRA input", {}, 0, 1},
      {"lora.target_modules", KeyType::STRING_LIST, F(lora.target_modules),
       "projections to adapt: llama q_proj k_proj v_proj o_proj gate_proj up_proj down_proj; "
       "gpt2 c_attn c_proj c_fc",
       {}, {}, {}, false, nullptr, "llama [q_proj, v_proj], gpt2 [c_attn]"},

      // ---- training (dtrain)
      {"training.max_steps", KeyType::INT, F(training.max_steps),
       "optimizer steps to train (exclusive with epochs)", {}, 1, {}, false, "DTRAIN_MAX_STEPS",
       "none; exactly one of max_steps / epochs"},
      {"training.epochs", KeyType::INT, F(training.epochs),
       "passes over data.train (exclusive with max_steps)", {}, 1, {}, false, nullptr,
       "none; exactly one of max_steps / epochs"},
      {"training.save_steps", KeyType::INT, F(training.save_steps),
       "checkpoint every N optimizer steps; 0 = only at the end", {}, 0},
      {"training.eval_steps", KeyType::INT, F(training.eval_steps),
       "validate every N optimizer steps; 0 = only at the end", {}, 0},
      {"training.keep_last", KeyType::INT, F(training.keep_last),
       "complete checkpoints kept (older ones are deleted)", {}, 1},
      {"training.output_dir", KeyType::STRING, F(training.output_dir),
       "run directory (checkpoints, metrics, logs)", {}, {}, {}, false, "DTRAIN_OUTPUT_DIR",
       "runs/<training.name>"},
      {"training.seed", KeyType::INT, F(training.seed), "seed for init, shuffling and dropout",
       {}, 0, {}, false, "DTRAIN_SEED", nullptr, kSizeT},
      {"training.device", KeyType::ENUM, F(training.device),
       "where ranks train: cuda = the CUDA device LOCAL_RANK indexes in CUDA_VISIBLE_DEVICES, collectives over NCCL "
       "(a host without enough GPUs fails the launch before any rank starts); cpu = the CPU, over Gloo; auto = cuda "
       "where every node's agent sees a GPU for each of its ranks, else cpu (GPUs on only some nodes are refused)", {"auto", "cpu", "cuda"}, {}, {}, false,
       "DTRAIN_DEVICE"},
      {"training.cuda_graph", KeyType::BOOL, F(training.cuda_graph),
       "on CUDA, capture the steady-state step (forward, backward, reduction, optimizer) once as a CUDA graph and "
       "replay it; steps that cannot be captured run eagerly (README: CUDA graphs)",
       {}, {}, {}, false, "DTRAIN_CUDA_GRAPH"},
      {"training.name", KeyType::STRING, F(training.name), "job name", {}, {}, {}, false, nullptr,
       "the config file name without extension"},
      {"training.run_dir_mode", KeyType::ENUM, F(training.run_dir_mode),
       "permissions of the run directory (it holds the config, with cluster.env, and the "
       "checkpoints); its files get the same bits without x: 0700 = only you (files 0600), "
       "0750 / 0770 = your group may read / also write, 0755 = everyone may read",
       {"0700", "0750", "0770", "0755"}},

      // ---- fault tolerance (dtrain)
      {"fault_tolerance.max_retries", KeyType::INT, F(fault_tolerance.max_retries),
       "restarts of the whole job after a rank/node failure (from the last complete checkpoint)",
       {}, 0},
      {"fault_tolerance.retry_delay", KeyType::FLOAT, F(fault_tolerance.retry_delay),
       "seconds to wait before a restart", {}, 0},
      {"fault_tolerance.heartbeat_interval", KeyType::FLOAT, F(fault_tolerance.heartbeat_interval),
       "seconds between agent and rank heartbeats", {}, 0, {}, true},
      {"fault_tolerance.heartbeat_timeout", KeyType::FLOAT, F(fault_tolerance.heartbeat_timeout),
       "seconds without a heartbeat before a node is declared dead, or a rank hung (> "
       "heartbeat_interval)",
       {}, 0, {}, true},
      {"fault_tolerance.step_timeout", KeyType::FLOAT, F(fault_tolerance.step_timeout),
       "seconds a training rank may go without completing a step (its evaluation and checkpoint "
       "included) before it is declared hung; 0 = off (> heartbeat_interval when on)",
       {}, 0, {}, false, "DTRAIN_STEP_TIMEOUT"},
      {"fault_tolerance.straggler_factor", KeyType::FLOAT, F(fault_tolerance.straggler_factor),
       "a rank whose compute time per step (step time minus its wait in collectives) is above this factor "
       "times the median rank's, in straggler_window consecutive progress records, is flagged as a straggler "
       "(launcher output and dtrain status, naming its host)",
       {}, 1, {}, true},
      {"fault_tolerance.straggler_window", KeyType::INT, F(fault_tolerance.straggler_window),
       "consecutive progress records (one per steps_per_print steps) a rank must be slow in before it is "
       "flagged as a straggler",
       {}, 1},

      // ---- elastic membership (torchrun's --nnodes MIN:MAX; dtrain launch --nnodes sets both)
      {"elastic.min_nodes", KeyType::INT, F(elastic.min_nodes),
       "the fewest nodes a round may run on: a node that fails the probe before a round, or fails "
       "max_node_failures rounds in a row, is left out while this many remain; 0 = not elastic (every "
       "selected host in every round)",
       {}, 0},
      {"elastic.max_nodes", KeyType::INT, F(elastic.max_nodes),
       "the most nodes a round runs on (hostfile order; further hosts are standbys that replace nodes left "
       "out); 0 = every selected host",
       {}, 0},
      {"elastic.max_node_failures", KeyType::INT, F(elastic.max_node_failures),
       "consecutive failed rounds blamed on one node before an elastic job leaves it out", {}, 1},
      {"elastic.probe_interval", KeyType::FLOAT, F(elastic.probe_interval),
       "seconds between probes (the doctor's preflight checks; SSH and dtrain --version when doctor.preflight is "
       "off) of the nodes left out while a round runs; "
       "one that passes rejoins at the next checkpoint",
       {}, 0, {}, true},
      {"elastic.probe_timeout", KeyType::FLOAT, F(elastic.probe_timeout),
       "seconds a probe of one host may take before it counts as failed", {}, 0, {}, true},

      // ---- TensorBoard (DeepSpeed's section and key names)
      {"tensorboard.enabled", KeyType::BOOL, F(tensorboard.enabled),
       "rank 0 also writes the training metrics (loss, lr, grad norm, tokens/s, eval loss; the loss scale with "
       "fp16) as TensorBoard scalars: `tensorboard --logdir RUN_DIR` plots them"},
      {"tensorboard.output_path", KeyType::STRING, F(tensorboard.output_path),
       "directory of the event files; a relative path is against the run directory (\"\" = the run directory "
       "itself); a resumed run adds a new file there"},
      {"tensorboard.job_name", KeyType::STRING, F(tensorboard.job_name),
       "subdirectory of output_path for the event files (DeepSpeed writes output_path/job_name); \"\" = none"},

      // ---- cluster (dtrain)
      {"cluster.ssh.user", KeyType::STRING, F(cluster.ssh.user), "SSH user; \"\" = the launcher's user"},
      {"cluster.ssh.port", KeyType::INT, F(cluster.ssh.port),
       "SSH port for hosts whose hostfile entry gives none", {}, 1, 65535},
      {"cluster.ssh.identity_file", KeyType::STRING, F(cluster.ssh.identity_file),
       "private key file; \"\" = ssh-agent / the default keys"},
      {"cluster.ssh.known_hosts", KeyType::STRING, F(cluster.ssh.known_hosts), "known_hosts file"},
      {"cluster.ssh.host_key_policy", KeyType::ENUM, F(cluster.ssh.host_key_policy),
       "strict = host must be in known_hosts; accept-new = add unknown hosts, refuse changed "
       "keys; off = no check",
       {"strict", "accept-new", "off"}},
      {"cluster.ssh.connect_timeout", KeyType::FLOAT, F(cluster.ssh.connect_timeout),
       "seconds to connect and authenticate", {}, 0, {}, true},
      {"cluster.ssh.keepalive_interval", KeyType::FLOAT, F(cluster.ssh.keepalive_interval),
       "seconds between SSH keepalives; 0 = off", {}, 0},
      {"cluster.rendezvous.address", KeyType::STRING, F(cluster.rendezvous.address),
       "address ranks use to reach the launcher's store; auto = the launcher's address on "
       "cluster.network_interface (or its default route)",
       {}, {}, {}, false, "DTRAIN_RDZV_ADDR"},
      {"cluster.rendezvous.port", KeyType::INT, F(cluster.rendezvous.port),
       "store TCP port; 0 = pick a free one", {}, 0, 65535, false, "DTRAIN_RDZV_PORT"},
      {"cluster.rendezvous.token_file", KeyType::STRING, F(cluster.rendezvous.token_file),
       "dtrain run: file holding the job token (a mounted Kubernetes Secret); every process reads the same"},
      {"cluster.rendezvous.token_env", KeyType::STRING, F(cluster.rendezvous.token_env),
       "dtrain run: name of the environment variable holding the job token (set from a Secret)"},
      {"cluster.rendezvous.join_timeout", KeyType::FLOAT, F(cluster.rendezvous.join_timeout),
       "dtrain run: seconds a process waits for rank 0's store and for every rank to join (pods start late)",
       {}, 1, 86400},
      {"cluster.network_interface", KeyType::STRING, F(cluster.network_interface),
       "network interface for rendezvous and collectives (the launcher passes it to "
       "NCCL/Gloo); \"\" = the interface of the default route"},
      {"cluster.env.forward_prefixes", KeyType::STRING_LIST, F(cluster.env.forward_prefixes),
       "launcher env vars with these prefixes are forwarded to every rank"},
      {"cluster.env.set", KeyType::STRING_MAP, F(cluster.env.set),
       "extra env vars for every rank {NAME: value} (win over forwarded ones; for secrets: sent on the agent's "
       "stdin, never in a command line)"},
      {"cluster.workdir", KeyType::STRING, F(cluster.workdir),
       "working directory on the nodes; \"\" = the launcher's working directory"},
      {"cluster.dtrain_path", KeyType::STRING, F(cluster.dtrain_path),
       "dtrain binary on the nodes; \"\" = the launcher's own path"},

      // ---- doctor (dtrain): `dtrain doctor` and the preflight before each launch round
      {"doctor.preflight", KeyType::BOOL, F(doctor.preflight),
       "before every launch round check each node (SSH, same dtrain build, slots, shared run directory, free "
       "space) and fail the round naming the host and check",
       {}, {}, {}, false, "DTRAIN_PREFLIGHT"},
      {"doctor.min_free_gb", KeyType::FLOAT, F(doctor.min_free_gb),
       "GiB that must be free on the run directory's filesystem on every node", {}, 0},
      {"doctor.max_clock_skew", KeyType::FLOAT, F(doctor.max_clock_skew),
       "seconds a node's clock may differ from the launcher's (dtrain doctor)", {}, 0, {}, true},
      {"doctor.slow_factor", KeyType::FLOAT, F(doctor.slow_factor),
       "dtrain doctor flags a node whose best link is this many times slower than the median node", {}, 1, {}, true},
      {"doctor.link_seconds", KeyType::FLOAT, F(doctor.link_seconds),
       "seconds of traffic per link direction in the dtrain doctor bandwidth table", {}, 0, 60, true},
      {"doctor.timeout", KeyType::FLOAT, F(doctor.timeout),
       "seconds every node gets to answer the checks (after its SSH connect)", {}, 1, 3600},
  };
  return keys;
}

// DeepSpeed keys that dtrain accepts and ignores (one warning lists those present).
const std::vector<std::string> kIgnored = {
    "amp", "flops_profiler", "wandb", "csv_monitor", "comet", "monitor_config",
    "comms_logger", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "elasticity",
    "autotuning", "sparse_gradients", "prescale_gradients", "gradient_predivide_factor",
    "communication_data_type", "seq_parallel_communication_data_type", "data_types",
    "memory_breakdown", "dump_state", "sparse_attention", "pipeline", "data_efficiency",
    "curriculum_learning", "compression_training", "checkpoint", "aio", "nebula",
    "weight_quantization", "dataloader_drop_last", "disable_allgather", "fp32_allreduce",
    "graph_harvesting", "use_data_before_expert_parallelism", "hybrid_engine",
    "optimizer.params.torch_adam", "optimizer.params.adam_w_mode", "optimizer.params.bias_correction",
    "optimizer.params.amsgrad", "scheduler.params.last_batch_iteration",
    "fp16.auto_cast", "fp16.fp16_master_weights_and_grads", "bf16.immediate_grad_update",
    "bf16.check_grad_overflow", "zero_optimization.offload_optimizer",
    "zero_optimization.offload_param", "zero_optimization.cpu_offload",
    "zero_optimization.cpu_offload_params", "zero_optimization.cpu_offload_use_pin_memory",
    "zero_optimization.sub_group_size", "zero_optimization.round_robin_gradients",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_max_reuse_distance", "zero_optimization.allgather_partitions",
    "zero_optimization.load_from_fp32_weights", "zero_optimization.elastic_checkpoint",
    "zero_optimization.ignore_unused_parameters", "zero_optimization.legacy_stage1",
    "zero_optimization.zero_hpz_partition_size", "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_gradients", "zero_optimization.mics_shard_size",
    "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.memory_efficient_linear",
    "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.pipeline_loading_checkpoint", "zero_optimization.override_module_apply",
    "activation_checkpointing.partition_activations", "activation_checkpointing.cpu_checkpointing",
    "activation_checkpointing.contiguous_memory_optimization",
    "activation_checkpointing.number_checkpoints",
    "activation_checkpointing.synchronize_checkpoint_boundary",
    "activation_checkpointing.profile"};

}  // namespace

#undef F

// ---------------------------------------------------------------------------
// Lookup

const std::vector<KeySpec>& schema_keys() { return build_schema(); }

const KeySpec* schema_find(std::string_view path) {
  for (const KeySpec& k : schema_keys())
    if (path == k.path) return &k;
  return nullptr;
}

bool schema_is_section(std::string_view path) {
  if (path.empty()) return true;
  for (const KeySpec& k : schema_keys()) {
    std::string_view p(k.path);
    if (p.size() > path.size() && p.substr(0, path.size()) == path && p[path.size()] == '.')
      return true;
  }
  return false;
}

std::vector<std::string> schema_children(std::string_view section) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const KeySpec& k : schema_keys()) {
    std::string_view p(k.path);
    if (!section.empty()) {
      if (p.size() <= section.size() || p.substr(0, section.size()) != section ||
          p[section.size()] != '.')
        continue;
      p = p.substr(section.size() + 1);
    }
    std::string name(p.substr(0, p.find('.')));
    if (seen.insert(name).second) out.push_back(name);
  }
  return out;
}

const std::vector<std::string>& schema_ignored_keys() { return kIgnored; }

bool schema_is_ignored(std::string_view path) {
  return std::find(kIgnored.begin(), kIgnored.end(), path) != kIgnored.end();
}

// ---------------------------------------------------------------------------
// Typo distance

size_t key_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string key_suggest(std::string_view key, const std::vector<std::string>& candidates) {
  if (key.size() > 200) return "";  // garbage, not a typo; keeps the distance table small
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    size_t limit = std::min(key.size(), c.size()) < 5 ? 1 : 2;
    size_t d = key_distance(key, c);
    if (d <= limit && d < best_d) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------
// Describing keys (errors, help)

namespace {
std::string num_text(double v) {
  return fmt::format("{}", v);
}
}  // namespace

std::string key_type_name(const KeySpec& spec) {
  std::string bounds;
  if (spec.min && spec.max)
    bounds = fmt::format(" in [{}, {}{}", num_text(*spec.min), num_text(*spec.max), spec.type == KeyType::FLOAT_PAIR ? ")" : "]");
  else if (spec.min)
    bounds = fmt::format(" {} {}", spec.min_exclusive ? ">" : ">=", num_text(*spec.min));
  if (spec.min && spec.max && spec.min_exclusive)
    bounds = fmt::format(" in ({}, {}]", num_text(*spec.min), num_text(*spec.max));
  switch (spec.type) {
    case KeyType::BOOL: return "a boolean (true/false)";
    case KeyType::INT: return "an integer" + bounds;
    case KeyType::FLOAT: return "a number" + bounds;
    case KeyType::STRING: return "a string";
    case KeyType::ENUM: return fmt::format("one of: {}", fmt::join(spec.allowed, ", "));
    case KeyType::STRING_LIST: return "a list of strings";
    case KeyType::FLOAT_PAIR: return "a list of 2 numbers" + (bounds.empty() ? "" : "," + bounds);
    case KeyType::STRING_MAP: return "a mapping of names to strings";
  }
  return "?";
}

IntRange key_int_range(const KeySpec& spec) {
  const bool narrow = spec.width == IntWidth::I32;
  IntRange r{narrow ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min(),
             narrow ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max()};
  // Schema bounds are small integers in a double: exact, and well inside int64.
  if (spec.min) {
    auto lo = static_cast<int64_t>(std::ceil(*spec.min));
    if (spec.min_exclusive && static_cast<double>(lo) == *spec.min) ++lo;
    r.lo = std::max(r.lo, lo);
  }
  if (spec.max) r.hi = std::min(r.hi, static_cast<int64_t>(std::floor(*spec.max)));
  return r;
}

std::string key_default_text(const KeySpec& spec) {
  if (spec.derived) return spec.derived;
  TrainConfig defaults;
  FieldRef ref = spec.field(defaults);
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>) return fmt::format("{}", *p);
        else if constexpr (std::is_same_v<T, double>) return num_text(*p);
        else if constexpr (std::is_same_v<T, std::string>) return p->empty() ? "\"\"" : *p;
        else if constexpr (std::is_same_v<T, std::vector<std::string>>)
          return fmt::format("[{}]", fmt::join(*p, ", "));
        else if constexpr (std::is_same_v<T, std::array<double, 2>>)
          return fmt::format("[{}, {}]", num_text((*p)[0]), num_text((*p)[1]));
        else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>)
          return p->empty() ? "{}" : "(set)";
        else
          return p->has_value() ? "(set)" : "none";
      },
      ref);
}

}  // namespace dtrain::config
