// Tokenizes the configured data in memory (or opens token shards), SFT/text or
// preference pairs, and hands each rank its micro-batches in sampler order.
#include "train/data_loader.h"

#include "core/check.h"
#include "core/log.h"
#include "data/llamafactory.h"
#include "data/prepare.h"
#include "data/shard.h"

#include <algorithm>
#include <filesystem>
#include <utility>

namespace dtrain::train {

namespace fs = std::filesystem;

// ----------------------------------------------------------------------------
namespace {

// What a data path holds, before anything is tokenized.
struct DataKind {
  std::string format;    // data.format, told from the file when "auto"; "" for LLaMA-Factory datasets
  std::string evidence;  // why, when told from the file
  bool llamafactory = false;
  bool pairwise = false;
  std::vector<std::string> shards;  // format "tokens"
};

DataKind data_kind(const std::string& path, const config::DataConfig& dcfg) {
  DT_ENFORCE(dcfg.dataset.empty() || dcfg.format != "tokens", ConfigError,
             "data.dataset names LLaMA-Factory datasets, but data.format is tokens (pre-tokenized shards): drop one "
             "of them");
  DataKind k;
  k.llamafactory = !dcfg.dataset.empty() && path == dcfg.train;
  if (k.llamafactory) {
    // LLaMA-Factory: data.train is the dataset_dir, data.dataset its dataset names; the
    // entries say whether they are preference ("ranking": true) datasets.
    k.pairwise = data::llamafactory_ranking(path, dcfg.dataset);
    return k;
  }
  k.format = dcfg.format;
  if (k.format == "auto") {
    // data.format not given: the file's records say.
    const data::DataFormatGuess guess = data::data_format_detect(path);
    k.format = guess.name;
    k.evidence = guess.evidence;
  }
  if (k.format == "tokens") {
    std::error_code ec;  // a link loop or a missing path: the shard's open names it
    if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::directory_iterator(path, ec)) {
        std::error_code entry_ec;
        if (e.is_regular_file(entry_ec)) k.shards.push_back(e.path().string());
      }
      std::sort(k.shards.begin(), k.shards.end());
      DT_ENFORCE(!k.shards.empty(), ConfigError, "data: directory {} holds no token shards", path);
    } else {
      k.shards.push_back(path);
    }
    // The header says (TokenDataset checks that every shard agrees).
    k.pairwise = data::ShardReader(k.shards[0], false).pairwise();
    return k;
  }
  k.pairwise = k.format == "pairwise";
  return k;
}

// data.pack: packed unless it says not to; pairwise data is never packed.
data::SampleMode sample_mode(const std::string& path, const config::DataConfig& dcfg, bool pairwise) {
  if (!pairwise) return dcfg.pack.value_or(true) ? data::SampleMode::PACK : data::SampleMode::PAD;
  DT_ENFORCE(!dcfg.pack.value_or(false), ConfigError,
             "data.pack: true, but {} holds pairwise (preference) data, which is one (chosen, rejected) pair per "
             "sample and never packed: set data.pack: false or leave it out",
             path);
  return data::SampleMode::PAD;
}

}  // namespace

