// The schema table: every config key once, with its type, bounds, env override and help.
// Defaults are the member initializers of TrainConfig (train_config.h): the table points at
// the field, so a default is written in one place only.
#include "config/schema.h"

#include "core/check.h"
#include "core/env.h"

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
      // One row per key, laid out by hand.
      // clang-format off
      // ---- DeepSpeed top level
      {.path = "train_batch_size", .type = KeyType::INT, .field = F(train_batch_size),
       .help = "global batch (sequences per optimizer step) = micro * accumulation * data-parallel "
               "ranks; \"auto\" = not given",
       .min = 1, .derived = "from the other two batch keys and the world size"},
      {.path = "train_micro_batch_size_per_gpu", .type = KeyType::INT, .field = F(train_micro_batch_size_per_gpu),
       .help = "sequences per rank per forward/backward; \"auto\" = not given",
       .min = 1, .derived = "from the other two batch keys and the world size"},
      {.path = "gradient_accumulation_steps", .type = KeyType::INT, .field = F(gradient_accumulation_steps),
       .help = "micro-batches accumulated per optimizer step; \"auto\" = not given",
       .min = 1, .derived = "from the other two batch keys and the world size (1 if only one is given)"},
      {.path = "gradient_clipping", .type = KeyType::FLOAT, .field = F(gradient_clipping),
       .help = "clip the global gradient L2 norm to this value; 0 = off",
       .min = 0},
      {.path = "steps_per_print", .type = KeyType::INT, .field = F(steps_per_print),
       .help = "log loss, lr and throughput every N optimizer steps",
       .min = 1},
      {.path = "wall_clock_breakdown", .type = KeyType::BOOL, .field = F(wall_clock_breakdown),
       .help = "log forward/backward/step/communication times per print interval"},

      // ---- optimizer
      {.path = "optimizer.type", .type = KeyType::ENUM, .field = F(optimizer.type),
       .help = "AdamW, or Adam; Adam with weight_decay behaves as AdamW in dtrain (decoupled weight "
               "decay, as DeepSpeed's default adam_w_mode)",
       .allowed = {"AdamW", "Adam"}},
      {.path = "optimizer.params.lr", .type = KeyType::FLOAT, .field = F(optimizer.lr),
       .help = "learning rate (the peak when a scheduler does not set warmup_max_lr)",
       .min = 0, .min_exclusive = true},
      {.path = "optimizer.params.betas", .type = KeyType::FLOAT_PAIR, .field = F(optimizer.betas),
       .help = "Adam betas [beta1, beta2], each in [0, 1)",
       .min = 0, .max = 1},
      {.path = "optimizer.params.eps", .type = KeyType::FLOAT, .field = F(optimizer.eps),
       .help = "Adam epsilon",
       .min = 0, .min_exclusive = true},
      {.path = "optimizer.params.weight_decay", .type = KeyType::FLOAT, .field = F(optimizer.weight_decay),
       .help = "decoupled (AdamW) weight decay",
       .min = 0},

      // ---- scheduler (DeepSpeed's names)
      {.path = "scheduler.type", .type = KeyType::ENUM, .field = F(scheduler.type),
       .help = "learning-rate schedule; not given = constant optimizer.params.lr",
       .allowed = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}, .derived = "none (constant lr)"},
      {.path = "scheduler.params.warmup_min_lr", .type = KeyType::FLOAT, .field = F(scheduler.warmup_min_lr),
       .help = "WarmupLR/WarmupDecayLR: lr at step 0",
       .min = 0},
      {.path = "scheduler.params.warmup_max_lr", .type = KeyType::FLOAT, .field = F(scheduler.warmup_max_lr),
       .help = "WarmupLR/WarmupDecayLR: lr reached after warmup (the peak)",
       .min = 0, .min_exclusive = true, .derived = "optimizer.params.lr"},
      {.path = "scheduler.params.warmup_num_steps", .type = KeyType::INT, .field = F(scheduler.warmup_num_steps),
       .help = "optimizer steps of warmup",
       .min = 0},
      {.path = "scheduler.params.warmup_type", .type = KeyType::ENUM, .field = F(scheduler.warmup_type),
       .help = "warmup curve from min to max lr",
       .allowed = {"log", "linear"}},
      {.path = "scheduler.params.total_num_steps", .type = KeyType::INT, .field = F(scheduler.total_num_steps),
       .help = "WarmupDecayLR/WarmupCosineLR: step where the decay ends (> warmup_num_steps)",
       .min = 1, .derived = "training.max_steps (with epochs: the trainer's step count)"},
      {.path = "scheduler.params.warmup_min_ratio", .type = KeyType::FLOAT, .field = F(scheduler.warmup_min_ratio),
       .help = "WarmupCosineLR: lr at step 0 as a fraction of optimizer.params.lr",
       .min = 0, .max = 1},
      {.path = "scheduler.params.cos_min_ratio", .type = KeyType::FLOAT, .field = F(scheduler.cos_min_ratio),
       .help = "WarmupCosineLR: final lr as a fraction of optimizer.params.lr",
       .min = 0, .max = 1},

      // ---- mixed precision
      {.path = "fp16.enabled", .type = KeyType::BOOL, .field = F(fp16.enabled),
       .help = "fp16 compute with fp32 master weights and loss scaling"},
      {.path = "fp16.loss_scale", .type = KeyType::FLOAT, .field = F(fp16.loss_scale),
       .help = "static loss scale; 0 = dynamic",
       .min = 0},
      {.path = "fp16.initial_scale_power", .type = KeyType::INT, .field = F(fp16.initial_scale_power),
       .help = "dynamic scaling starts at 2^N",
       .min = 0, .max = 63},
      {.path = "fp16.loss_scale_window", .type = KeyType::INT, .field = F(fp16.loss_scale_window),
       .help = "steps without overflow before the scale doubles",
       .min = 1},
      {.path = "fp16.hysteresis", .type = KeyType::INT, .field = F(fp16.hysteresis),
       .help = "overflows tolerated before the scale halves",
       .min = 1},
      {.path = "fp16.consecutive_hysteresis", .type = KeyType::BOOL, .field = F(fp16.consecutive_hysteresis),
       .help = "refill hysteresis after every step without overflow"},
      {.path = "fp16.min_loss_scale", .type = KeyType::FLOAT, .field = F(fp16.min_loss_scale),
       .help = "training stops (TrainError) when the dynamic scale would go below this",
       .min = 0, .min_exclusive = true},
      {.path = "bf16.enabled", .type = KeyType::BOOL, .field = F(bf16.enabled),
       .help = "bf16 compute with fp32 master weights (no loss scaling); exclusive with fp16"},

      // ---- ZeRO
      {.path = "zero_optimization.stage", .type = KeyType::INT, .field = F(zero.stage),
       .help = "0 = plain data parallel, 1 = shard optimizer state, 2 = + gradients, 3 = + parameters",
       .min = kZeroStageMin, .max = kZeroStageMax},
      {.path = "zero_optimization.reduce_bucket_size", .type = KeyType::INT, .field = F(zero.reduce_bucket_size),
       .help = "elements per gradient reduce bucket",
       .min = 1, .width = kSizeT},
      {.path = "zero_optimization.allgather_bucket_size", .type = KeyType::INT, .field = F(zero.allgather_bucket_size),
       .help = "elements per parameter all-gather bucket",
       .min = 1, .width = kSizeT},
      {.path = "zero_optimization.overlap_comm", .type = KeyType::BOOL, .field = F(zero.overlap_comm),
       .help = "overlap gradient reduction with backward"},
      {.path = "zero_optimization.reduce_scatter", .type = KeyType::BOOL, .field = F(zero.reduce_scatter),
       .help = "stages 1-3 reduce-scatter the gradients; false is warned about and ignored"},
      {.path = "zero_optimization.contiguous_gradients", .type = KeyType::BOOL, .field = F(zero.contiguous_gradients),
       .help = "gradients are packed into contiguous reduce buckets; false is warned about and ignored"},
      {.path = "zero_optimization.stage3_prefetch_bucket_size", .type = KeyType::INT,
       .field = F(zero.stage3_prefetch_bucket_size),
       .help = "stage 3: elements of parameters gathered ahead, whole layers at a time: a layer larger than this "
               "is not prefetched and its gather waits (a 7-8B model's layer holds about 2.2e8 elements: 3e8 "
               "prefetches one; the dry run's cluster plan says when none fits)",
       .min = 0, .width = kSizeT},
      {.path = "zero_optimization.stage3_param_persistence_threshold", .type = KeyType::INT,
       .field = F(zero.stage3_param_persistence_threshold),
       .help = "stage 3: parameters with fewer elements stay unsharded",
       .min = 0, .width = kSizeT},
      {.path = "zero_optimization.stage3_max_live_parameters", .type = KeyType::INT,
       .field = F(zero.stage3_max_live_parameters),
       .help = "stage 3: most gathered elements alive at once",
       .min = 1, .width = kSizeT},
      {.path = "zero_optimization.offload_optimizer.device", .type = KeyType::ENUM,
       .field = F(zero.offload_optimizer_device),
       .help = "stages 1-3 on GPU ranks: cpu keeps the fp32 masters, AdamW moments and gradient shard in host "
               "memory and runs AdamW on the host (ZeRO-Offload); nvme is refused; CPU ranks hold them there already",
       .allowed = {"none", "cpu", "nvme"}},
      {.path = "zero_optimization.offload_optimizer.pin_memory", .type = KeyType::BOOL,
       .field = F(zero.offload_optimizer_pin_memory),
       .help = "page-locked host memory for the offloaded state (asynchronous copies)"},
      {.path = "zero_optimization.offload_param.device", .type = KeyType::ENUM, .field = F(zero.offload_param_device),
       .help = "stage 3 on GPU ranks: cpu keeps the compute-dtype parameter shards in host memory, fetched layer "
               "by layer with the prefetch; needs offload_optimizer cpu; nvme is refused",
       .allowed = {"none", "cpu", "nvme"}},
      {.path = "zero_optimization.offload_param.pin_memory", .type = KeyType::BOOL,
       .field = F(zero.offload_param_pin_memory),
       .help = "page-locked host memory for the offloaded parameter shards"},
      {.path = "zero_optimization.cpu_offload", .type = KeyType::BOOL, .field = F(zero.cpu_offload),
       .help = "DeepSpeed's older spelling of offload_optimizer.device cpu"},
      {.path = "zero_optimization.cpu_offload_params", .type = KeyType::BOOL, .field = F(zero.cpu_offload_params),
       .help = "DeepSpeed's older spelling of offload_param.device cpu"},
      {.path = "zero_optimization.cpu_offload_use_pin_memory", .type = KeyType::BOOL,
       .field = F(zero.cpu_offload_use_pin_memory),
       .help = "DeepSpeed's older spelling of offload_optimizer.pin_memory and offload_param.pin_memory"},

      // ---- activation checkpointing
      // ---- gradient compression (dtrain's; communication_data_type is DeepSpeed's 16-bit case)
      {.path = "communication.compression", .type = KeyType::ENUM, .field = F(communication.compression),
       .help = "gradients on the wire: none (fp32), bf16 / fp16 (16-bit, every ZeRO stage), powersgd or topk "
               "(stages 0-1, with error feedback); the mapping {powersgd: {rank: 4}} is compression: powersgd "
               "plus the communication.powersgd keys",
       .allowed = {"none", "bf16", "fp16", "powersgd", "topk"}},
      {.path = "communication.powersgd.rank", .type = KeyType::INT, .field = F(communication.powersgd_rank),
       .help = "PowerSGD: rank of the low-rank approximation (P and Q columns)",
       .min = 1},
      {.path = "communication.powersgd.start_step", .type = KeyType::INT,
       .field = F(communication.powersgd_start_step),
       .help = "PowerSGD: optimizer steps reduced uncompressed before compression starts",
       .min = 0},
      {.path = "communication.powersgd.error_feedback", .type = KeyType::BOOL,
       .field = F(communication.powersgd_error_feedback),
       .help = "PowerSGD: add what the last approximation missed to the next gradient"},
      {.path = "communication.topk.ratio", .type = KeyType::FLOAT, .field = F(communication.topk_ratio),
       .help = "top-k: fraction of each bucket's elements sent (largest magnitudes; ceil(ratio n), at least one), "
               "the rest kept as residual",
       .min = 0, .max = 1, .min_exclusive = true},
      {.path = "communication_data_type", .type = KeyType::ENUM, .field = F(communication_data_type),
       .help = "DeepSpeed's gradient wire dtype: fp16 / bf16 = communication.compression fp16 / bf16, fp32 = none",
       .allowed = {"fp16", "bf16", "fp32"}, .derived = "not given: communication.compression decides"},

      {.path = "activation_checkpointing.enabled", .type = KeyType::BOOL, .field = F(activation_checkpointing.enabled),
       .help = "recompute every transformer layer in backward instead of storing its activations (true), or none "
               "(false); dtrain's key: when the activation_checkpointing section is present (e.g. DeepSpeed's "
               "partition_activations) and neither this nor layers is given, it is true",
       .derived = "not given: the memory plan recomputes the fewest layers that fit each rank's GPU (or its share "
                  "of the node's memory on the CPU), none when everything fits; --dry-run says which and why"},
      {.path = "activation_checkpointing.layers", .type = KeyType::INT, .field = F(activation_checkpointing.layers),
       .help = "how many of the model's layers recompute in backward, spread evenly over the depth (2 of 4: the "
               "2nd and 4th); the recomputed layers share one layer's activations, so 1 saves nothing",
       .min = 0, .derived = "not given: all when enabled, none when enabled is false, else the memory plan's choice"},

      // ---- model (dtrain)
      {.path = "model.architecture", .type = KeyType::ENUM, .field = F(model.architecture),
       .help = "gpt2 (LayerNorm, GELU MLP, learned positions) or llama (RMSNorm, SwiGLU, RoPE, GQA)",
       .allowed = {"gpt2", "llama"}, .derived = "required unless model.init_from"},
      // The maximum is data::kMaxVocabSize (2^24), the limit on a tokenizer's ids.
      {.path = "model.vocab_size", .type = KeyType::INT, .field = F(model.vocab_size),
       .help = "embedding rows; the byte tokenizer needs >= 256 + its special tokens; at most 2^24",
       .min = 1, .max = 16777216, .derived = "required unless model.init_from"},
      {.path = "model.n_layer", .type = KeyType::INT, .field = F(model.n_layer),
       .help = "transformer layers",
       .min = 1, .derived = "required unless model.init_from"},
      {.path = "model.n_head", .type = KeyType::INT, .field = F(model.n_head),
       .help = "attention heads",
       .min = 1, .derived = "required unless model.init_from"},
      {.path = "model.n_kv_head", .type = KeyType::INT, .field = F(model.n_kv_head),
       .help = "llama: key/value heads (grouped-query attention); must divide n_head",
       .min = 1, .derived = "model.n_head"},
      {.path = "model.d_model", .type = KeyType::INT, .field = F(model.d_model),
       .help = "hidden size; a multiple of n_head",
       .min = 1, .derived = "required unless model.init_from"},
      {.path = "model.d_ff", .type = KeyType::INT, .field = F(model.d_ff),
       .help = "MLP inner size",
       .min = 1, .derived = "gpt2: 4*d_model; llama: int(8*d_model/3) rounded up to a multiple of 256 (as Llama)"},
      {.path = "model.max_seq_len", .type = KeyType::INT, .field = F(model.max_seq_len),
       .help = "longest sequence (positions / RoPE table)",
       .min = 1, .derived = "data.seq_len"},
      {.path = "model.rope_theta", .type = KeyType::FLOAT, .field = F(model.rope_theta),
       .help = "llama: RoPE base",
       .min = 0, .min_exclusive = true},
      {.path = "model.norm_eps", .type = KeyType::FLOAT, .field = F(model.norm_eps),
       .help = "LayerNorm/RMSNorm epsilon",
       .min = 0, .min_exclusive = true},
      {.path = "model.tie_embeddings", .type = KeyType::BOOL, .field = F(model.tie_embeddings),
       .help = "share the token embedding with the output head",
       .derived = "gpt2: true, llama: false"},
      {.path = "model.init_from", .type = KeyType::STRING, .field = F(model.init_from),
       .help = "HF model directory (config.json + *.safetensors) to start from; its config.json gives "
               "the architecture and sizes, so those keys become optional (given ones must match)"},

      // ---- data (dtrain)
      {.path = "data.train", .type = KeyType::STRING, .field = F(data.train),
       .help = "training data path (file or directory; with data.dataset, LLaMA-Factory's dataset_dir)",
       .derived = "required for a job"},
      {.path = "data.valid", .type = KeyType::STRING, .field = F(data.valid),
       .help = "validation data path; \"\" = none"},
      {.path = "data.format", .type = KeyType::ENUM, .field = F(data.format),
       .help = "text (plain text), alpaca (JSONL instruction/input/output), chat (JSONL messages), "
               "pairwise (JSONL preference records: a prompt with chosen and rejected answers, alpaca- or "
               "sharegpt-shaped), tokens (pre-tokenized shards); auto = told from the file's first records (a token "
               "shard or a directory: tokens; JSON records: pairwise when they have chosen and rejected, else "
               "alpaca or chat by their keys, an error when they are none of these; else text), and the dry run "
               "says which",
       .allowed = {"auto", "text", "alpaca", "chat", "pairwise", "tokens"}},
      {.path = "data.tokenizer", .type = KeyType::STRING, .field = F(data.tokenizer),
       .help = "path to a HF tokenizer.json, or \"byte\" (256 byte tokens + specials); not given with "
               "model.init_from: that directory's tokenizer.json when it has one"},
      {.path = "data.seq_len", .type = KeyType::INT, .field = F(data.seq_len),
       .help = "tokens per training sequence (<= model.max_seq_len); at least 2: a token and the next one it predicts",
       .min = 2, .derived = "model.max_seq_len"},
      {.path = "data.template", .type = KeyType::ENUM, .field = F(data.template_name),
       .help = "SFT prompt/chat template, as the model family's own chat_template renders it: plain (alpaca is "
               "another name for it), chatml, qwen (ChatML with Qwen2.5's default system message), qwen3 (thinking "
               "off), llama3, llama2, mistral; auto reads it from the chat_template in tokenizer_config.json beside "
               "data.tokenizer (the default with model.init_from when that file has a chat_template)",
       .allowed = {"plain", "alpaca", "chatml", "qwen", "qwen3", "llama3", "llama2", "mistral", "auto"}},
      {.path = "data.dataset", .type = KeyType::STRING, .field = F(data.dataset),
       .help = "LLaMA-Factory dataset names (comma-separated) from the dataset_info.json of the directory "
               "data.train names (its dataset_dir); \"\" = data.train is a data file"},
      {.path = "data.mix", .type = KeyType::STRING_LIST, .field = F(data.mix),
       .help = "one weight per data.dataset name: each contributes that share of the records; [] = the datasets "
               "one after the other"},
      {.path = "data.train_on_prompt", .type = KeyType::BOOL, .field = F(data.train_on_prompt),
       .help = "SFT: train on the prompt tokens too (LLaMA-Factory's train_on_prompt); false = only the assistant "
               "turns"},
      {.path = "data.pack", .type = KeyType::BOOL, .field = F(data.pack),
       .help = "pack several examples into one sequence; false = one example per sequence, padded. Pairwise "
               "(preference) data is never packed: true with it is an error",
       .derived = "true, except for pairwise data (false)"},
      {.path = "data.neat_packing", .type = KeyType::BOOL, .field = F(data.neat_packing),
       .help = "with data.pack: whole examples packed into each sequence (never cut; the rest padded), each "
               "attending only to itself with positions from its own start, as if alone in its sequence "
               "(LLaMA-Factory's neat_packing); false = plain packing, the examples' token stream cut into "
               "sequences with attention across examples (the usual pre-training stream). No effect without packing",
       .derived = "true for SFT records and token shards with a prompt mask; false for text and unmasked token "
                  "shards (pre-training streams)"},
      {.path = "data.shuffle", .type = KeyType::BOOL, .field = F(data.shuffle),
       .help = "shuffle examples each epoch (seeded)"},

      // ---- LoRA (dtrain)
      {.path = "lora.r", .type = KeyType::INT, .field = F(lora.r),
       .help = "LoRA rank; 0 = off (full fine-tuning), > 0 = LoRA on",
       .min = 0},
      {.path = "lora.alpha", .type = KeyType::FLOAT, .field = F(lora.alpha),
       .help = "LoRA scaling numerator (scale = alpha / r)",
       .min = 0, .min_exclusive = true},
      {.path = "lora.dropout", .type = KeyType::FLOAT, .field = F(lora.dropout),
       .help = "dropout on the LoRA input",
       .min = 0, .max = 1},
      {.path = "lora.target_modules", .type = KeyType::STRING_LIST, .field = F(lora.target_modules),
       .help = "projections to adapt: llama q_proj k_proj v_proj o_proj gate_proj up_proj down_proj; "
               "gpt2 c_attn c_proj c_fc",
       .derived = "llama [q_proj, v_proj], gpt2 [c_attn]"},

      // ---- training (dtrain)
      {.path = "training.max_steps", .type = KeyType::INT, .field = F(training.max_steps),
       .help = "optimizer steps to train (exclusive with epochs)",
       .min = 1, .env = "DTRAIN_MAX_STEPS", .derived = "none; exactly one of max_steps / epochs"},
      {.path = "training.epochs", .type = KeyType::INT, .field = F(training.epochs),
       .help = "passes over data.train (exclusive with max_steps)",
       .min = 1, .derived = "none; exactly one of max_steps / epochs"},
      {.path = "training.save_steps", .type = KeyType::INT, .field = F(training.save_steps),
       .help = "checkpoint every N optimizer steps; 0 = only at the end",
       .min = 0},
      {.path = "training.eval_steps", .type = KeyType::INT, .field = F(training.eval_steps),
       .help = "validate every N optimizer steps; 0 = only at the end",
       .min = 0},
      {.path = "training.keep_last", .type = KeyType::INT, .field = F(training.keep_last),
       .help = "complete checkpoints kept (older ones are deleted)",
       .min = 1},
      {.path = "training.output_dir", .type = KeyType::STRING, .field = F(training.output_dir),
       .help = "run directory (checkpoints, metrics, logs)",
       .env = "DTRAIN_OUTPUT_DIR", .derived = "runs/<training.name>"},
      {.path = "training.seed", .type = KeyType::INT, .field = F(training.seed),
       .help = "seed for init, shuffling and dropout",
       .min = 0, .env = "DTRAIN_SEED", .width = kSizeT},
      {.path = "training.device", .type = KeyType::ENUM, .field = F(training.device),
       .help =
           "where ranks train: cuda = the CUDA device LOCAL_RANK indexes in CUDA_VISIBLE_DEVICES, collectives over NCCL "
           "(a host without enough GPUs fails the launch before any rank starts); cpu = the CPU, over Gloo; auto = cuda "
           "where every node's agent sees a GPU for each of its ranks, else cpu (GPUs on only some nodes are refused)",
       .allowed = {"auto", "cpu", "cuda"}, .env = "DTRAIN_DEVICE"},
      {.path = "training.cuda_graph", .type = KeyType::BOOL, .field = F(training.cuda_graph),
       .help =
           "on CUDA, capture the steady-state step (forward, backward, reduction, optimizer) once as a CUDA graph and "
           "replay it; steps that cannot be captured run eagerly (docs/gpu.md: CUDA graphs)",
       .env = "DTRAIN_CUDA_GRAPH"},
      {.path = "training.name", .type = KeyType::STRING, .field = F(training.name),
       .help = "job name",
       .derived = "the config file name without extension"},
      {.path = "training.run_dir_mode", .type = KeyType::ENUM, .field = F(training.run_dir_mode),
       .help = "permissions of the run directory (it holds the config, with cluster.env, and the "
               "checkpoints); its files get the same bits without x: 0700 = only you (files 0600), "
               "0750 / 0770 = your group may read / also write, 0755 = everyone may read",
       .allowed = {"0700", "0750", "0770", "0755"}},

      {.path = "training.stage", .type = KeyType::ENUM, .field = F(training.stage),
       .help = "what is trained: sft = supervised fine-tuning (text, alpaca, chat data); dpo = preference "
               "optimisation on pairwise data (chosen/rejected), with the objective training.pref_loss "
               "(LLaMA-Factory's stage; ppo, kto and rm are not built)",
       .allowed = {"sft", "dpo"}},
      {.path = "training.pref_loss", .type = KeyType::ENUM, .field = F(training.pref_loss),
       .help = "stage dpo's objective: sigmoid = DPO (a reference model), orpo = odds-ratio preference "
               "optimisation, simpo = length-normalised margin objective (both reference-free)",
       .allowed = {"sigmoid", "orpo", "simpo"}},
      {.path = "training.pref_beta", .type = KeyType::FLOAT, .field = F(training.pref_beta),
       .help = "DPO/SimPO beta (reward scale); ORPO: the weight of the odds-ratio term",
       .min = 0, .min_exclusive = true},
      {.path = "training.pref_ftx", .type = KeyType::FLOAT, .field = F(training.pref_ftx),
       .help = "weight of an SFT term (the chosen answer's mean token log-probability) added to the preference loss",
       .min = 0},
      {.path = "training.dpo_label_smoothing", .type = KeyType::FLOAT, .field = F(training.dpo_label_smoothing),
       .help = "DPO (pref_loss sigmoid): the assumed probability that a pair's labels are flipped",
       .min = 0, .max = 0.5},
      {.path = "training.simpo_gamma", .type = KeyType::FLOAT, .field = F(training.simpo_gamma),
       .help = "SimPO's target reward margin",
       .min = 0},
      {.path = "training.pref_reference", .type = KeyType::ENUM, .field = F(training.pref_reference),
       .help = "DPO's reference log-probabilities: adapters_off = the base model with the LoRA adapters switched "
               "off, computed in each step (LoRA only, no second copy); precomputed = computed once before "
               "training with the starting weights and kept in the run directory; auto = adapters_off under "
               "LoRA, else precomputed",
       .allowed = {"auto", "adapters_off", "precomputed"}},

      // ---- fault tolerance (dtrain)
      {.path = "fault_tolerance.max_retries", .type = KeyType::INT, .field = F(fault_tolerance.max_retries),
       .help = "restarts of the whole job after a rank/node failure (from the last complete checkpoint)",
       .min = 0},
      {.path = "fault_tolerance.retry_delay", .type = KeyType::FLOAT, .field = F(fault_tolerance.retry_delay),
       .help = "seconds to wait before a restart",
       .min = 0},
      {.path = "fault_tolerance.heartbeat_interval", .type = KeyType::FLOAT,
       .field = F(fault_tolerance.heartbeat_interval),
       .help = "seconds between agent and rank heartbeats",
       .min = 0, .min_exclusive = true},
      {.path = "fault_tolerance.heartbeat_timeout", .type = KeyType::FLOAT,
       .field = F(fault_tolerance.heartbeat_timeout),
       .help = "seconds without a heartbeat before a node is declared dead, or a rank hung (> "
               "heartbeat_interval)",
       .min = 0, .min_exclusive = true},
      {.path = "fault_tolerance.store_connect_timeout", .type = KeyType::FLOAT,
       .field = F(fault_tolerance.store_connect_timeout),
       .help = "seconds each node's agent keeps trying to reach the launcher's rendezvous store before it gives "
               "up and says why (the launcher starts the store before any agent, so only an unreachable address, "
               "a firewall or a slow network makes it wait)",
       .min = 0, .min_exclusive = true},
      {.path = "fault_tolerance.step_timeout", .type = KeyType::FLOAT, .field = F(fault_tolerance.step_timeout),
       .help = "seconds a training rank may go without completing a step (its evaluation and checkpoint "
               "included) before it is declared hung; 0 = off (> heartbeat_interval when on)",
       .min = 0, .env = "DTRAIN_STEP_TIMEOUT"},
      {.path = "fault_tolerance.straggler_factor", .type = KeyType::FLOAT,
       .field = F(fault_tolerance.straggler_factor),
       .help =
           "a rank whose compute time per step (step time minus its wait in collectives) is above this factor "
           "times the median rank's, in straggler_window consecutive progress records, is flagged as a straggler "
           "(launcher output and dtrain status, naming its host)",
       .min = 1, .min_exclusive = true},
      {.path = "fault_tolerance.straggler_window", .type = KeyType::INT, .field = F(fault_tolerance.straggler_window),
       .help = "consecutive progress records (one per steps_per_print steps) a rank must be slow in before it is "
               "flagged as a straggler",
       .min = 1},

      // ---- elastic membership (torchrun's --nnodes MIN:MAX; dtrain launch --nnodes sets both)
      {.path = "elastic.min_nodes", .type = KeyType::INT, .field = F(elastic.min_nodes),
       .help =
           "the fewest nodes a round may run on: a node that fails the probe before a round, or fails "
           "max_node_failures rounds in a row, is left out while this many remain; 0 = not elastic (every "
           "selected host in every round)",
       .min = 0},
      {.path = "elastic.max_nodes", .type = KeyType::INT, .field = F(elastic.max_nodes),
       .help = "the most nodes a round runs on (hostfile order; further hosts are standbys that replace nodes left "
               "out); 0 = every selected host",
       .min = 0},
      {.path = "elastic.max_node_failures", .type = KeyType::INT, .field = F(elastic.max_node_failures),
       .help = "consecutive failed rounds blamed on one node before an elastic job leaves it out",
       .min = 1},
      {.path = "elastic.probe_interval", .type = KeyType::FLOAT, .field = F(elastic.probe_interval),
       .help =
           "seconds between probes (the doctor's preflight checks; SSH and dtrain --version when doctor.preflight is "
           "off) of the nodes left out while a round runs; "
           "one that passes rejoins at the next checkpoint",
       .min = 0, .min_exclusive = true},
      {.path = "elastic.probe_timeout", .type = KeyType::FLOAT, .field = F(elastic.probe_timeout),
       .help = "seconds a probe of one host may take before it counts as failed",
       .min = 0, .min_exclusive = true},

      // ---- TensorBoard (DeepSpeed's section and key names)
      {.path = "tensorboard.enabled", .type = KeyType::BOOL, .field = F(tensorboard.enabled),
       .help = "rank 0 also writes the training metrics (loss, lr, grad norm, tokens/s, eval loss; the loss scale with "
               "fp16) as TensorBoard scalars: `tensorboard --logdir RUN_DIR` plots them"},
      {.path = "tensorboard.output_path", .type = KeyType::STRING, .field = F(tensorboard.output_path),
       .help = "directory of the event files; a relative path is against the run directory (\"\" = the run directory "
               "itself); a resumed run adds a new file there"},
      {.path = "tensorboard.job_name", .type = KeyType::STRING, .field = F(tensorboard.job_name),
       .help = "subdirectory of output_path for the event files (DeepSpeed writes output_path/job_name); \"\" = none"},

      // ---- export (dtrain): the Hugging Face files of `dtrain export` and the trainer's final/
      {.path = "export.dtype", .type = KeyType::ENUM, .field = F(hf_export.dtype),
       .help = "dtype of the exported weights: bf16 (rounded to nearest even from the fp32 masters, as "
               "save_pretrained of a bf16 model) or fp32 (the masters exactly); config.json's torch_dtype says which",
       .allowed = {"bf16", "fp32"}},
      {.path = "export.max_shard_size", .type = KeyType::STRING, .field = F(hf_export.max_shard_size),
       .help = "largest safetensors file, as save_pretrained's max_shard_size: bytes, or a number with KB, MB, GB, TB "
               "(powers of 1000) or KiB, MiB, GiB, TiB; a larger model is split into model-0000k-of-0000n.safetensors "
               "+ model.safetensors.index.json, a tensor larger than it alone in its file"},
      {.path = "export.merge_lora", .type = KeyType::BOOL, .field = F(hf_export.merge_lora),
       .help = "LoRA runs: besides the base model and the PEFT adapter, write the adapters merged into the weights "
               "(W + alpha/r * B A) as a full model in <export dir>/merged"},

      // ---- cluster (dtrain)
      {.path = "cluster.ssh.user", .type = KeyType::STRING, .field = F(cluster.ssh.user),
       .help = "SSH user; \"\" = the launcher's user"},
      {.path = "cluster.ssh.port", .type = KeyType::INT, .field = F(cluster.ssh.port),
       .help = "SSH port for hosts whose hostfile entry gives none",
       .min = 1, .max = 65535},
      {.path = "cluster.ssh.identity_file", .type = KeyType::STRING, .field = F(cluster.ssh.identity_file),
       .help = "private key file; \"\" = ssh-agent / the default keys"},
      {.path = "cluster.ssh.known_hosts", .type = KeyType::STRING, .field = F(cluster.ssh.known_hosts),
       .help = "known_hosts file"},
      {.path = "cluster.ssh.host_key_policy", .type = KeyType::ENUM, .field = F(cluster.ssh.host_key_policy),
       .help = "strict = host must be in known_hosts; accept-new = add unknown hosts, refuse changed "
               "keys; off = no check",
       .allowed = {"strict", "accept-new", "off"}},
      {.path = "cluster.ssh.connect_timeout", .type = KeyType::FLOAT, .field = F(cluster.ssh.connect_timeout),
       .help = "seconds to connect and authenticate",
       .min = 0, .min_exclusive = true},
      {.path = "cluster.ssh.keepalive_interval", .type = KeyType::FLOAT, .field = F(cluster.ssh.keepalive_interval),
       .help = "seconds between SSH keepalives; 0 = off",
       .min = 0},
      {.path = "cluster.rendezvous.address", .type = KeyType::STRING, .field = F(cluster.rendezvous.address),
       .help = "address ranks use to reach the launcher's store; auto = the launcher's address on "
               "cluster.network_interface (or its default route)",
       .env = "DTRAIN_RDZV_ADDR"},
      {.path = "cluster.rendezvous.port", .type = KeyType::INT, .field = F(cluster.rendezvous.port),
       .help = "store TCP port; 0 = pick a free one",
       .min = 0, .max = 65535, .env = "DTRAIN_RDZV_PORT"},
      {.path = "cluster.rendezvous.token_file", .type = KeyType::STRING, .field = F(cluster.rendezvous.token_file),
       .help = "dtrain run: file holding the job token (a mounted Kubernetes Secret); every process reads the same"},
      {.path = "cluster.rendezvous.token_env", .type = KeyType::STRING, .field = F(cluster.rendezvous.token_env),
       .help = "dtrain run: name of the environment variable holding the job token (set from a Secret)"},
      {.path = "cluster.rendezvous.join_timeout", .type = KeyType::FLOAT, .field = F(cluster.rendezvous.join_timeout),
       .help = "dtrain run: seconds a process waits for rank 0's store and for every rank to join (pods start late)",
       .min = 1, .max = 86400},
      {.path = "cluster.network_interface", .type = KeyType::STRING, .field = F(cluster.network_interface),
       .help = "network interface for rendezvous and collectives (the launcher passes it to "
               "NCCL/Gloo); \"\" = the interface of the default route"},
      {.path = "cluster.env.forward_prefixes", .type = KeyType::STRING_LIST, .field = F(cluster.env.forward_prefixes),
       .help = "launcher env vars with these prefixes are forwarded to every rank"},
      {.path = "cluster.env.set", .type = KeyType::STRING_MAP, .field = F(cluster.env.set),
       .help = "extra env vars for every rank {NAME: value} (win over forwarded ones; for secrets: sent on the agent's "
               "stdin, never in a command line)"},
      {.path = "cluster.workdir", .type = KeyType::STRING, .field = F(cluster.workdir),
       .help = "working directory on the nodes; \"\" = the launcher's working directory"},
      {.path = "cluster.dtrain_path", .type = KeyType::STRING, .field = F(cluster.dtrain_path),
       .help = "dtrain binary on the nodes; \"\" = the launcher's own path"},
      {.path = "cluster.link.intra_node_gbytes", .type = KeyType::FLOAT, .field = F(cluster.link.intra_node_gbytes),
       .help = "the cluster plan (--dry-run): NCCL bus bandwidth between the GPUs of a node (NVLink/NVSwitch), GB/s; "
               "the default is an H100 SXM node's ring all-reduce busbw (nccl-tests); give your all_reduce_perf figure",
       .min = 0, .min_exclusive = true},
      {.path = "cluster.link.inter_node_gbits", .type = KeyType::FLOAT, .field = F(cluster.link.inter_node_gbits),
       .help = "the cluster plan (--dry-run): network bandwidth between nodes per GPU (InfiniBand/RoCE, one NIC per "
               "GPU), Gb/s: the line rate (400 = NDR), or a measured figure: `dtrain doctor`'s bandwidth table between two "
               "nodes (GB/s x 8) or ib_write_bw's, divided by the GPUs that share that NIC",
       .min = 0, .min_exclusive = true},

      // ---- doctor (dtrain): `dtrain doctor` and the preflight before each launch round
      {.path = "doctor.preflight", .type = KeyType::BOOL, .field = F(doctor.preflight),
       .help = "before every launch round check each node (SSH, same dtrain build, slots, shared run directory, free "
               "space) and fail the round naming the host and check",
       .env = "DTRAIN_PREFLIGHT"},
      {.path = "doctor.min_free_gb", .type = KeyType::FLOAT, .field = F(doctor.min_free_gb),
       .help = "GiB that must be free on the run directory's filesystem on every node",
       .min = 0},
      {.path = "doctor.max_clock_skew", .type = KeyType::FLOAT, .field = F(doctor.max_clock_skew),
       .help = "seconds a node's clock may differ from the launcher's (dtrain doctor)",
       .min = 0, .min_exclusive = true},
      {.path = "doctor.slow_factor", .type = KeyType::FLOAT, .field = F(doctor.slow_factor),
       .help = "dtrain doctor flags a node whose best link is this many times slower than the median node",
       .min = 1, .min_exclusive = true},
      {.path = "doctor.link_seconds", .type = KeyType::FLOAT, .field = F(doctor.link_seconds),
       .help = "seconds of traffic per link direction in the dtrain doctor bandwidth table",
       .min = 0, .max = 60, .min_exclusive = true},
      {.path = "doctor.timeout", .type = KeyType::FLOAT, .field = F(doctor.timeout),
       .help = "seconds every node gets to answer the checks (after its SSH connect)",
       .min = 1, .max = 3600},

      // ---- monitor (dtrain): the resource sampler thread of every rank process
      {.path = "monitor.enabled", .type = KeyType::BOOL, .field = F(monitor.enabled),
       .help = "every rank samples its process and node (CPU, memory, network, free space of the run directory) and "
               "its GPU (NVML) into records of \"kind\": \"resource\" in its own file RUN_DIR/resources/rank<R>.jsonl; "
               "alerts go to the same file and, copied by the launcher, to events.jsonl"},
      {.path = "monitor.interval", .type = KeyType::FLOAT, .field = F(monitor.interval),
       .help = "seconds between two resource samples of a rank",
       .min = 0.05, .max = 86400},
      {.path = "monitor.min_free_memory", .type = KeyType::FLOAT, .field = F(monitor.min_free_memory),
       .help = "GiB: a node whose available memory (MemAvailable) falls below this raises one resource_alert per "
               "episode in events.jsonl (the episode ends once it has 5 % of this, at least 256 MiB, more again); "
               "0 = no such alert; at or above the node's memory it is refused when the ranks start",
       .min = 0},
      {.path = "monitor.min_network", .type = KeyType::FLOAT, .field = F(monitor.min_network),
       .help = "MB/s: a node whose network traffic (received + sent, loopback excluded) stays under this for two "
               "samples in a row while every rank of the job is in a collective for at least half of its interval "
               "raises one network_idle resource_alert per episode (decided by the launcher, jobs over several hosts "
               "only); 0 = no such alert",
       .min = 0},
      {.path = "monitor.nvml_library", .type = KeyType::STRING, .field = F(monitor.nvml_library),
       .help = "the NVML library the monitor dlopens for GPU figures (none found: the records have no GPU fields, "
               "said once in the rank's log); \"\" = an NVML linked into the program (the CUDA execution engine's)"},
      {.path = "monitor.memory_trace", .type = KeyType::BOOL, .field = F(monitor.memory_trace),
       .help = "each rank logs, after its final export, the peak resident memory of every phase (build, data, "
               "forward, backward, optimizer, evaluation, checkpoint, export; the largest over the steps) beside the "
               "memory plan of --dry-run, from the kernel's high-water mark reset at each phase boundary, with the "
               "device allocator's bytes in use and held",
       .env = "DTRAIN_MEMORY_TRACE"},
      // clang-format on
  };
  return keys;
}

