// data_load: the datasets of a config. data.mix weighs the LLaMA-Factory datasets of
// data.dataset and only those: a data.valid file beside them loads as a plain data file
// (issue 43, item 13), while data.mix without data.dataset stays an error naming both keys.
// Preference pairs: LLaMA-Factory ranking datasets, pairwise files and shards load for
// training.stage dpo (never packed), while sft on pairs and dpo on SFT data are refused by
// name; BatchReader over pairs keeps both sides of a pair in one micro-batch, ranks disjoint.
#include "config/train_config.h"
#include "data/dataset.h"
#include "data/llamafactory.h"
#include "data/prepare.h"
#include "data/shard.h"
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
      std::vector<int32_t> in, tg, ds{7};
      const int64_t count = reader.next(in, tg, ds);
      CHECK(ds.empty());  // pairs are padded: no document starts
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

// ----------------------------------------------------------------------------
// data_load on preference data: the stage and the data must agree

namespace {

// A LLaMA-Factory dataset_dir with a ranking dataset and an SFT one, and a plain pairwise
// JSONL file for data.valid.
void write_pref_dir(const TempDir& d) {
  d.write("dataset_info.json", R"({"p": {"file_name": "p.json", "ranking": true}, "a": {"file_name": "a.jsonl"}})");
  d.write("p.json", R"([{"instruction": "Add 1 and 2.", "input": "", "chosen": "3", "rejected": "4"},
                        {"instruction": "Add 2 and 2.", "input": "", "chosen": "4", "rejected": "5"},
                        {"instruction": "Say hi.", "input": "", "chosen": "hi", "rejected": "bye"}])");
  d.write("a.jsonl", "{\"instruction\": \"Say hi.\", \"input\": \"\", \"output\": \"hi\"}\n");
  d.write("valid.jsonl",
          "{\"instruction\": \"Add 3 and 3.\", \"input\": \"\", \"chosen\": \"6\", \"rejected\": \"7\"}\n");
}

// A config whose data.format is left to detection; stage set after loading (the config's
// validation is another module's).
config::TrainConfig load_auto(const std::vector<std::string>& sets, const std::string& stage) {
  std::vector<std::string> all = {"data.format=auto"};
  all.insert(all.end(), sets.begin(), sets.end());
  config::TrainConfig cfg = load(all);
  cfg.training.stage = stage;
  return cfg;
}

}  // namespace

TEST_CASE("data_load: preference pairs for training.stage dpo, never packed; the stage and the data must agree") {
  TempDir dir("data-loader-pref");
  write_pref_dir(dir);
  const std::string train = dir.path.string(), valid = (dir.path / "valid.jsonl").string();

  const TrainData d =
      data_load(load_auto({"data.train=" + train, "data.dataset=p", "data.valid=" + valid}, "dpo"), 264, 64);
  REQUIRE(d.train != nullptr);
  CHECK(d.train->pairwise());
  CHECK(d.train->size() == 3);
  REQUIRE(d.valid != nullptr);
  CHECK(d.valid->pairwise());
  CHECK(d.valid->size() == 1);

  // data.pack: true with pairs names the key; false is what pairs are anyway.
  CHECK_THROWS_WITH_AS(
      data_load(load_auto({"data.train=" + train, "data.dataset=p", "data.pack=true"}, "dpo"), 264, 64),
      doctest::Contains(("data.pack: true, but " + train + " holds pairwise (preference) data").c_str()), ConfigError);
  CHECK(data_load(load_auto({"data.train=" + train, "data.dataset=p", "data.pack=false"}, "dpo"), 264, 64)
            .train->pairwise());

  // sft on pairs (data.train or data.valid), dpo on SFT data: refused, naming the key and the stage.
  CHECK_THROWS_WITH_AS(data_load(load_auto({"data.train=" + train, "data.dataset=p"}, "sft"), 264, 64),
                       doctest::Contains(("data.train " + train +
                                          " [p] holds pairwise (preference) data, chosen/rejected "
                                          "pairs, which training.stage sft does not train")
                                             .c_str()),
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      data_load(load_auto({"data.train=" + train, "data.dataset=a", "data.valid=" + valid}, "sft"), 264, 64),
      doctest::Contains(("data.valid " + valid + " holds pairwise (preference) data").c_str()), ConfigError);
  CHECK_THROWS_WITH_AS(data_load(load_auto({"data.train=" + train, "data.dataset=a"}, "dpo"), 264, 64),
                       doctest::Contains(("training.stage dpo trains on pairwise (preference) data, but data.train " +
                                          train + " [a] holds SFT or text data")
                                             .c_str()),
                       ConfigError);
  CHECK_THROWS_WITH_AS(data_load(load_auto({"data.train=configs/data/tasks/valid.jsonl"}, "dpo"), 264, 64),
                       doctest::Contains("configs/data/tasks/valid.jsonl holds SFT or text data"), ConfigError);
  // A plain pairwise file as data.train, told by its records.
  const TrainData f = data_load(load_auto({"data.train=" + valid}, "dpo"), 264, 64);
  CHECK(f.train->pairwise());

  // Pairwise shards: data.format tokens gives the same pairs, and the same refusals.
  data::TokenData td = data::data_tokenize_pairs(data::llamafactory_load_pairs(train, "p"), "p", data::ByteTokenizer());
  const std::string shard = (dir.path / "p.bin").string();
  data::shard_write(shard, td);
  const TrainData s = data_load(load_auto({"data.train=" + shard, "data.format=tokens"}, "dpo"), 264, 64);
  REQUIRE(s.train->size() == d.train->size());
  for (size_t k = 0; k < s.train->size(); ++k) {
    CHECK(s.train->pair(k).chosen.inputs == d.train->pair(k).chosen.inputs);
    CHECK(s.train->pair(k).rejected.targets == d.train->pair(k).rejected.targets);
  }
  CHECK_THROWS_WITH_AS(data_load(load_auto({"data.train=" + shard}, "sft"), 264, 64),
                       doctest::Contains(("data.train " + shard + " holds pairwise (preference) data").c_str()),
                       ConfigError);
}
