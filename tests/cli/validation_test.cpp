// Issue 43's crash and validation items through the real binary: `data prepare --chunk-mb
// nan` is a usage error naming the flag (item 11); a template whose turn tokens the
// tokenizer lacks is refused (17); monitor.min_free_memory above the node's memory stops
// the job at once, naming the key and the memory (14); a checkpoint manifest whose buffer
// size its shards do not hold is damaged, so eval, generate and export fall back to the
// previous checkpoint, and with none usable they name --init (20). One tiny trained run
// (4 steps, checkpoints at 2 and 4) serves the last case.
#include "refusal_harness.h"

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kCheckpoint = 7;

RunResult run60(const std::vector<std::string>& argv) { return run(argv, {}, 60s); }

}  // namespace

TEST_CASE("data prepare: --chunk-mb nan, inf or text is a usage error naming the flag; llama3 needs its tokens") {
  const std::string bin = bin_or_skip("validation");
  if (bin.empty()) return;
  TempDir tmp("dtrain-val-prep");
  const std::string in = shipped_data_dir() + "/valid.jsonl", out = tmp.path() + "/out.bin";
  for (const std::string v : {"nan", "-nan", "inf", "-inf", "NaN", "1e999", "x", "0", "2000"}) {
    CAPTURE(v);
    expect_refused(run60({bin, "data", "prepare", in, out, "--format", "alpaca", "--chunk-mb", v}),
                   {"--chunk-mb must be a number from 0.001 to 1024 (got '" + v + "')"});
  }
  CHECK(!fs::exists(out));
  RunResult r = run60({bin, "data", "prepare", in, out, "--format", "alpaca", "--chunk-mb", "0.5"});
  INFO(r.out);
  CHECK(r.rc == 0);

  // The byte tokenizer has no <|eot_id|>: llama3 would spell it out as 10 bytes and train on them.
  expect_refused(
      run60({bin, "data", "prepare", in, tmp.path() + "/l3.bin", "--format", "alpaca", "--template", "llama3"}),
      {"data.template llama3 writes <|start_header_id|>, <|end_header_id|>, <|eot_id|> as single tokens, "
       "but tokenizer 'byte' has no"});
}

TEST_CASE("monitor.min_free_memory above the node's memory stops the job at once, naming the key and the memory") {
  const std::string bin = bin_or_skip("validation");
  if (bin.empty()) return;
  // 1e10: bytes where GiB are meant (tests/config/batch_test.cpp has the bounds).
  TinyTmp t;
  const RunResult r = run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0", "--set",
                           "monitor.min_free_memory=1e10"},
                          {}, 60s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "monitor.min_free_memory = 10000000000 GiB is more than this node's "));
  CHECK(contains(r.out, "monitor.min_free_memory is in GiB, not bytes"));
  CHECK(contains(r.out, "not restarting"));
  CHECK(!contains(r.out, "step 1/"));
}

TEST_CASE("a manifest size the shards do not hold: the previous checkpoint is used; none usable names --init") {
  const std::string bin = bin_or_skip("validation");
  if (bin.empty()) return;
  TinyTmp t(2);
  // seq_len 128: room for the held-out records eval scores.
  std::ofstream(t.config, std::ios::trunc)
      << tiny_job({.top = "train_micro_batch_size_per_gpu: 4\nsteps_per_print: 1\n",
                   .n_layer = 1,
                   .seq_len = 128,
                   .save_steps = 2,
                   .training_more = "  device: cpu\n",
                   .rest = "fault_tolerance:\n  max_retries: 0\n"});
  const RunResult trained =
      run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0"}, {}, 120s);
  INFO(trained.out);
  REQUIRE(trained.rc == 0);
  fs::remove_all(t.run + "/final");  // as if interrupted after its last checkpoint
  const std::string step2 = t.run + "/checkpoints/step2", step4 = t.run + "/checkpoints/step4";
  const std::string valid = shipped_data_dir() + "/valid.jsonl";
  edit_manifest(step4 + "/manifest.json", [](nlohmann::json& m) { m["buffers"][0]["size"] = uint64_t{1} << 62; });

  RunResult r = run60({bin, "eval", t.run, "--data", valid, "--max-records", "2"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, step4 + "/manifest.json: \"buffers\"[0].size is 4611686018427387904, but rank0.bin holds"));
  CHECK(contains(r.out, "using its latest complete checkpoint " + step2 + " (step 2)"));
  CHECK(!contains(r.out, "describes another model"));
  r = run60({bin, "generate", t.run, "add 1 and 2", "--max-new-tokens", "2"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "using its latest complete checkpoint " + step2 + " (step 2)"));
  r = run60({bin, "export", t.run, "-o", t.path("hf")});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "export: " + step2 + " (step 2"));

  // No usable checkpoint at all: exit 7 naming --init, for eval and generate as for export.
  edit_manifest(step2 + "/manifest.json", [](nlohmann::json& m) { m["buffers"][0]["size"] = uint64_t{1} << 62; });
  for (const std::string cmd : {"eval", "generate", "export"}) {
    CAPTURE(cmd);
    std::vector<std::string> argv{bin, cmd, t.run};
    if (cmd == "eval") argv.insert(argv.end(), {"--data", valid, "--max-records", "2"});
    if (cmd == "generate") argv.push_back("add 1 and 2");
    if (cmd == "export") argv.insert(argv.end(), {"-o", t.path("hf2")});
    r = run60(argv);
    INFO(r.out);
    CHECK(r.rc == kCheckpoint);
    CHECK(contains(r.out, "no final/ model and no complete checkpoint under"));
    CHECK(contains(r.out, "pass --init to use the config's initial weights instead"));
    CHECK(contains(r.out, step2 + "/manifest.json: \"buffers\"[0].size is"));
  }
}