// A knob's help is its row's meaning in the env table (core/env.cpp), which lists every
// variable dtrain reads; a knob without a row is a bug.
const char* knob_help(const char* name) {
  const EnvVar* v = env_find(name);
  DT_ENFORCE(v && v->kind == EnvKind::KNOB, InternalError, "env knob {} has no KNOB row in the env table", name);
  return v->meaning;
}

const std::vector<KeySpec>& build_env_knobs() {
  static const std::vector<KeySpec> knobs = {
      // clang-format off
      {.path = "DTRAIN_ATTN_VARIANT", .type = KeyType::ENUM, .field = nullptr, .help = knob_help("DTRAIN_ATTN_VARIANT"),
       .allowed = {"legacy", "fa2", "hopper"}, .env = "DTRAIN_ATTN_VARIANT", .derived = "legacy"},
      {.path = "DTRAIN_GEMM_ALGO_CACHE", .type = KeyType::STRING, .field = nullptr,
       .help = knob_help("DTRAIN_GEMM_ALGO_CACHE"), .env = "DTRAIN_GEMM_ALGO_CACHE",
       .derived = "unset: a training rank's <run dir>/gemm_algos.txt; other commands keep them in memory only"},
      {.path = "DTRAIN_LOG_LEVEL", .type = KeyType::ENUM, .field = nullptr, .help = knob_help("DTRAIN_LOG_LEVEL"),
       .allowed = {"debug", "info", "warn", "error", "off"}, .env = "DTRAIN_LOG_LEVEL", .derived = "info"},
      {.path = "DTRAIN_NORM_BACKWARD", .type = KeyType::ENUM, .field = nullptr,
       .help = knob_help("DTRAIN_NORM_BACKWARD"), .allowed = {"split", "fused"}, .env = "DTRAIN_NORM_BACKWARD",
       .derived = "split"},
      {.path = "DTRAIN_NUM_THREADS", .type = KeyType::INT, .field = nullptr, .help = knob_help("DTRAIN_NUM_THREADS"),
       .min = 1, .max = 1024, .env = "DTRAIN_NUM_THREADS",
       .derived = "$OMP_NUM_THREADS (the launcher sets it to the node's cores / its local ranks), else the "
                  "hardware threads"},
      {.path = "DTRAIN_POOL_SPIN_US", .type = KeyType::INT, .field = nullptr, .help = knob_help("DTRAIN_POOL_SPIN_US"),
       .min = 0, .max = 100000, .env = "DTRAIN_POOL_SPIN_US", .derived = "200"},
      {.path = "DTRAIN_WORKER_PRINT_ENV", .type = KeyType::STRING, .field = nullptr,
       .help = knob_help("DTRAIN_WORKER_PRINT_ENV"), .env = "DTRAIN_WORKER_PRINT_ENV",
       .derived = "unset: nothing printed"},
      // clang-format on
  };
  return knobs;
}

