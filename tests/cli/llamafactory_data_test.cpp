// A LLaMA-Factory data directory, written here in the format of LLaMA-Factory's
// data/README.md (dataset_info.json naming an alpaca dataset with system and history
// columns and a sharegpt dataset with from/value conversations), trains unchanged through
// `dtrain launch` with data.train = the dataset_dir and data.dataset = the names,
// concatenated and mixed by data.mix, with the qwen and chatml templates on the byte
// tokenizer (which has their <|im_start|> / <|im_end|>; llama3's tokens it lacks, and
// that template is refused with it); a record whose turns do not alternate stops the job with an error naming the
// file, the line, the record and the field.
#include "run_binary.h"
#include "skip.h"
#include "tiny_job.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using dtrain::test::run_dtrain;
using nlohmann::json;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The shipped alpaca task records, as LLaMA-Factory data: the first half as an alpaca
// .json (pretty-printed, every third with a system prompt and the previous record as
// history), the second half as a sharegpt .json.
void write_dataset_dir(const fs::path& dir) {
  std::vector<json> tasks;
  std::istringstream in(slurp(fs::path(dtrain::cli_test::shipped_data_dir()) / "train.jsonl"));
  for (std::string line; std::getline(in, line) && tasks.size() < 200;)
    if (!line.empty()) tasks.push_back(json::parse(line));
  REQUIRE(tasks.size() >= 100);
  json alpaca = json::array(), sharegpt = json::array();
  for (size_t i = 0; i < tasks.size(); ++i) {
    const json& t = tasks[i];
    if (i < tasks.size() / 2) {
      json r = {{"instruction", t["instruction"]}, {"input", t["input"]}, {"output", t["output"]}};
      if (i % 3 == 1) {
        r["system"] = "Answer with the result only.";
        r["history"] = json::array({json::array({tasks[i - 1]["instruction"], tasks[i - 1]["output"]})});
      }
      alpaca.push_back(r);
    } else {
      std::string q = t["instruction"].get<std::string>();
      if (!t["input"].get<std::string>().empty()) q += "\n" + t["input"].get<std::string>();
      sharegpt.push_back({{"conversations", json::array({{{"from", "human"}, {"value", q}},
                                                         {{"from", "gpt"}, {"value", t["output"]}}})}});
    }
  }
  fs::create_directories(dir);
  std::ofstream(dir / "alpaca_tasks.json") << alpaca.dump(2);
  std::ofstream(dir / "sharegpt_tasks.json") << sharegpt.dump(2);
  const json info = {{"tasks_alpaca",
                      {{"file_name", "alpaca_tasks.json"},
                       {"columns",
                        {{"prompt", "instruction"},
                         {"query", "input"},
                         {"response", "output"},
                         {"system", "system"},
                         {"history", "history"}}}}},
                     {"tasks_sharegpt",
                      {{"file_name", "sharegpt_tasks.json"},
                       {"formatting", "sharegpt"},
                       {"columns", {{"messages", "conversations"}}}}}};
  std::ofstream(dir / "dataset_info.json") << info.dump(2);
}

// The tiny CPU job with data.train replaced by the LLaMA-Factory dataset_dir and names.
std::string job(const fs::path& dataset_dir, const std::string& data_lines) {
  std::string y = dtrain::cli_test::tiny_job(
      {.top = "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 1\nsteps_per_print: 1\n",
       .n_layer = 1,
       .seq_len = 64,
       .max_steps = 4,
       .save_steps = 4,
       .training_more = "  device: cpu\n",
       .rest = "fault_tolerance:\n  max_retries: 0\n  retry_delay: 1\n"});
  const size_t at = y.find("  train: ");
  REQUIRE(at != std::string::npos);
  y.replace(at, y.find('\n', at) + 1 - at, "  train: " + dataset_dir.string() + "\n" + data_lines);
  return y;
}

}  // namespace

TEST_CASE("a LLaMA-Factory dataset_dir (alpaca + sharegpt) trains through dtrain launch; bad records are named") {
  if (!dtrain::test::dtrain_bin()) {
    ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
    return;
  }
  const fs::path dir = fs::temp_directory_path() / ("dtrain-lf-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path data = dir / "data";
  write_dataset_dir(data);

  struct Case {
    const char* name;
    std::string lines;
  };
  const Case cases[] = {
      {"concatenated, qwen", "  dataset: tasks_alpaca,tasks_sharegpt\n  template: qwen\n"},
      {"mixed 3:1, chatml", "  dataset: tasks_alpaca, tasks_sharegpt\n  mix: [3, 1]\n  template: chatml\n"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const fs::path run = dir / (std::string("run-") + std::to_string(&c - cases));
    std::ofstream(dir / "job.yaml") << job(data, c.lines);
    auto r = run_dtrain(
        "launch --config " + (dir / "job.yaml").string() + " --master-port 0 --output-dir " + run.string(), 180);
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("step 4/4 | loss ") != std::string::npos);
  }

  // Two human turns in a row in the sharegpt file's third record: the job stops, naming the
  // file, the line the record starts on, the record and the field.
  json bad = json::parse(slurp(data / "sharegpt_tasks.json"));
  bad[2]["conversations"][1]["from"] = "human";
  std::ofstream(data / "sharegpt_tasks.json") << bad.dump(2);
  const std::string text = slurp(data / "sharegpt_tasks.json");
  size_t line = 1, objects = 0;
  for (size_t i = 0; i < text.size(); ++i) {  // the line of the third top-level record's "{"
    if (text[i] == '\n') ++line;
    if (text.compare(i, 4, "  {\n") == 0 && (i == 0 || text[i - 1] == '\n') && ++objects == 3) break;
  }
  std::ofstream(dir / "job.yaml") << job(data, "  dataset: tasks_alpaca,tasks_sharegpt\n  template: chatml\n");
  auto r = run_dtrain(
      "launch --config " + (dir / "job.yaml").string() + " --master-port 0 --output-dir " + (dir / "run-bad").string(),
      180);
  INFO(r.out);
  CHECK(r.code != 0);
  const std::string want = (data / "sharegpt_tasks.json").string() + ":" + std::to_string(line) +
                           ": record 2 of dataset 'tasks_sharegpt': \"conversations\"[1].\"from\" is 'human' where a "
                           "gpt/function_call turn belongs";
  CHECK_MESSAGE(r.out.find(want) != std::string::npos, want);
  fs::remove_all(dir);
}
