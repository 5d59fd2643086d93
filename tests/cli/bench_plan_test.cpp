// `dtrain bench train --plan` through the CLI: the GPT-2 124M budget (B=16, T=1024) as a
// table and as JSON without any GPU, and --device cpu refused as a usage error.
#include "run_binary.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

using namespace dtrain::test;

TEST_CASE("cli: bench train --plan prints the predicted budget, table and JSON, without a GPU") {
  if (!have_bin()) return;
  const std::string cfg = "--config configs/gpt2-124m.yaml --set train_micro_batch_size_per_gpu=16 --plan";
  RunResult r = run_dtrain("bench train " + cfg);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(has(r.out, "predicted"));
  CHECK(has(r.out, "cublasLtMatmul"));
  CHECK(has(r.out, "step time"));
  CHECK(has(r.out, "MFU"));

  r = run_dtrain("bench train " + cfg + " --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["plan"] == true);
  CHECK(j["micro_batch"] == 16);
  CHECK(j["seq_len"] == 1024);
  CHECK(j["step_ms"].get<double>() > 0);
  CHECK(j["mfu"].get<double>() > 0);
  CHECK(j["mfu"].get<double>() < 1);
  CHECK(!j["kernels"].empty());
}

TEST_CASE("cli: bench train --plan --device cpu is a usage error") {
  if (!have_bin()) return;
  const RunResult r = run_dtrain("bench train --config configs/tiny-cpu.yaml --plan --device cpu");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(has(r.out, "--plan"));
}