// DeepSpeed keys that dtrain accepts and ignores (one warning lists those present).
const std::vector<std::string> kIgnored = {"amp",
                                           "flops_profiler",
                                           "wandb",
                                           "csv_monitor",
                                           "comet",
                                           "monitor_config",
                                           "comms_logger",
                                           "zero_allow_untested_optimizer",
                                           "zero_force_ds_cpu_optimizer",
                                           "elasticity",
                                           "autotuning",
                                           "sparse_gradients",
                                           "prescale_gradients",
                                           "gradient_predivide_factor",
                                           "seq_parallel_communication_data_type",
                                           "data_types",
                                           "memory_breakdown",
                                           "dump_state",
                                           "sparse_attention",
                                           "pipeline",
                                           "data_efficiency",
                                           "curriculum_learning",
                                           "compression_training",
                                           "checkpoint",
                                           "aio",
                                           "nebula",
                                           "weight_quantization",
                                           "dataloader_drop_last",
                                           "disable_allgather",
                                           "fp32_allreduce",
                                           "graph_harvesting",
                                           "use_data_before_expert_parallelism",
                                           "hybrid_engine",
                                           "optimizer.params.torch_adam",
                                           "optimizer.params.adam_w_mode",
                                           "optimizer.params.bias_correction",
                                           "optimizer.params.amsgrad",
                                           "scheduler.params.last_batch_iteration",
                                           "fp16.auto_cast",
                                           "fp16.fp16_master_weights_and_grads",
                                           "bf16.immediate_grad_update",
                                           "bf16.check_grad_overflow",
                                           "zero_optimization.offload_optimizer.buffer_count",
                                           "zero_optimization.offload_optimizer.fast_init",
                                           "zero_optimization.offload_optimizer.ratio",
                                           "zero_optimization.offload_optimizer.nvme_path",
                                           "zero_optimization.offload_optimizer.pipeline",
                                           "zero_optimization.offload_optimizer.pipeline_read",
                                           "zero_optimization.offload_optimizer.pipeline_write",
                                           "zero_optimization.offload_param.buffer_count",
                                           "zero_optimization.offload_param.buffer_size",
                                           "zero_optimization.offload_param.max_in_cpu",
                                           "zero_optimization.offload_param.nvme_path",
                                           "zero_optimization.sub_group_size",
                                           "zero_optimization.round_robin_gradients",
                                           "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                                           "zero_optimization.stage3_gather_fp16_weights_on_model_save",
                                           "zero_optimization.gather_16bit_weights_on_model_save",
                                           "zero_optimization.stage3_max_reuse_distance",
                                           "zero_optimization.allgather_partitions",
                                           "zero_optimization.load_from_fp32_weights",
                                           "zero_optimization.elastic_checkpoint",
                                           "zero_optimization.ignore_unused_parameters",
                                           "zero_optimization.legacy_stage1",
                                           "zero_optimization.zero_hpz_partition_size",
                                           "zero_optimization.zero_quantized_weights",
                                           "zero_optimization.zero_quantized_gradients",
                                           "zero_optimization.mics_shard_size",
                                           "zero_optimization.mics_hierarchical_params_gather",
                                           "zero_optimization.memory_efficient_linear",
                                           "zero_optimization.use_multi_rank_bucket_allreduce",
                                           "zero_optimization.stage3_module_granularity_threshold",
                                           "zero_optimization.pipeline_loading_checkpoint",
                                           "zero_optimization.override_module_apply",
                                           "activation_checkpointing.partition_activations",
                                           "activation_checkpointing.cpu_checkpointing",
                                           "activation_checkpointing.contiguous_memory_optimization",
                                           "activation_checkpointing.number_checkpoints",
                                           "activation_checkpointing.synchronize_checkpoint_boundary",
                                           "activation_checkpointing.profile",
                                           "timers",
                                           "compile",
                                           "eigenvalue",
                                           "progressive_layer_drop",
                                           "quantize_training",
                                           "tensor_parallel",
                                           "zero_optimization.stage3_model_persistence_threshold",
                                           "zero_optimization.stage3_use_all_reduce_for_fetch_params",
                                           "zero_optimization.zero_quantized_nontrainable_weights",
                                           "zero_optimization.zeropp_loco_param",
                                           "zero_optimization.log_trace_cache_warnings"};

