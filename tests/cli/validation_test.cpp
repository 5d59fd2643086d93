// Issue 43's crash and validation items through the real binary: `data prepare --chunk-mb
// nan` is a usage error naming the flag (item 11).
#include "refusal_harness.h"

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

RunResult run60(const std::vector<std::string>& argv) { return run(argv, {}, 60s); }

}  // namespace

TEST_CASE("data prepare: --chunk-mb nan, inf or text is a usage error naming the flag") {
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
}
