// run_dir_resume_inputs: what `dtrain resume RUN_DIR` takes from the run directory (its
// config.yaml and hostfile unless given) and the sets a saved config needs.
#include "launch/run_dir_resume.h"

#include "core/error.h"
#include "temp_dir.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::launch;

namespace {

const std::string kModel =
    "model: {architecture: llama, vocab_size: 512, n_layer: 2, n_head: 4, d_model: 64, max_seq_len: 32}\n"
    "training: {max_steps: 10}\n";
const std::string kConfig = kModel + "data: {train: x.jsonl}\n";

ResumeInputs inputs(const test::TempDir& run, const std::string& config = "", const std::string& hostfile = "",
                    const std::vector<std::string>& sets = {}) {
  ResumeInputs in;
  in.run_dir = run.path.string();
  in.config = config;
  in.hostfile = hostfile;
  in.sets = sets;
  return run_dir_resume_inputs(in);
}

}  // namespace

TEST_CASE("a run directory without config.yaml is refused unless a config is given") {
  test::TempDir run("resume");
  CHECK_THROWS_WITH_AS(inputs(run), doctest::Contains("has no config.yaml: is it a dtrain run directory?"), UsageError);
  const auto other = run.write("other.yaml", kModel + "data: {train: x.jsonl, neat_packing: true}\n");
  const ResumeInputs in = inputs(run, other.string());
  CHECK(in.config == other.string());
  CHECK(in.hostfile.empty());
  CHECK(in.sets.empty());  // a config given: no rule for an older run's saved config
}

TEST_CASE("the saved config and hostfile are taken, and a pre-neat_packing run keeps packing") {
  test::TempDir run("resume");
  run.write("config.yaml", kConfig);
  run.write("hostfile", "localhost slots=1\n");
  const ResumeInputs in = inputs(run, "", "", {"training.max_steps=12"});
  CHECK(in.config == (run.path / "config.yaml").string());
  CHECK(in.hostfile == (run.path / "hostfile").string());
  CHECK(in.sets == std::vector<std::string>{"data.neat_packing=false", "training.max_steps=12"});
  // A hostfile given wins over the run's.
  CHECK(inputs(run, "", "hf").hostfile == "hf");
}
