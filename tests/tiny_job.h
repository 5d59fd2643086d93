// The tiny job the trainer suites run: a 2-layer Llama (d_model 32, one kv head, the
// byte tokenizer's 264 ids) with AdamW on the shipped SFT task records packed into
// seq_len windows; one copy of the config the trainer, ZeRO, resume and device suites
// each used to spell out, with what they vary (sequence length, batch, steps, ZeRO
// buckets) passed in. And train_run of it on N ranks as threads over Gloo.
#pragma once

#include "config/train_config.h"
#include "train/trainer.h"

#include "rank_threads.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace dtrain::test {

struct TinyJob {
  int seq_len = 48;      // data.seq_len and model.max_seq_len
  bool windows = false;  // data.neat_packing: false (else its default)
  std::string extra;     // the suite's own top-level keys: batch, training, zero_optimization, ...
};

// The model block alone: the 2-layer Llama over the byte tokenizer's ids.
inline std::string tiny_llama_yaml(int max_seq_len) {
  return "model:\n"
         "  architecture: llama\n"
         "  vocab_size: 264\n"
         "  n_layer: 2\n"
         "  n_head: 2\n"
         "  n_kv_head: 1\n"
         "  d_model: 32\n"
         "  d_ff: 64\n"
         "  max_seq_len: " +
         std::to_string(max_seq_len) + "\n";
}

// The whole config: AdamW, the model, the task records packed into windows, then `extra`.
inline std::string tiny_job_yaml(const TinyJob& t) {
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
inline config::TrainConfig tiny_job_config(const std::string& yaml, const std::vector<std::string>& sets, int world) {
  config::TrainConfig c = config::config_load_string(yaml, "tiny.yaml", sets).cfg;
  config::config_resolve_batch(c, world);
  return c;
}

// train_run of the config on `world` ranks (threads over Gloo); returns rank 0's result,
// after checking every rank ran through with the same losses.
inline train::TrainResult tiny_job_run(const std::string& yaml, const std::vector<std::string>& sets, int world,
                                       const std::string& run_dir = "") {
  std::vector<train::TrainResult> res(static_cast<size_t>(world));
  const auto errors = run_ranks(world, [&](comm::Communicator* comm, int r) {
    train::TrainerEnv env;
    env.print = false;
    env.run_dir = run_dir;
    env.rank = r;
    env.world_size = world;
    env.comm = comm;
    res[static_cast<size_t>(r)] = train::train_run(tiny_job_config(yaml, sets, world), env);
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  for (int r = 1; r < world; ++r) CHECK(res[static_cast<size_t>(r)].losses == res[0].losses);
  return res[0];
}

}  // namespace dtrain::test
