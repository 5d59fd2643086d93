// data_load: the datasets of a config. data.mix weighs the LLaMA-Factory datasets of
// data.dataset and only those: a data.valid file beside them loads as a plain data file
// (issue 43, item 13), while data.mix without data.dataset stays an error naming both keys.
// BatchReader over preference pairs: both sides of a pair in one micro-batch, ranks disjoint.
#include "config/train_config.h"
#include "data/dataset.h"
#include "core/error.h"
#include "train/data_loader.h"

#include "temp_dir.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
using dtrain::test::TempDir;

namespace {

// Two alpaca datasets of LLaMA-Factory's dataset_info.json in a dataset_dir.
void write_dataset_dir(const TempDir& d) {
  d.write("dataset_info.json", R"({"a": {"file_name": "a.jsonl"}, "b": {"file_name": "b.jsonl"}})");
  d.write("a.jsonl",
          "{\"instruction\": \"Add 1 and 2.\", \"input\": \"\", \"output\": \"3\"}\n"
          "{\"instruction\": \"Add 2 and 2.\", \"input\": \"\", \"output\": \"4\"}\n");
  d.write("b.jsonl", "{\"instruction\": \"Say hi.\", \"input\": \"\", \"output\": \"hi\"}\n");
}

config::TrainConfig load(const std::vector<std::string>& sets) {
  const char* yaml = R"(
train_micro_batch_size_per_gpu: 2
model:
  architecture: llama
  vocab_size: 264
  n_layer: 1
  n_head: 2
  d_model: 32
  max_seq_len: 64
data:
  format: alpaca
  tokenizer: byte
  seq_len: 64
training:
  max_steps: 2
)";
  return config::config_load_string(yaml, "dl.yaml", sets).cfg;
}

}  // namespace

TEST_CASE("data.mix weighs data.dataset; data.valid beside them is a plain file, not refused") {
  TempDir dir("data-loader");
  write_dataset_dir(dir);
  const std::string valid = "configs/data/tasks/valid.jsonl";
  const config::TrainConfig cfg =
      load({"data.train=" + dir.path.string(), "data.dataset=a,b", "data.mix=[1, 1]", "data.valid=" + valid});
  const TrainData d = data_load(cfg, 264, 64);
  REQUIRE(d.train != nullptr);
  REQUIRE(d.valid != nullptr);
  CHECK(d.train->size() > 0);
  CHECK(d.valid->size() > 0);
  // The valid set is the file, tokenized as data.format says: the same as without a mix.
  const TrainData plain =
      data_load(load({"data.train=" + dir.path.string(), "data.dataset=a,b", "data.valid=" + valid}), 264, 64);
  CHECK(d.valid->size() == plain.valid->size());

  // A mix with nothing to weigh is still refused, naming the key and what to do.
  const config::TrainConfig no_dataset = load({"data.train=" + valid, "data.mix=[1, 1]"});
  CHECK_THROWS_WITH_AS(data_load(no_dataset, 264, 64),
                       doctest::Contains("data.mix weights the datasets of data.dataset, which is not set: set "
                                         "data.dataset or remove data.mix"),
                       ConfigError);
}

// ----------------------------------------------------------------------------
// BatchReader over pairwise (preference) data

namespace {

// Pair k: prompt {100 + k, 7} then chosen {200 + k} or rejected {300 + k, 9}; answers trained.
data::TokenDataset pair_dataset(size_t n) {
  data::TokenData d;
  d.vocab_size = 512;
  d.pairwise = true;
  for (size_t k = 0; k < n; ++k) {
    const auto id = static_cast<int32_t>(k);
    d.append({100 + id, 7, 200 + id}, {0, 0, 1});
    d.append({100 + id, 7, 300 + id, 9}, {0, 0, 1, 1});
  }
  data::DatasetOptions o;
  o.seq_len = 6;
  o.mode = data::SampleMode::PAD;
  return data::TokenDataset(std::move(d), o);
}

}  // namespace

TEST_CASE("BatchReader on pairs: micro_batch counts pairs, 2x rows, both sides together, ranks disjoint") {
  const data::TokenDataset ds = pair_dataset(21);
  constexpr int kMicro = 3, kRanks = 2;
  std::vector<std::vector<int>> seen(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    BatchReader reader(ds, kMicro, rank, kRanks, 99, true);
    CHECK(reader.rows_per_sample() == 2);
    // 21 pairs over 2 ranks (drop_last: 10 each) in micro-batches of 3 pairs.
    CHECK(reader.steps_per_epoch(1) == 3);
    for (int64_t step = 0; step < reader.steps_per_epoch(1); ++step) {
      std::vector<int32_t> in, tg;
      const int64_t count = reader.next(in, tg);
      REQUIRE(in.size() == static_cast<size_t>(2 * kMicro * 6));
      REQUIRE(tg.size() == in.size());
      int64_t unmasked = 0;
      for (int32_t t : tg) unmasked += t != data::IGNORE_INDEX;
      CHECK(count == unmasked);
      CHECK(count == kMicro * (1 + 2));  // one chosen answer token, two rejected ones, per pair
      for (int r = 0; r < kMicro; ++r) {
        const int32_t* chosen = in.data() + r * 6;
        const int32_t* rejected = in.data() + (kMicro + r) * 6;
        const int pair = chosen[0] - 100;
        CHECK(rejected[0] == chosen[0]);  // the same pair's two sides, rows r and micro + r
        CHECK(chosen[2] == 200 + pair);
        CHECK(rejected[2] == 300 + pair);
        seen[static_cast<size_t>(rank)].push_back(pair);
      }
    }
  }
  for (auto& s : seen) std::sort(s.begin(), s.end());
  CHECK(seen[0].size() == 9);
  CHECK(std::adjacent_find(seen[0].begin(), seen[0].end()) == seen[0].end());
  CHECK(std::adjacent_find(seen[1].begin(), seen[1].end()) == seen[1].end());
  std::vector<int> both;
  std::set_intersection(seen[0].begin(), seen[0].end(), seen[1].begin(), seen[1].end(), std::back_inserter(both));
  CHECK(both.empty());
}