// LLaMA-Factory / HF TrainingArguments / PEFT names and where dtrain keeps them. Full paths
// first (a name inside the section dtrain uses), then bare names anywhere in the document.
const std::pair<const char*, const char*> kForeign[] = {
    {"lora.rank", "lora.r"},
    {"lora.lora_rank", "lora.r"},
    {"lora.lora_alpha", "lora.alpha"},
    {"lora.lora_dropout", "lora.dropout"},
    {"lora.target", "lora.target_modules"},
    {"lora.lora_target", "lora.target_modules"},
    {"learning_rate", "optimizer.params.lr"},
    {"lr", "optimizer.params.lr"},
    {"weight_decay", "optimizer.params.weight_decay"},
    {"adam_epsilon", "optimizer.params.eps"},
    {"adam_beta1", "optimizer.params.betas (as [beta1, beta2])"},
    {"adam_beta2", "optimizer.params.betas (as [beta1, beta2])"},
    {"optim", "optimizer.type"},
    {"max_grad_norm", "gradient_clipping"},
    {"per_device_train_batch_size", "train_micro_batch_size_per_gpu"},
    {"lr_scheduler_type", "scheduler.type (WarmupLR, WarmupDecayLR, WarmupCosineLR)"},
    {"warmup_steps", "scheduler.params.warmup_num_steps"},
    {"warmup_ratio", "scheduler.params.warmup_num_steps (a step count, not a ratio)"},
    {"num_train_epochs", "training.epochs"},
    {"max_steps", "training.max_steps"},
    {"save_steps", "training.save_steps"},
    {"eval_steps", "training.eval_steps"},
    {"save_total_limit", "training.keep_last"},
    {"output_dir", "training.output_dir"},
    {"seed", "training.seed"},
    {"logging_steps", "steps_per_print"},
    {"run_name", "training.name"},
    {"model_name_or_path", "model.init_from (a local Hugging Face model directory)"},
    {"lora_rank", "lora.r"},
    {"lora_alpha", "lora.alpha"},
    {"lora_dropout", "lora.dropout"},
    {"lora_target", "lora.target_modules"},
    {"finetuning_type", "lora.r (lora.r > 0 is LoRA, 0 is full fine-tuning)"},
    {"cutoff_len", "data.seq_len"},
    {"max_seq_length", "data.seq_len"},
    {"template", "data.template"},
    {"dataset", "data.dataset (with data.train naming the dataset_dir)"},
    {"dataset_dir", "data.train (with data.dataset naming the datasets)"},
    {"train_on_prompt", "data.train_on_prompt"},
    {"packing", "data.pack"},
    {"neat_packing", "data.neat_packing"},
    {"tokenizer", "data.tokenizer"},
    {"tokenizer_name_or_path", "data.tokenizer"},
    {"stage", "training.stage"},
    {"pref_loss", "training.pref_loss"},
    {"pref_beta", "training.pref_beta"},
    {"pref_ftx", "training.pref_ftx"},
    {"dpo_label_smoothing", "training.dpo_label_smoothing"},
    {"simpo_gamma", "training.simpo_gamma"},
    {"deepspeed", "-the DeepSpeed keys go in this file itself (or pass the ds_config as --config)"},
};

}  // namespace