data::TokenDataset dataset_load(const std::string& path, const config::DataConfig& dcfg,
                                const data::Tokenizer& tokenizer, int64_t seq_len) {
  const DataKind kind = data_kind(path, dcfg);
  if (!kind.evidence.empty())
    log_info("data: {} read as data.format {} ({}; data.format not given)", path, kind.format, kind.evidence);
  data::DatasetOptions opts;
  opts.seq_len = seq_len;
  opts.mode = sample_mode(path, dcfg, kind.pairwise);
  // data.neat_packing: packed examples apart, except in a plain-text stream.
  opts.isolate = opts.mode == data::SampleMode::PACK && dcfg.neat_packing.value_or(data::neat_packing_default(
                                                            kind.llamafactory ? "alpaca" : kind.format, path));
  if (opts.mode == data::SampleMode::PACK)
    log_info("data: {} packed, {}", path,
             opts.isolate
                 ? "whole examples, each attending only within itself (data.neat_packing)"
                 : "the token stream cut into sequences, attention across examples (data.neat_packing: false)");
  if (kind.format == "tokens") return data::TokenDataset(kind.shards, opts);
  data::DataPrepareOptions popts;
  popts.sft_template = dcfg.template_name;
  popts.train_on_prompt = dcfg.train_on_prompt;
  if (kind.llamafactory) {
    std::vector<double> mix;
    for (const std::string& w : dcfg.mix) {
      size_t used = 0;
      double v = -1;
      try {
        v = std::stod(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      DT_ENFORCE(used == w.size() && used > 0, ConfigError, "data.mix: '{}' is not a number (one weight per dataset)",
                 w);
      mix.push_back(v);
    }
    const std::string name = path + " [" + dcfg.dataset + "]";
    data::TokenData td =
        kind.pairwise
            ? data::data_tokenize_pairs(data::llamafactory_load_pairs(path, dcfg.dataset, mix), name, tokenizer, popts)
            : data::data_tokenize_records(data::llamafactory_load(path, dcfg.dataset, mix), name, tokenizer, popts);
    return data::TokenDataset(std::move(td), opts);
  }
  // data.mix weighs data.dataset's datasets; data.valid beside them is a plain data file
  // (data.format), which the mix does not apply to.
  DT_ENFORCE(dcfg.mix.empty() || !dcfg.dataset.empty(), ConfigError,
             "data.mix weights the datasets of data.dataset, which is not set: set data.dataset or remove data.mix");
  data::TokenData td = data::data_tokenize(path, data::data_format_parse(kind.format), tokenizer, popts);
  return data::TokenDataset(std::move(td), opts);
}

TrainData data_load(const config::TrainConfig& cfg, int model_vocab_size, int64_t model_max_seq_len) {
  const auto& d = cfg.data;
  DT_ENFORCE(!d.train.empty(), ConfigError, "{}: data.train is required to train", cfg.source);
  TrainData out;
  out.tokenizer = data::tokenizer_load(d.tokenizer);
  DT_ENFORCE(out.tokenizer->vocab_size() <= model_vocab_size, ConfigError,
             "{}: tokenizer {} has {} tokens but model.vocab_size is {}; raise model.vocab_size", cfg.source,
             out.tokenizer->name(), out.tokenizer->vocab_size(), model_vocab_size);
  const int64_t seq_len = d.seq_len.value_or(model_max_seq_len);
  DT_ENFORCE(seq_len >= 2, ConfigError,
             "{}: data.seq_len {} leaves no token to predict (a training sequence needs at least 2 tokens); set "
             "data.seq_len to 2 or more",
             cfg.source, seq_len);
  DT_ENFORCE(seq_len <= model_max_seq_len, ConfigError, "{}: data.seq_len {} exceeds the model's max_seq_len {}",
             cfg.source, seq_len, model_max_seq_len);
  // The objective and the data must agree, told before anything is tokenized: training.stage
  // sft trains SFT or text data, dpo preference pairs.
  const bool dpo = cfg.training.stage == "dpo";
  for (const auto& [key, path] : {std::pair{"data.train", d.train}, std::pair{"data.valid", d.valid}}) {
    if (path.empty()) continue;
    const bool pairwise = data_kind(path, d).pairwise;
    DT_ENFORCE(!pairwise || dpo, ConfigError,
               "{}: {} {} holds pairwise (preference) data, chosen/rejected pairs, which training.stage {} does not "
               "train: set training.stage: dpo, or give SFT data",
               cfg.source, key,
               path + (key == std::string("data.train") && !d.dataset.empty() ? " [" + d.dataset + "]" : ""),
               cfg.training.stage);
    DT_ENFORCE(pairwise || !dpo || key != std::string("data.train"), ConfigError,
               "{}: training.stage dpo trains on pairwise (preference) data, but data.train {} holds SFT or text data: "
               "give LLaMA-Factory datasets with \"ranking\": true, JSONL records with chosen and rejected "
               "(data.format pairwise), or shards `dtrain data prepare` made of them",
               cfg.source, path + (d.dataset.empty() ? "" : " [" + d.dataset + "]"));
  }
  out.train = std::make_unique<data::TokenDataset>(dataset_load(d.train, d, *out.tokenizer, seq_len));
  DT_ENFORCE(out.train->vocab_size() <= model_vocab_size, ConfigError,
             "{}: data {} uses vocab_size {} but model.vocab_size is {}", cfg.source, d.train, out.train->vocab_size(),
             model_vocab_size);
  if (!d.valid.empty()) {
    out.valid = std::make_unique<data::TokenDataset>(dataset_load(d.valid, d, *out.tokenizer, seq_len));
    DT_ENFORCE(out.valid->vocab_size() <= model_vocab_size, ConfigError,
               "{}: data {} uses vocab_size {} but model.vocab_size is {}", cfg.source, d.valid,
               out.valid->vocab_size(), model_vocab_size);
  }
  return out;
}

// ----------------------------------------------------------------------------
BatchReader::BatchReader(const data::TokenDataset& dataset, int micro_batch, int rank, int world_size, uint64_t seed,
                         bool shuffle)
    : ds_(dataset), micro_(micro_batch), sampler_(dataset.size(), rank, world_size, seed, shuffle, true) {
  DT_ENFORCE_GT(micro_batch, 0, ConfigError, "micro batch size");
}

int64_t BatchReader::next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                          std::vector<int32_t>& doc_start) {
  const size_t T = static_cast<size_t>(ds_.seq_len());
  inputs.resize(static_cast<size_t>(ds_.rows_per_sample()) * static_cast<size_t>(micro_) * T);
  targets.resize(inputs.size());
  doc_start.resize(ds_.doc_starts() ? inputs.size() : 0);
  idx_.resize(static_cast<size_t>(micro_));
  for (auto& i : idx_) i = sampler_.next();
  ds_.batch(idx_, inputs.data(), targets.data(), doc_start.empty() ? nullptr : doc_start.data());
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != data::IGNORE_INDEX; });
}

int64_t BatchReader::steps_per_epoch(int64_t accum) const {
  return std::max<int64_t>(1, static_cast<int64_t>(sampler_.steps_per_epoch()) / (micro_ * accum));
}

}  // namespace dtrain::train
