// dtrain command line: parses arguments (CLI11), dispatches to the cmd_* functions, and
// maps typed exceptions to process exit codes. The only place that catches dtrain::Error.
#include "plan/plan_occupancy.h"
#include "bench_options.h"
#include "commands.h"
#include "config/hostfile.h"

#include "config/train_config.h"
#include "core/check.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/version.h"
#include "rank/external_run.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using dtrain::cli::int_at_least;
using dtrain::cli::int_in_range;
using dtrain::cli::JobOptions;
using dtrain::cli::number_in_range;

// CLI11's ExistingFile / ExistingDirectory / ExistingPath, with their messages, except that
// a path running into a symbolic link loop is said to (CLI11 calls it missing).
enum class PathKind { FILE, DIR, ANY };
CLI::Validator existing(PathKind kind) {
  const char* desc = kind == PathKind::FILE ? "FILE" : kind == PathKind::DIR ? "DIR" : "PATH(existing)";
  return CLI::Validator(
      [kind](std::string& path) -> std::string {
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) {
          if (errno == ELOOP)
            return path +
                   " is, or passes through, a symbolic link loop (too many levels of symbolic links): fix or "
                   "remove the link";
          return std::string(kind == PathKind::FILE  ? "File does not exist: "
                             : kind == PathKind::DIR ? "Directory does not exist: "
                                                     : "Path does not exist: ") +
                 path;
        }
        if (kind == PathKind::FILE && S_ISDIR(st.st_mode)) return "File is actually a directory: " + path;
        if (kind == PathKind::DIR && !S_ISDIR(st.st_mode)) return "Directory is actually a file: " + path;
        return "";
      },
      desc);
}

// The options every job-running subcommand shares.
void add_job_options(CLI::App* cmd, JobOptions& o, bool config_required) {
  auto* c = cmd->add_option("--config", o.config, "training config (YAML, or DeepSpeed JSON)");
  if (config_required) c->required();
  c->check(existing(PathKind::FILE));
  cmd->add_option("--hostfile", o.hostfile, "DeepSpeed-style hostfile (\"host slots=N\" per line); default: localhost")
      ->check(existing(PathKind::FILE));
  cmd->add_option("--output-dir", o.output_dir, "the run directory (overrides training.output_dir)");
  cmd->add_option("--set", o.sets,
                  "override a config key, typed like its YAML value (repeatable): --set zero_optimization.stage=2")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  auto* inc = cmd->add_option("--include", o.include, "use only these hosts/slots: host[:slot,slot][@host...]");
  auto* exc = cmd->add_option("--exclude", o.exclude, "leave out these hosts/slots: host[:slot,slot][@host...]");
  inc->excludes(exc);
  // torchrun's and DeepSpeed's underscore spellings are the same options.
  cmd->add_option("--num-nodes,--num_nodes", o.num_nodes, "use the first N hosts of the hostfile")
      ->check(int_at_least("--num-nodes", 1));
  cmd->add_option("--nnodes", o.nnodes,
                  "as torchrun's: N = the first N hosts (as --num-nodes); MIN:MAX = elastic membership, a node that "
                  "fails the probe or elastic.max_node_failures rounds in a row is left out while MIN remain, and "
                  "rejoins at a checkpoint (sets elastic.min_nodes and elastic.max_nodes)")
      ->type_name("MIN:MAX");
  cmd->add_option("--num-gpus,--num_gpus", o.num_gpus, "use the first N slots of each host")
      ->check(int_at_least("--num-gpus", 1));
  cmd->add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                  "ranks on localhost when no hostfile is given (default: visible GPUs, else 1)")
      ->check(int_at_least("--nproc-per-node", 1));
  cmd->add_option("--master-addr,--master_addr", o.master_addr,
                  "address the nodes use to reach this launcher's rendezvous");
  cmd->add_option("--master-port,--master_port", o.master_port, "rendezvous port (0 = pick a free one)")
      ->check(int_in_range("--master-port", 0, 65535, "0 = pick a free port"));
  cmd->add_option("--launcher", o.launcher,
                  "ssh: hosts from --hostfile (local ones without SSH); slurm: inside sbatch/salloc, nodes from "
                  "SLURM_JOB_NODELIST, one agent per node through srun")
      ->check(CLI::IsMember({"ssh", "slurm"}))
      ->capture_default_str();
  cmd->add_flag("--tee-all", o.tee_all, "show every rank's output on the terminal (default: rank 0 and all errors)");
  cmd->add_flag("--dry-run", o.dry_run, "print the placement and each node's command and environment, then exit");
  // The config loader's unknown-key message points here.
  cmd->add_flag_callback(
      "--help-config",
      [] {
        const std::string text = dtrain::config::config_help();
        std::fwrite(text.data(), 1, text.size(), stdout);
        throw CLI::Success();
      },
      "print every config key with its type, default, bounds and environment override, then exit");
}

