// `dtrain bench train --plan --gpu`: the GPT-2 124M budget on the H200 profile prints the MFU
// band with llm.c's anchor beside it (table and JSON), and an unknown profile is a usage error.
#include "run_binary.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

using namespace dtrain::test;

TEST_CASE("cli: bench train --plan --gpu h200 prints the MFU band and the anchor") {
  if (!have_bin()) return;
  const std::string cfg = "--config configs/gpt2-124m.yaml --set train_micro_batch_size_per_gpu=16 --plan --gpu h200";
  RunResult r = run_dtrain("bench train " + cfg);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(has(r.out, "on H200 SXM"));
  CHECK(has(r.out, "predicted band"));
  CHECK(has(r.out, "anchor       llm.c GPT-2 124M"));
  CHECK(has(r.out, "blocks/SM"));

  r = run_dtrain("bench train " + cfg + " --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["gpu_profile"] == "h200");
  CHECK(j["budget"]["hbm_tbps"].get<double>() == 4.8);
  CHECK(j["mfu_low"].get<double>() > 0);
  CHECK(j["mfu_low"].get<double>() <= j["mfu"].get<double>());
  CHECK(j["mfu"].get<double>() <= j["mfu_high"].get<double>());
  CHECK(j["anchors"][0]["tokens_per_s"].get<double>() == 460000);
}

TEST_CASE("cli: bench train --plan --gpu with an unknown profile is a usage error") {
  if (!have_bin()) return;
  const RunResult r = run_dtrain("bench train --config configs/gpt2-124m.yaml --plan --gpu a100");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(has(r.out, "--gpu"));
}
