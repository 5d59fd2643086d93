// Issue 43's crash and validation items through the real binary: `data prepare --chunk-mb
// nan` is a usage error naming the flag (item 11); a template whose turn tokens the
// tokenizer lacks is refused (17); monitor.min_free_memory above the node's memory stops
// the job at once, naming the key and the memory (14).
#include "refusal_harness.h"

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

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
