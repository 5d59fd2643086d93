// The tiny job the tests train: a Llama of d_model 32 (2 heads, one kv head; 2 layers
// unless told) over the byte tokenizer's 264 ids, trained with AdamW on the shipped SFT
// task records. One copy of the config the suites used to spell out each for itself,
// with what they vary passed in: as YAML for the CLI tests, which run it through the real
// binary (dtrain::cli_test::tiny_job, absolute data paths), and as a loaded config with an
// N-rank train_run for the trainer, ZeRO, resume and device suites (dtrain::test::tiny_train_*).
#pragma once

#include "config/train_config.h"
#include "train/trainer.h"

#include "rank_threads.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace dtrain::test {

// The model block: the Llama (2 layers unless told) over the byte tokenizer's ids.
inline std::string tiny_llama_yaml(int max_seq_len, int n_layer = 2) {
  return "model:\n"
         "  architecture: llama\n"
         "  vocab_size: 264\n"
         "  n_layer: " +
         std::to_string(n_layer) +
         "\n"
         "  n_head: 2\n"
         "  n_kv_head: 1\n"
         "  d_model: 32\n"
         "  d_ff: 64\n"
         "  max_seq_len: " +
         std::to_string(max_seq_len) + "\n";
}

}  // namespace dtrain::test

// ---------------------------------------------------------------------------
// The CLI tests' job, as YAML

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
  y += test::tiny_llama_yaml(j.seq_len, j.n_layer);
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

// ---------------------------------------------------------------------------
// The in-process suites' job: a loaded config and its N-rank run

namespace dtrain::test {

struct TinyTrain {
  int seq_len = 48;      // data.seq_len and model.max_seq_len
  bool windows = false;  // data.neat_packing: false (else its default)
  std::string extra;     // the suite's own top-level keys: batch, training, zero_optimization, ...
};

// The whole config: AdamW, the model, the task records packed into windows, then `extra`.
inline std::string tiny_train_yaml(const TinyTrain& t) {
  std::string y =
      "optimizer:\n"
      "  type: AdamW\n"
      "  params:\n"
      "    lr: 3.0e-3\n"
      "    betas: [0.9, 0.95]\n"
      "    weight_decay: 0.01\n" +
      tiny_llama_yaml(t.seq_len) +
      "data:\n"
      "  train: configs/data/tasks/train.jsonl\n"
      "  format: alpaca\n"
      "  tokenizer: byte\n"
      "  seq_len: " +
      std::to_string(t.seq_len) +
      "\n"
      "  pack: true\n";
  // The stream in windows: the task records outrun these sequences.
  if (t.windows) y += "  neat_packing: false\n";
  return y + t.extra;
}

// The config text with `sets` (key=value overrides) applied, its batch resolved for `world` ranks.
inline config::TrainConfig tiny_train_config(const std::string& yaml, const std::vector<std::string>& sets, int world) {
  config::TrainConfig c = config::config_load_string(yaml, "tiny.yaml", sets).cfg;
  config::config_resolve_batch(c, world);
  return c;
}

// train_run of the config on `world` ranks (threads over Gloo); returns rank 0's result,
// after checking every rank ran through with the same losses.
inline train::TrainResult tiny_train_run(const std::string& yaml, const std::vector<std::string>& sets, int world,
                                         const std::string& run_dir = "") {
  std::vector<train::TrainResult> res(static_cast<size_t>(world));
  const auto errors = run_ranks(world, [&](comm::Communicator* comm, int r) {
    train::TrainerEnv env;
    env.print = false;
    env.run_dir = run_dir;
    env.rank = r;
    env.world_size = world;
    env.comm = comm;
    res[static_cast<size_t>(r)] = train::train_run(tiny_train_config(yaml, sets, world), env);
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  for (int r = 1; r < world; ++r) CHECK(res[static_cast<size_t>(r)].losses == res[0].losses);
  return res[0];
}

// Every step's value of a within rel (relative) of b's.
inline void losses_check_close(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1 << ": " << a[i] << " vs " << b[i]);
    CHECK(std::fabs(a[i] - b[i]) <= rel * std::fabs(b[i]));
  }
}

}  // namespace dtrain::test
