// The tiny training job the CLI tests run through the real binary: an AdamW-trained Llama
// (vocab 264, d_model 32, 2 heads / 1 KV head) on the shipped alpaca task data with the
// byte tokenizer, as YAML. Each test passes the few parts it varies (batch lines, layers,
// sequence length, steps, checkpointing, fault tolerance, ...). The data paths are
// absolute by default: relative paths in a config resolve against the config file's
// directory, and the tests write their configs into temporary directories.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace dtrain::cli_test {

// The shipped task data (train.jsonl, valid.jsonl), absolute: under $DTRAIN_SOURCE_DIR
// (set by ctest), else under the current directory (ctest runs tests from the repository
// root).
inline std::string shipped_data_dir() {
  const char* src = std::getenv("DTRAIN_SOURCE_DIR");
  const std::filesystem::path root = src && *src ? std::filesystem::absolute(src) : std::filesystem::current_path();
  return (root / "configs" / "data" / "tasks").string();
}

// The parts of the job a test varies; fields left out keep these defaults (designated
// initializers, in this order).
struct TinyJob {
  std::string top{};             // top-level lines before optimizer: (batch sizes, printing)
  std::string optimizer_more{};  // lines after optimizer.params.lr (more params, a scheduler:)
  int n_layer = 2;
  int seq_len = 32;                           // model.max_seq_len and data.seq_len
  std::string data_dir = shipped_data_dir();  // holds train.jsonl (and valid.jsonl)
  bool valid = false;                         // data.valid: <data_dir>/valid.jsonl
  int max_steps = 4;
  int eval_steps = 0;  // 0: no training.eval_steps line
  int save_steps = 2;
  std::string training_more{};  // lines after training.save_steps
  std::string rest{};           // top-level sections after training: (fault_tolerance: ...)
};

inline std::string tiny_job(const TinyJob& j) {
  const std::string seq = std::to_string(j.seq_len);
  std::string y = j.top;
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 3.0e-3\n" + j.optimizer_more;
  y += "model:\n  architecture: llama\n  vocab_size: 264\n  n_layer: " + std::to_string(j.n_layer) +
       "\n  n_head: 2\n  n_kv_head: 1\n  d_model: 32\n  d_ff: 64\n  max_seq_len: " + seq + "\n";
  y += "data:\n  train: " + j.data_dir + "/train.jsonl\n";
  if (j.valid) y += "  valid: " + j.data_dir + "/valid.jsonl\n";
  // The stream cut into windows (data.neat_packing: false): these tasks' records are longer
  // than the tiny sequences, whole records would all be truncated before their answers.
  y += "  format: alpaca\n  tokenizer: byte\n  seq_len: " + seq + "\n  neat_packing: false\n";
  y += "training:\n  max_steps: " + std::to_string(j.max_steps) + "\n";
  if (j.eval_steps > 0) y += "  eval_steps: " + std::to_string(j.eval_steps) + "\n";
  y += "  save_steps: " + std::to_string(j.save_steps) + "\n" + j.training_more;
  return y + j.rest;
}

// The tiny CPU job of the run directory and launcher input tests: one layer, 4 steps,
// a checkpoint every save_steps, no retries.
inline std::string tiny_cpu_job(int save_steps) {
  return tiny_job({.top = "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 1\nsteps_per_print: 1\n",
                   .n_layer = 1,
                   .save_steps = save_steps,
                   .training_more = "  device: cpu\n",
                   .rest = "fault_tolerance:\n  max_retries: 0\n  retry_delay: 1\n"});
}

}  // namespace dtrain::cli_test