// --plan-for (launch and resume): a dry run planned for a cluster this machine is not part of.
void add_plan_for(CLI::App* cmd, JobOptions& o) {
  cmd->add_option("--plan-for", o.plan_for,
                  "a dry run (implies --dry-run) planned for a cluster that is not this machine: [NODESx]GPUSxSIZE "
                  "(8x80GB = one node of 8 GPUs of 80 GB, 2x8x80GB, 1x24GB; GB = 10^9 bytes, or GiB) places the "
                  "ranks on placeholder hosts; SIZE alone (80GB) plans on the --hostfile's hosts. The memory plan "
                  "is held against that GPU size (exit 2 when a rank does not fit); model weights, tokenizer.json "
                  "and data this machine does not hold are notes, not reasons to fail (a model directory holding "
                  "only config.json plans)")
      ->type_name("[NODESx]GPUSxSIZE");
}

// An empty --output-dir would read as "not given" and write into the config's
// training.output_dir: refuse it.
void check_output_dir(const CLI::App* cmd, const std::string& output_dir) {
  if (cmd->count("--output-dir") > 0 && output_dir.empty())
    DT_THROW(UsageError,
             "--output-dir is empty: give the run directory's path, or leave the flag out to use the "
             "config's training.output_dir");
}

// An empty --include/--exclude would read as "no filter" and run on every host: refuse it.
// (CLI11 skips validators for an empty value, so this is checked after parsing.)
void check_job_options(const CLI::App* cmd, const JobOptions& o) {
  for (const auto& [flag, value] : {std::pair{"--include", &o.include}, std::pair{"--exclude", &o.exclude}})
    if (cmd->count(flag) > 0 && value->empty())
      DT_THROW(UsageError,
               "{} is empty: give host[:slot,slot][@host...] (e.g. {} worker-0@worker-1:0,2), or leave "
               "the flag out",
               flag, flag);
  check_output_dir(cmd, o.output_dir);
}

// --verbose: errors keep the source location the check macros append ("[lib/x.cpp:71]").
bool g_verbose = false;

// An error as the user reads it: without the " [lib/model/peft.cpp:71]" source locations
// (kept with --verbose, and in the ranks' logs), keeping a host/rank context they carry.
std::string error_text(const std::string& what) {
  if (g_verbose) return what;
  std::string out;
  size_t at = 0;
  while (at < what.size()) {
    const size_t open = what.find(" [", at);
    if (open == std::string::npos) break;
    out.append(what, at, open - at);
    const size_t close = what.find(']', open);
    const std::string_view inner =
        close == std::string::npos ? std::string_view() : std::string_view(what).substr(open + 2, close - open - 2);
    bool source = false;
    for (std::string_view root : {"lib/", "apps/", "kernels/", "tests/"}) source = source || inner.rfind(root, 0) == 0;
    const size_t colon = inner.find(':');
    source = source && colon != std::string_view::npos && colon + 1 < inner.size() &&
             std::isdigit(static_cast<unsigned char>(inner[colon + 1]));
    if (!source) {
      out += " [";
      at = open + 2;
      continue;
    }
    const size_t space = inner.find(' ');
    if (space != std::string_view::npos) out += fmt::format(" [{}]", inner.substr(space + 1));
    at = close + 1;
  }
  out.append(what, std::min(at, what.size()), std::string::npos);
  return out;
}