#undef F

// ---------------------------------------------------------------------------
// Lookup

const std::vector<KeySpec>& schema_env_knobs() { return build_env_knobs(); }

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
    if (p.size() > path.size() && p.substr(0, path.size()) == path && p[path.size()] == '.') return true;
  }
  return false;
}

std::vector<std::string> schema_children(std::string_view section) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const KeySpec& k : schema_keys()) {
    std::string_view p(k.path);
    if (!section.empty()) {
      if (p.size() <= section.size() || p.substr(0, section.size()) != section || p[section.size()] != '.') continue;
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

const char* schema_foreign_spelling(std::string_view path) {
  for (const auto& [name, ours] : kForeign)
    if (path == name) return ours;
  const size_t dot = path.rfind('.');
  if (dot == std::string_view::npos) return nullptr;
  const std::string_view leaf = path.substr(dot + 1);
  for (const auto& [name, ours] : kForeign)
    if (std::string_view(name).find('.') == std::string_view::npos && leaf == name) return ours;
  return nullptr;
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
std::string num_text(double v) { return fmt::format("{}", v); }
}  // namespace

std::string key_type_name(const KeySpec& spec) {
  std::string bounds;
  if (spec.min && spec.max)
    bounds = fmt::format(" in [{}, {}{}", num_text(*spec.min), num_text(*spec.max),
                         spec.type == KeyType::FLOAT_PAIR ? ")" : "]");
  else if (spec.min) bounds = fmt::format(" {} {}", spec.min_exclusive ? ">" : ">=", num_text(*spec.min));
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
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) return fmt::format("[{}]", fmt::join(*p, ", "));
        else if constexpr (std::is_same_v<T, std::array<double, 2>>)
          return fmt::format("[{}, {}]", num_text((*p)[0]), num_text((*p)[1]));
        else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) return p->empty() ? "{}" : "(set)";
        else return p->has_value() ? "(set)" : "none";
      },
      ref);
}

}  // namespace dtrain::config
