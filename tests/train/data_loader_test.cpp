// data_load: the datasets of a config. data.mix weighs the LLaMA-Factory datasets of
// data.dataset and only those: a data.valid file beside them loads as a plain data file
// (issue 43, item 13), while data.mix without data.dataset stays an error naming both keys.
#include "config/train_config.h"
#include "core/error.h"
#include "train/data_loader.h"

#include "temp_dir.h"

#include <doctest/doctest.h>

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