int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", error_text(e.what()).c_str());
    return e.exit_code();
  } catch (const std::filesystem::filesystem_error& fe) {
    // A path a library call looked at without the input rule: a link loop or a permission on
    // the way is the user's to fix (exit 2), anything else an I/O error (exit 3), each named.
    try {
      dtrain::input_fs_error(fe, "path");
    } catch (const dtrain::Error& e) {
      std::fprintf(stderr, "dtrain: error: %s\n", error_text(e.what()).c_str());
      return e.exit_code();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: internal error: %s\n", e.what());
    return static_cast<int>(dtrain::Exit::INTERNAL);
  }
}

// ---------------------------------------------------------------------------
// One registration function per command: its options (owned by the runner, which the
// command line outlives) and the one library call it makes once parsed.

struct Command {
  CLI::App* cmd;
  std::function<int()> run;
};
using Commands = std::vector<Command>;

void add_launch(CLI::App& app, Commands& out) {
  auto o = std::make_shared<JobOptions>();
  auto* cmd = app.add_subcommand("launch", "run a training job on the hosts of a hostfile");
  add_job_options(cmd, *o, false);
  add_plan_for(cmd, *o);
  cmd->footer(
      "Example:\n  dtrain launch --hostfile hostfiles/two-nodes-8 --config configs/gpt2-124m.yaml "
      "--set training.max_steps=100\n  dtrain launch --config examples/qwen3-8b/lora_sft_zero3.yaml --set "
      "model.init_from=tests/data/hf_configs/qwen3-8b --plan-for 8x80GB   # from the source tree\nWithout --config the embedded default job runs "
      "(configs/tiny-sft.yaml: a tiny model on the shipped data, one CPU rank).");
  out.push_back({cmd, [cmd, o] {
                   check_job_options(cmd, *o);
                   return dtrain::cli::run_launch(*o);
                 }});
}

void add_resume(CLI::App& app, Commands& out) {
  auto o = std::make_shared<JobOptions>();
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("resume", "continue a stopped or failed job from its run directory");
  cmd->add_option("RUN_DIR", *dir, "the job's run directory")->required()->check(existing(PathKind::DIR));
  add_job_options(cmd, *o, false);
  add_plan_for(cmd, *o);
  cmd->footer("Example:\n  dtrain resume runs/tiny-sft --hostfile hostfiles/hetero --set training.max_steps=600");
  out.push_back({cmd, [cmd, o, dir] {
                   check_job_options(cmd, *o);
                   return dtrain::cli::run_resume(*dir, *o);
                 }});
}

