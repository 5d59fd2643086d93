// export_run and eval_run / generate_run, the one calls behind `dtrain export`, `eval` and
// `generate`: the model each picks in a run directory and the rules they refuse with.
#include "config/train_config.h"
#include "core/error.h"
#include "train/eval_run.h"
#include "train/export_run.h"

#include "temp_dir.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

using namespace dtrain;
using namespace dtrain::train;

namespace {

namespace fs = std::filesystem;

// A run directory holding only its config.yaml (no final/, no checkpoint).
void write_run(const test::TempDir& run, const std::string& data) {
  const std::string yaml =
      "train_micro_batch_size_per_gpu: 2\n"
      "model: {architecture: llama, vocab_size: 264, n_layer: 1, n_head: 2, d_model: 16, max_seq_len: 32}\n"
      "data: " +
      data + "\ntraining: {max_steps: 1, seed: 5}\n";
  auto cfg = config::config_load_string(yaml, "t.yaml", {}, fs::current_path().string()).cfg;
  std::ofstream(run.path / "config.yaml") << config::config_to_yaml(cfg);
}

ExportRunOptions export_opts(const test::TempDir& run, bool init, const std::string& out = "") {
  ExportRunOptions o;
  o.run_dir = run.path.string();
  o.out_dir = out;
  o.init_weights = init;
  return o;
}

EvalRunOptions eval_opts(const test::TempDir& run) {
  EvalRunOptions o;
  o.dir = run.path.string();
  o.init_weights = true;
  return o;
}

}  // namespace

TEST_CASE("export_run: --init writes the initial model into RUN_DIR/export; without a model it names --init") {
  test::TempDir run("export-run");
  write_run(run, "{train: configs/data/tasks/train.jsonl, format: alpaca, seq_len: 32}");
  CHECK_THROWS_WITH_AS(export_run(export_opts(run, false)), doctest::Contains("--init"), Error);
  export_run(export_opts(run, true));
  CHECK(fs::exists(run.path / "export" / "model.safetensors"));
  CHECK(fs::exists(run.path / "export" / "config.json"));
  // The output rule: never the run directory itself.
  CHECK_THROWS_AS(export_run(export_opts(run, true, run.path.string())), Error);
}

TEST_CASE("eval_run refuses a run that trained on plain text, and a run without evaluation data") {
  test::TempDir run("eval-run");
  write_run(run,
            "{train: configs/data/tasks/train.jsonl, valid: configs/data/tasks/valid.jsonl, format: text, "
            "seq_len: 32}");
  CHECK_THROWS_WITH_AS(eval_run(eval_opts(run)),
                       doctest::Contains("but dtrain eval measures task accuracy on SFT records"), UsageError);
  test::TempDir bare("eval-run");
  write_run(bare, "{train: configs/data/tasks/train.jsonl, format: alpaca, seq_len: 32}");
  CHECK_THROWS_WITH_AS(eval_run(eval_opts(bare)), doctest::Contains("no evaluation data: pass --data FILE.jsonl"),
                       UsageError);
}

TEST_CASE("generate_run answers from the initial model") {
  test::TempDir run("generate-run");
  write_run(run, "{train: configs/data/tasks/train.jsonl, format: alpaca, seq_len: 32}");
  GenerateRunOptions o;
  o.dir = run.path.string();
  o.prompt = "Add 1 and 2.";
  o.max_new_tokens = 4;
  o.init_weights = true;
  generate_run(o);
}
