// `dtrain eval`, `dtrain generate` and `dtrain data prepare`: options -> one call of
// lib/train (eval_run) or lib/data (prepare). main.cpp registers them; each returns the
// exit code.
#include "commands.h"
#include "data/prepare.h"
#include "train/eval_run.h"

#include <cstdio>
#include <string>

namespace dtrain::cli {

// ----------------------------------------------------------------------------
// Evaluates dir (a run directory, a run's final/ or an HF model directory; see
// train::eval_target_load) on an SFT JSONL file ("" = the config's data.valid).
int run_eval(const std::string& run_dir_or_model_dir, const std::string& data_jsonl, int max_records,
             const std::string& config_override_path, bool init_weights) {
  train::eval_run({.dir = run_dir_or_model_dir,
                   .data_jsonl = data_jsonl,
                   .max_records = max_records,
                   .config_path = config_override_path,
                   .init_weights = init_weights});
  return 0;
}

// Generation from dir's model, greedy or sampled.
int run_generate(const std::string& dir, const std::string& prompt, int max_new_tokens, bool raw, bool init_weights,
                 const train::SamplingOptions& sampling) {
  train::generate_run({.dir = dir,
                       .prompt = prompt,
                       .max_new_tokens = max_new_tokens,
                       .raw = raw,
                       .init_weights = init_weights,
                       .sampling = sampling});
  return 0;
}

// Tokenizes the input (format text | alpaca | chat | sft, or LLaMA-Factory datasets) with
// the tokenizer ("byte" or a tokenizer.json path) into the token shard, streaming on
// `threads` threads (0: all cores) in chunks of chunk_mb MB, a progress line each second.
int run_data_prepare(const DataPrepareArgs& a) {
  data::DataPrepareOptions opts;
  opts.threads = a.threads;
  opts.chunk_bytes = static_cast<size_t>(a.chunk_mb * 1e6);
  opts.dataset = a.dataset;
  opts.sft_template = a.template_name;
  opts.train_on_prompt = a.train_on_prompt;
  opts.progress = true;
  opts.force = a.force;
  const data::DataPrepareStats s =
      data::data_prepare(a.input, data::data_format_parse(a.format), a.tokenizer, a.output, opts);
  const std::string pairs = s.pairwise ? " (" + std::to_string(s.documents / 2) + " chosen/rejected pairs)" : "";
  std::printf("wrote %s: %zu documents%s, %zu tokens, %zu trained\n", a.output.c_str(), s.documents, pairs.c_str(),
              s.tokens, s.trained_tokens);
  return 0;
}

}  // namespace dtrain::cli