// `dtrain bench` (the collective sweep) and its `bench train` subcommand.
CLI::App* add_bench(CLI::App& app, Commands& out) {
  struct Options {
    JobOptions job;
    dtrain::cli::BenchCliOptions bench;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("bench", "measure collectives across the hostfile's ranks (nccl-tests output)");
  cmd->add_option("COLLECTIVE", o->bench.collective, "allreduce, reduce_scatter, all_gather, broadcast or all")
      ->capture_default_str();
  dtrain::cli::bench_add_options(cmd, o->bench);
  add_job_options(cmd, o->job, false);
  cmd->footer("Example:\n  dtrain bench allreduce --hostfile hostfiles/two-nodes-8 -b 8 -e 1G -f 2 --backend nccl");
  out.push_back({cmd, [cmd, o] {
                   check_job_options(cmd, o->job);
                   return dtrain::cli::run_bench(o->bench, o->job);
                 }});
  return cmd;
}

void add_bench_train(CLI::App* bench, Commands& out) {
  struct Options {
    std::string config, device = "cuda", gpu = "h100", cluster;
    std::vector<std::string> sets;
    int steps = 20, warmup = 5;
    bool json = false, plan = false;
  };
  auto bt = std::make_shared<Options>();
  auto* cmd = bench->add_subcommand(
      "train", "one-device training throughput on synthetic tokens: tokens/s, step time, MFU, peak memory");
  cmd->add_option("--config", bt->config, "training config (model, micro-batch, seq_len, precision, LoRA)")
      ->required()
      ->check(existing(PathKind::FILE));
  cmd->add_option("--set", bt->sets, "override a config key (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--steps", bt->steps, "timed steps")->check(int_at_least("--steps", 1))->capture_default_str();
  cmd->add_option("--warmup", bt->warmup, "untimed warm-up steps")
      ->check(int_at_least("--warmup", 0))
      ->capture_default_str();
  cmd->add_flag("--json", bt->json, "print one JSON object");
  cmd->add_flag("--plan", bt->plan,
                "predict the step on a GPU instead of timing it: every launch the CUDA code issues, with "
                "its FLOPs, bytes and a low/high roofline time band, and the step's MFU band (needs no GPU)");
  cmd->add_option("--gpu", bt->gpu, "with --plan: the GPU profile the step is priced on")
      ->check(CLI::IsMember(dtrain::plan::plan_gpu_names()))
      ->capture_default_str();
  cmd->add_option("--cluster", bt->cluster,
                  "with --plan: also the step on these clusters (NODESxGPUS, comma-separated: 1x8,2x8,16x8): "
                  "compute from the plan, each ZeRO collective by NCCL's ring model over cluster.link, the "
                  "exposed communication, tokens/s and scaling (docs/cluster.md)")
      ->type_name("NxW[,NxW...]");
  cmd->add_option("--device", bt->device, "cuda, or cpu for the CPU reference model (fp32)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  cmd->footer(
      "Examples:\n  dtrain bench train --config configs/gpt2-124m.yaml --set train_micro_batch_size_per_gpu=16\n"
      "  dtrain bench train --config configs/gpt2-124m.yaml --set train_micro_batch_size_per_gpu=16 --plan\n"
      "  dtrain bench train --config configs/llama-1b.yaml --plan --cluster 1x8,2x8,4x8");
  out.push_back({cmd, [bt] {
                   return dtrain::cli::run_bench_train(bt->config, bt->sets, bt->steps, bt->warmup, bt->json,
                                                       bt->device, bt->plan, bt->gpu, bt->cluster);
                 }});
}

// `dtrain bench attention`: one shape's causal attention, forward and backward, timed.
void add_bench_attention(CLI::App* bench, Commands& out) {
  struct Options {
    std::string shape, dtype = "bf16", device = "cuda";
    int iters = 10, warmup = 3;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = bench->add_subcommand(
      "attention", "causal attention of one shape: forward and backward times and TFLOP/s (FlashAttention's count)");
  cmd->add_option("--shape", o->shape, "B,T,NH,NKV,HD: batch, sequence, query heads, KV heads, head dim")
      ->required()
      ->type_name("B,T,NH,NKV,HD");
  cmd->add_option("--dtype", o->dtype, "bf16, fp16 or fp32 (the CPU runs fp32)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed calls of each")->check(int_at_least("--iters", 1))->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed calls first")
      ->check(int_at_least("--warmup", 0))
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cuda, or cpu (fp32, small shapes)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->footer(
      "Examples (torch's SDPA at the same shapes: scripts/attention_peer.py):\n"
      "  dtrain bench attention --shape 16,1024,12,12,64          # GPT-2 124M's\n"
      "  dtrain bench attention --shape 4,2048,32,8,128           # Llama 3 8B's, GQA 4:1");
  out.push_back({cmd, [o] {
                   return dtrain::cli::run_bench_attention(o->shape, o->dtype, o->device, o->iters, o->warmup, o->json);
                 }});
}

void add_eval(CLI::App& app, Commands& out) {
  struct Options {
    std::string dir, data, config;
    int max_records = 200;
    bool init = false;
  };
  auto ev = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("eval", "held-out task accuracy and validation loss of a trained model");
  cmd->add_option("DIR", ev->dir,
                  "run directory (its final/, else its latest complete checkpoint), its final/ or a "
                  "Hugging Face model directory")
      ->required();
  cmd->add_option("--data", ev->data, "SFT JSONL to evaluate on (default: the config's data.valid)");
  cmd->add_option("--max-records", ev->max_records, "records to generate answers for (0 = all)")
      ->check(int_at_least("--max-records", 0))
      ->capture_default_str();
  cmd->add_option("--config", ev->config, "config to take data/tokenizer settings from instead of DIR's");
  cmd->add_flag("--init", ev->init, "evaluate the config's freshly initialised model (the before-training figure)");
  cmd->footer("Example:\n  dtrain eval runs/tiny-sft --max-records 200");
  out.push_back(
      {cmd, [ev] { return dtrain::cli::run_eval(ev->dir, ev->data, ev->max_records, ev->config, ev->init); }});
}

void add_export(CLI::App& app, Commands& out) {
  struct Options {
    std::string dir, out;
    bool init = false;
    dtrain::train::HfExportFlags flags;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "export",
      "write a run's final/ model, else its latest complete checkpoint (any world size / ZeRO stage), as "
      "Hugging Face files");
  cmd->add_option("RUN_DIR", o->dir, "the run directory")->required()->check(existing(PathKind::DIR));
  cmd->add_option("-o,--output", o->out, "directory to write (default: RUN_DIR/export)");
  cmd->add_flag("--init", o->init, "export the config's freshly initialised model instead");
  cmd->add_option("--dtype", o->flags.dtype, "bf16 or fp32 (default: the config's export.dtype, bf16)");
  cmd->add_option("--max-shard-size", o->flags.max_shard_size,
                  "largest safetensors file, e.g. 5GB, 500MB, 2GiB or bytes (default: export.max_shard_size, 5GB)");
  cmd->add_flag("--merge-lora", o->flags.merge_lora, "LoRA runs: also write the merged full model in DIR/merged");
  cmd->footer("Example:\n  dtrain export runs/tiny-sft -o tiny-sft-hf --max-shard-size 2GB");
  out.push_back({cmd, [o] { return dtrain::cli::run_export(o->dir, o->out, o->init, o->flags); }});
}

// --temperature, --top-k, --top-p, --seed (generate and chat).
void add_sampling_options(CLI::App* cmd, dtrain::train::SamplingOptions& s) {
  cmd->add_option("--temperature", s.temperature,
                  "0 = greedy (the most likely token each step); above 0, sample from softmax(logits / T)")
      ->check(number_in_range("--temperature", 0, 1000))
      ->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "sample among the K most likely tokens only (0 = all)")
      ->check(int_at_least("--top-k", 0))
      ->capture_default_str();
  cmd->add_option("--top-p", s.top_p,
                  "sample among the smallest set of most likely tokens whose probability reaches P (1 = all), "
                  "after --top-k, as transformers does")
      ->check(number_in_range("--top-p", 0, 1))
      ->capture_default_str();
  cmd->add_option("--seed", s.seed, "the sampler's seed: the same seed gives the same text")->capture_default_str();
}

void add_generate(CLI::App& app, Commands& out) {
  struct Options {
    std::string dir, prompt;
    int max_new = 64;
    bool raw = false, init = false;
    dtrain::train::SamplingOptions sampling;
  };
  auto gen = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("generate", "generation from a trained model (greedy, or sampled with --temperature)");
  cmd->add_option("DIR", gen->dir,
                  "run directory (its final/, else its latest complete checkpoint), its final/ "
                  "or a Hugging Face model directory")
      ->required();
  cmd->add_option("PROMPT", gen->prompt, "instruction (rendered with the model's SFT template)")->required();
  cmd->add_option("--max-new-tokens", gen->max_new, "tokens to generate at most")
      ->check(int_at_least("--max-new-tokens", 0))
      ->capture_default_str();
  cmd->add_flag("--raw", gen->raw, "use PROMPT as is, without the SFT template");
  cmd->add_flag("--init", gen->init, "generate with the config's freshly initialised model");
  add_sampling_options(cmd, gen->sampling);
  cmd->footer(
      "Examples:\n  dtrain generate runs/tiny-sft \"Add 12 and 30.\"\n"
      "  dtrain generate runs/tiny-sft \"Add 12 and 30.\" --temperature 0.8 --top-p 0.9 --seed 7");
  out.push_back({cmd, [gen] {
                   return dtrain::cli::run_generate(gen->dir, gen->prompt, gen->max_new, gen->raw, gen->init,
                                                    gen->sampling);
                 }});
}

void add_chat(CLI::App& app, Commands& out) {
  auto o = std::make_shared<dtrain::cli::ChatArgs>();
  auto* cmd = app.add_subcommand(
      "chat",
      "talk to a trained model: one message per line, rendered with the conversation so far through the run's "
      "chat template; on a pipe, one answer line per message line");
  cmd->add_option("DIR", o->dir,
                  "run directory (its final/, else its latest complete checkpoint), its final/ "
                  "or a Hugging Face model directory")
      ->required();
  cmd->add_option("--system", o->system, "a system message before the conversation");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens per answer at most (it also ends at end of turn)")
      ->check(int_at_least("--max-new-tokens", 1))
      ->capture_default_str();
  cmd->add_flag("--init", o->init, "talk to the config's freshly initialised model");
  add_sampling_options(cmd, o->sampling);
  cmd->footer(
      "On a terminal: a '> ' prompt, Ctrl-D ends, /reset forgets the conversation. From a pipe: each non-blank "
      "line is a message and gets one line of answer, its newlines written as \\n and backslashes as \\\\. "
      "Earlier exchanges that no longer fit the model's max_seq_len with room for --max-new-tokens are dropped, "
      "oldest first (said on stderr).\nExamples:\n  dtrain chat runs/tiny-sft\n"
      "  printf 'Add 12 and 30.\\nReverse the word tiger.\\n' | dtrain chat runs/tiny-sft --temperature 0.7 "
      "--seed 1");
  out.push_back({cmd, [o] { return dtrain::cli::run_chat(*o); }});
}

void add_data(CLI::App& app, Commands& out) {
  auto dp = std::make_shared<dtrain::cli::DataPrepareArgs>();
  auto* data = app.add_subcommand("data", "dataset tools");
  data->require_subcommand(1);
  auto* cmd = data->add_subcommand(
      "prepare", "tokenize plain text, SFT or preference JSONL, or LLaMA-Factory datasets into a token shard");
  cmd->add_option("INPUT", dp->input, "text file or JSONL; with --dataset, the dataset_dir holding dataset_info.json")
      ->required()
      ->check(existing(PathKind::ANY));
  cmd->add_option("OUTPUT", dp->output, "token shard to write (an existing file only if it is a token shard)")
      ->required();
  cmd->add_flag("--force", dp->force, "replace an existing OUTPUT that is not a token shard (never an input)");
  cmd->add_option("--format", dp->format,
                  "text, alpaca, chat, sft (alpaca or chat per line) or pairwise (preference records with chosen and "
                  "rejected: a shard of (chosen, rejected) pairs)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", dp->tokenizer, "byte, or a Hugging Face tokenizer.json")->capture_default_str();
  cmd->add_option("--dataset", dp->dataset,
                  "LLaMA-Factory dataset names of INPUT/dataset_info.json, comma-separated (concatenated in order; "
                  "\"ranking\": true ones make a pairwise shard)");
  cmd->add_option("--template", dp->template_name,
                  "SFT chat template: plain alpaca chatml qwen qwen3 llama3 llama2 mistral, or auto (data.template)")
      ->capture_default_str();
  cmd->add_flag("--train-on-prompt", dp->train_on_prompt, "SFT and pairs: every token trains, not only the answers");
  cmd->add_option("--threads", dp->threads,
                  "tokenizing threads (0: one per core); the shard is the same for any number")
      ->capture_default_str()
      ->check(CLI::Range(0u, 256u));
  cmd->add_option("--chunk-mb", dp->chunk_mb, "read the input in chunks of about this many MB (memory grows with it)")
      ->capture_default_str()
      ->check(number_in_range("--chunk-mb", 0.001, 1024.0));
  cmd->footer(
      "Examples:\n  dtrain data prepare configs/data/tasks/train.jsonl /tmp/tasks.bin --format alpaca\n"
      "  dtrain data prepare data/ /tmp/sft.bin --dataset alpaca_en,glaive --template llama3 --tokenizer "
      "models/llama3/tokenizer.json\n"
      "  dtrain data prepare configs/data/preference /tmp/pref.bin --dataset basics_pref_alpaca,basics_pref_sharegpt "
      "--template chatml");
  out.push_back({cmd, [dp] { return dtrain::cli::run_data_prepare(*dp); }});
}

void add_plot(CLI::App& app, Commands& out) {
  struct Options {
    std::string dir, out;
    int width = 1200, height = 800;
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("plot", "draw a run's loss and tokens/s curves (restarts marked) into a PNG");
  cmd->add_option("RUN_DIR", o->dir, "the run directory")->required()->check(existing(PathKind::DIR));
  cmd->add_option("-o,--output", o->out,
                  "PNG to write (default: RUN_DIR/plot.png); an existing file only if dtrain plotted it");
  cmd->add_flag("--force", o->force,
                "replace an existing file at -o that is not a dtrain plot (never the run's own files)");
  cmd->add_option("--width", o->width, "image width")
      ->check(int_in_range("--width", 400, 16384))
      ->capture_default_str();
  cmd->add_option("--height", o->height, "image height")
      ->check(int_in_range("--height", 300, 16384))
      ->capture_default_str();
  cmd->footer("Example:\n  dtrain plot runs/tiny-sft -o loss.png");
  out.push_back({cmd, [o] { return dtrain::cli::run_plot(o->dir, o->out, o->width, o->height, o->force); }});
}

void add_run(CLI::App& app, Commands& out) {
  auto o = std::make_shared<dtrain::rank::ExternalOptions>();
  auto* cmd = app.add_subcommand(
      "run",
      "one process of a job started by torchrun, a Kubernetes operator, srun or mpirun (placement from "
      "their environment)");
  cmd->add_option("--config", o->config, "training config (YAML or DeepSpeed JSON); default: the embedded job")
      ->check(existing(PathKind::FILE));
  cmd->add_option("--set", o->sets, "override a config key (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--output-dir", o->output_dir,
                  "run directory (overrides training.output_dir); shared by "
                  "every process");
  cmd->add_option("--nproc-per-node,--nproc_per_node", o->nproc_per_node,
                  "this process stands for its node and starts N local ranks (the launcher's rank = node index)")
      ->check(int_in_range("--nproc-per-node", 1, dtrain::config::HOSTFILE_MAX_SLOTS,
                           "ranks on one node, as dtrain launch's slots per host"));
  cmd->footer(
      "Example (every node of a PyTorchJob):\n  dtrain run --config /etc/dtrain/job.yaml\n"
      "The job token comes from cluster.rendezvous.token_file or token_env, never the command line.");
  out.push_back({cmd, [cmd, o] {
                   check_output_dir(cmd, o->output_dir);
                   return dtrain::rank::external_run(*o, dtrain::cli::exit_now);
                 }});
}

void add_status(CLI::App& app, Commands& out) {
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "status", "is a run running, failed or finished: progress, checkpoint, restarts, node heartbeats");
  cmd->add_option("RUN_DIR", *dir, "the run directory")->required()->check(existing(PathKind::DIR));
  cmd->footer("Example:\n  dtrain status runs/tiny-sft");
  out.push_back({cmd, [dir] { return dtrain::cli::run_status(*dir); }});
}

void add_doctor(CLI::App& app, Commands& out) {
  struct Options {
    JobOptions job;
    bool json = false, no_network = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("doctor",
                         "check every host before a long job: SSH, same dtrain build, slots vs GPUs/CPUs, driver, free "
                         "space, shared run directory, clock skew, collective connectivity and per-link bandwidth");
  add_job_options(cmd, o->job, false);
  for (const char* flag : {"--dry-run", "--tee-all"}) cmd->remove_option(cmd->get_option(flag));
  cmd->add_flag("--json", o->json, "print the report as JSON instead of the table");
  cmd->add_flag("--no-network", o->no_network, "skip the connectivity check and the bandwidth table");
  cmd->footer(
      "Exit 0 when every check passed, 10 when one failed (each failure names host, check and what to "
      "do).\nExample:\n  dtrain doctor --hostfile hostfiles/two-nodes-8 --config configs/gpt2-124m.yaml");
  out.push_back({cmd, [cmd, o] {
                   check_job_options(cmd, o->job);
                   return dtrain::cli::run_doctor(o->job, o->json, !o->no_network);
                 }});
}

// Internal commands, started by dtrain itself: their arguments pass through untouched.
void add_internal(CLI::App& app, Commands& out) {
  auto* agent = app.add_subcommand("agent", "internal: node agent started by the launcher")->prefix_command();
  agent->group("");
  out.push_back({agent, [agent] { return dtrain::cli::run_agent(agent->remaining()); }});
  auto* worker = app.add_subcommand("worker", "internal: rank process started by the agent")->prefix_command();
  worker->group("");
  out.push_back({worker, [worker] { return dtrain::cli::run_worker(worker->remaining()); }});
  auto* doctor_node = app.add_subcommand("doctor-node", "internal: one node's part of dtrain doctor")->prefix_command();
  doctor_node->group("");
  out.push_back({doctor_node, [doctor_node] { return dtrain::cli::run_doctor_node(doctor_node->remaining()); }});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain: launch and run distributed transformer training (DeepSpeed-style configs and hostfiles)"};
  app.set_version_flag("--version", std::string("dtrain ") + dtrain::version());
  app.require_subcommand(1);
  app.add_flag("--verbose", g_verbose,
               "errors name the source location that raised them ([lib/x.cpp:71]); also after the command");
  app.failure_message(dtrain::cli::cli_failure_message);
  app.footer(
      "Exit codes: 0 success, 2 usage/config error, 3 I/O, 4 launch/SSH, 5 communication, "
      "6 training, 7 checkpoint, 8 device; a failed rank's own code otherwise.\n"
      "Run 'dtrain <command> --help' for a command's options.");
  // Registered in the order --help lists them; `bench train` after `bench`, so the
  // deepest parsed command is the last parsed one.
  Commands commands;
  add_launch(app, commands);
  add_resume(app, commands);
  CLI::App* bench = add_bench(app, commands);
  add_bench_train(bench, commands);
  add_bench_attention(bench, commands);
  add_eval(app, commands);
  add_export(app, commands);
  add_generate(app, commands);
  add_chat(app, commands);
  add_data(app, commands);
  add_plot(app, commands);
  add_run(app, commands);
  add_status(app, commands);
  add_doctor(app, commands);
  add_internal(app, commands);

  // --verbose anywhere on a user's command line (dtrain launch --verbose ...); the internal
  // commands' arguments pass through untouched.
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool internal = !args.empty() && (args[0] == "agent" || args[0] == "worker" || args[0] == "doctor-node");
  if (!internal) {
    const auto end = std::find(args.begin(), args.end(), "--");
    if (std::find(args.begin(), end, "--verbose") != end) {
      g_verbose = true;
      args.erase(std::remove(args.begin(), end, "--verbose"), end);
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11's vector form takes them last-first
  app.name(argv[0]);                       // as parse(argc, argv) names it
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(dtrain::Exit::USAGE);
  }
  for (auto it = commands.rbegin(); it != commands.rend(); ++it) {
    if (!it->cmd->parsed()) continue;
    // The processes dtrain starts itself write logs: their errors keep their locations.
    const std::string name = it->cmd->get_name();
    if (name == "agent" || name == "worker" || name == "doctor-node") g_verbose = true;
    return run_guarded(it->run);
  }
  return static_cast<int>(dtrain::Exit::USAGE);
}
