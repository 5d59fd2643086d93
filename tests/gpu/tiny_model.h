// The tiny GPT-2 and Llama (GQA) shapes the GPU tests run on both devices.
#pragma once

#include "model/config.h"

namespace dtrain::test {

inline model::ModelConfig tiny_model(model::ModelConfig::Arch arch, int max_seq_len) {
  model::ModelConfig c;
  c.arch = arch;
  c.vocab_size = 96;
  c.max_seq_len = max_seq_len;
  c.n_layer = 2;
  c.d_model = 32;
  if (arch == model::ModelConfig::Arch::GPT2) {
    c.n_head = c.n_kv_head = 2;
    c.d_ff = 128;
    c.tie_embeddings = true;
  } else {
    c.n_head = 4;
    c.n_kv_head = 2;  // GQA
    c.d_ff = 64;
    c.tie_embeddings = false;
  }
  return c;
}

}  // namespace dtrain::test
