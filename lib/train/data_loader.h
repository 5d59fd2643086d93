// The training data of a config: the tokenizer, the train/valid TokenDatasets (SFT, text
// or preference pairs tokenized in memory at start, or token shards when data.format is
// "tokens") and the per-rank micro-batch reader over a DistributedSampler.
#pragma once

#include "config/train_config.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::train {

/// Reads one dataset path the way data.format says: "text" / "alpaca" / "chat" /
/// "pairwise" are tokenized in memory with `tokenizer` (SFT and pairs through
/// data.template); "tokens" reads a token shard, or every regular file of a directory
/// (sorted by name) as shards; with data.dataset, data.train is LLaMA-Factory's
/// dataset_dir ("ranking": true datasets are pairwise). Samples are seq_len long, packed
/// (data.pack) or one record per sample; pairwise data is one pair per sample, never
/// packed (data.pack: true with it is a ConfigError).
data::TokenDataset dataset_load(const std::string& path, const config::DataConfig& dcfg,
                                const data::Tokenizer& tokenizer, int64_t seq_len);

struct TrainData {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<data::TokenDataset> train;
  std::unique_ptr<data::TokenDataset> valid;  ///< null when data.valid is ""
};

/// Loads the tokenizer and both datasets of cfg.data. seq_len = data.seq_len (else the
/// model's max_seq_len passed in). ConfigError when the tokenizer or the data use ids
/// outside [0, model_vocab_size), when training.stage sft is given pairwise (preference)
/// data (data.train or data.valid), or training.stage dpo a data.train that is not pairwise.
TrainData data_load(const config::TrainConfig& cfg, int model_vocab_size, int64_t model_max_seq_len);

/// One rank's micro-batches: rows of [micro_batch, seq_len] inputs and targets drawn
/// from the DistributedSampler (rank r reads global order entries r, r+W, ...). On a
/// pairwise dataset micro_batch counts PAIRS and a micro-batch is 2 * micro_batch rows:
/// the chosen sequences, then the rejected ones in the same order (TokenDataset::batch),
/// so both sides of a pair are always in the same micro-batch.
class BatchReader {
 public:
  BatchReader(const data::TokenDataset& dataset, int micro_batch, int rank, int world_size, uint64_t seed,
              bool shuffle);
  /// Fills inputs/targets ([rows_per_sample() * micro_batch * seq_len] each), and doc_start
  /// likewise when the dataset's samples have document starts (else clears it); returns
  /// the unmasked target count of all rows.
  int64_t next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets, std::vector<int32_t>& doc_start);
  /// Rows per sample: 2 on a pairwise dataset (chosen and rejected), else 1.
  int rows_per_sample() const { return ds_.rows_per_sample(); }
  /// Optimizer steps in one epoch for `accum` micro-batches per step (at least 1); on a
  /// pairwise dataset the epoch is its pairs.
  int64_t steps_per_epoch(int64_t accum) const;
  /// The sampler's GLOBAL position (samples consumed by all ranks in its epoch): saved
  /// in checkpoints, valid at any world size.
  data::SamplerPosition position() const { return sampler_.position(); }
  /// Resume: the next micro-batch starts at this global position.
  void set_position(data::SamplerPosition p) { sampler_.set_position(p); }
  const data::DistributedSampler& sampler() const { return sampler_; }
  data::DistributedSampler& sampler() { return sampler_; }
  int micro_batch() const { return micro_; }  ///< samples (pairs, when pairwise) per micro-batch
  /// The dataset indices (samples, or pairs) of the last micro-batch next() filled, in row
  /// order: a preference step looks its precomputed reference sums up by them.
  const std::vector<size_t>& last_indices() const { return idx_; }

 private:
  const data::TokenDataset& ds_;
  int micro_;
  data::DistributedSampler sampler_;
  std::vector<size_t> idx_;
};

}  // namespace dtrain::train
