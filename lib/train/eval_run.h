// `dtrain eval` and `dtrain generate` as one call each: the model eval_target_load finds for
// a directory, the data and prompt rules (which file, which format, which template, what
// fits max_seq_len), and the printed figures or text.
#pragma once

#include "train/sampling.h"

#include <string>

namespace dtrain::train {

struct EvalRunOptions {
  std::string dir;            ///< a run directory, a run's final/ or an HF model directory
  std::string data_jsonl;     ///< SFT JSONL; "" = the config's data.valid
  int max_records = 200;      ///< records answered for the accuracy (<= 0: all)
  std::string config_path;    ///< "" = dir's config.yaml
  bool init_weights = false;  ///< the config's initial model (the "before training" figure)
};

/// Held-out task accuracy over the first max_records records of the SFT file, then the
/// validation loss over the whole file, printed on stdout. UsageError when there is no
/// evaluation data, or when the run's data.valid is plain text or token shards (no SFT
/// records to score).
void eval_run(const EvalRunOptions& o);

struct GenerateRunOptions {
  std::string dir;  ///< as EvalRunOptions::dir
  std::string prompt;
  int max_new_tokens = 64;
  bool raw = false;           ///< the prompt tokenized as it is, without the SFT template
  bool init_weights = false;  ///< the config's initial model
  SamplingOptions sampling;
};

/// Generation from dir's model, greedy or sampled, stopping at the template's end of turn
/// / eos; the text on stdout (after the prompt when raw), and on stderr when the prompt
/// leaves less room than max_new_tokens in the model's max_seq_len.
void generate_run(const GenerateRunOptions& o);

}  // namespace dtrain::train
