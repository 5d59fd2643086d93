// config_check_host_batch_memory: the launcher's and a rank's check of a batch against this
// machine's memory (the one rule both use), each naming the machine as before.
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <string>

using namespace dtrain;
using namespace dtrain::config;

namespace {

// A tiny model with a micro-batch of 2^28 tokens: terabytes of activations on any machine.
TrainConfig huge_batch() {
  TrainConfig c = config_load_string(
                      "model: {architecture: llama, vocab_size: 512, n_layer: 2, n_head: 4, d_model: 64, "
                      "max_seq_len: 4096}\n"
                      "data: {train: x.jsonl, seq_len: 4096}\n"
                      "train_micro_batch_size_per_gpu: 65536\n"
                      "training: {max_steps: 1}\n",
                      "t.yaml", {})
                      .cfg;
  config_resolve_batch(c, 1);
  return c;
}

}  // namespace

TEST_CASE("a batch this machine cannot hold is refused, as the launcher or a rank says it") {
  if (config_host_memory_bytes() <= 0) return;  // unknown memory: nothing to check against
  const TrainConfig c = huge_batch();
  CHECK_THROWS_WITH_AS(config_check_host_batch_memory(c, 2, true),
                       doctest::Contains("but this machine, where all 2 rank(s) run, has "), ConfigError);
  CHECK_THROWS_WITH_AS(config_check_host_batch_memory(c, 2, false),
                       doctest::Contains("GiB of memory for its 2 rank(s): lower train_micro_batch_size_per_gpu"),
                       ConfigError);
}

TEST_CASE("a small batch passes the host check") {
  TrainConfig c = huge_batch();
  c.train_micro_batch_size_per_gpu = 1;
  c.data.seq_len = 32;
  config_resolve_batch(c, 1);
  config_check_host_batch_memory(c, 1, true);
  config_check_host_batch_memory(c, 1, false);
}
