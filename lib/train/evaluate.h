// Evaluation of a model: validation loss / perplexity over a TokenDataset, greedy or
// sampled generation (batched, fixed-width windows so activations are allocated once), and
// held-out SFT task accuracy (prompt -> greedy answer -> data::sft_answer_matches).
#pragma once

#include "config/train_config.h"
#include "data/dataset.h"
#include "data/sft.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/sampling.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

/// Token-weighted loss sums, so ranks can add theirs before dividing.
struct EvalLoss {
  double loss_sum = 0.0;  ///< sum over unmasked targets of the cross-entropy
  int64_t tokens = 0;     ///< unmasked targets
  double mean() const;    ///< loss_sum / tokens (NaN when tokens == 0)
  double ppl() const;     ///< exp(mean())
};

/// Loss over the samples i of `dataset` with i % world_size == rank (all of them for the
/// defaults), batch_size rows per forward, in eval mode (no LoRA dropout); max_samples > 0
/// limits the samples considered (before splitting by rank). The caller adds the ranks'
/// results. The model's training flag is restored. forwards > 0: after its own batches the
/// rank runs forwards with every target masked (they add nothing) until it has made that
/// many, so every rank makes the same number: a ZeRO-3 model gathers each layer with a
/// collective in forward (eval_forwards gives the count every rank needs). On a pairwise
/// dataset a sample is its two rows (chosen and rejected, TokenDataset::batch), both scored:
/// 2 * batch_size rows per forward.
EvalLoss eval_loss(model::Model& m, const data::TokenDataset& dataset, int batch_size, size_t max_samples = 0,
                   int rank = 0, int world_size = 1, int forwards = 0);

/// The forwards of the rank with the most samples: ceil(ceil(n / world_size) / batch_size)
/// for n samples (max_samples > 0 limits n, as in eval_loss).
int eval_forwards(const data::TokenDataset& dataset, int batch_size, size_t max_samples, int world_size);

/// Greedy continuation of each prompt: up to max_new_tokens ids each, stopping after a
/// stop id (included in the result) or when the context reaches the model's
/// max_seq_len. Prompts longer than max_seq_len - 1 keep their last tokens. Runs
/// batches of batch_size prompts over one window width per batch (longest prompt +
/// max_new_tokens, capped at max_seq_len). vocab_limit > 0 restricts the argmax to ids
/// below it (a padded model vocabulary has ids no tokenizer produces).
std::vector<std::vector<int32_t>> generate_greedy_batch(model::Model& m,
                                                        const std::vector<std::vector<int32_t>>& prompts,
                                                        int max_new_tokens, const std::vector<int32_t>& stop_ids,
                                                        int batch_size = 16, int vocab_limit = 0);

/// generate_greedy_batch choosing each next token with a TokenSampler (greedy when
/// sampling.temperature is 0, then the same ids): prompt i's sampler is seeded with
/// sampling.seed + i, so its tokens do not depend on batch_size or the other prompts.
std::vector<std::vector<int32_t>> generate_batch(model::Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                                 int max_new_tokens, const std::vector<int32_t>& stop_ids,
                                                 const SamplingOptions& sampling, int batch_size = 16,
                                                 int vocab_limit = 0);

/// generate_greedy_batch for one prompt, decoded (stop tokens decode as their text).
std::string generate_greedy(model::Model& m, const data::Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                            int max_new_tokens, bool stop_at_eos = true);

struct TaskExample {
  std::string prompt, expected, generated;
  bool correct = false;
};

struct TaskAccuracy {
  int correct = 0;
  int total = 0;
  std::vector<TaskExample> examples;  ///< the first few records, for display
  double percent() const { return total ? 100.0 * correct / total : 0.0; }
};

/// Scores generated answers against each record's first assistant message with
/// data::sft_answer_matches (cut at end markers, white space normalised, exact match).
/// generated.size() must equal records.size(). Keeps the first `keep_examples`.
TaskAccuracy score_answers(const std::vector<data::SftRecord>& records, const std::vector<std::string>& generated,
                           const data::Tokenizer& tokenizer, data::SftTemplate tmpl, size_t keep_examples = 5);

/// Held-out task accuracy: the first max_records (<= 0: all) records of the SFT JSONL
/// file, each rendered as a prompt only (template_name: plain | chatml), answered
/// greedily (max_new_tokens <= 0: longest expected answer in tokens + 8) and scored
/// with score_answers.
TaskAccuracy eval_tasks(model::Model& m, const data::Tokenizer& tokenizer, const std::string& jsonl,
                        const std::string& template_name, int max_records, int max_new_tokens = 0);

// ----------------------------------------------------------------------------
/// A model to evaluate plus what is needed to feed it (for `dtrain eval` / `generate`).
struct EvalTarget {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::optional<config::TrainConfig> cfg;  ///< the run's config, when one was found
  std::string template_name = "plain";
  std::string valid;    ///< data.valid of the config ("" without a config)
  int64_t seq_len = 0;  ///< data.seq_len of the config, else the model's max_seq_len
  std::string weights;  ///< what was loaded: a directory, or "initial weights (seed N)"
};

/// Finds the model and its settings for `dir`:
///  - the config: config_path when given, else dir/config.yaml (a run directory; the
///    launcher writes it), else none (byte tokenizer, plain template);
///  - the weights: with init_weights, the config's initial model (random init from
///    training.seed, or model.init_from) - the "before training" baseline, and the only
///    way to get it; else dir/final/ (a finished run), else dir itself when it holds
///    config.json (an HF model directory), else the run's latest complete checkpoint
///    (a run with no final/: which one is logged on stderr).
/// UsageError when nothing usable is found, CheckpointError when the run has
/// checkpoints/ but no usable checkpoint.
EvalTarget eval_target_load(const std::string& dir, const std::string& config_path = "", bool init_weights = false);

}  // namespace dtrain::train
