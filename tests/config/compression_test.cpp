// communication.compression: the plain values, the one-method mappings with their
// parameters, DeepSpeed's communication_data_type as the 16-bit case, and the refusals
// (bad parameters, conflicting keys, PowerSGD/top-k above ZeRO stage 1) naming the keys.
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::config;

namespace {

TrainConfig load(const std::string& text, const std::vector<std::string>& sets = {}) {
  return config_load_string(text, "c.yaml", sets).cfg;
}

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    config_load_string(text, "c.yaml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("compression: none by default; bf16 and fp16 as plain values") {
  CHECK(load("steps_per_print: 1\n").communication.compression == "none");
  CHECK(load("communication: {compression: bf16}\n").communication.compression == "bf16");
  CHECK(load("communication:\n  compression: fp16\n").communication.compression == "fp16");
  CHECK(load("steps_per_print: 1\n", {"communication.compression=bf16"}).communication.compression == "bf16");
}

TEST_CASE("compression: the one-method mappings carry their parameters") {
  const TrainConfig p =
      load("communication:\n  compression:\n    powersgd: {rank: 4, start_step: 10, error_feedback: false}\n");
  CHECK(p.communication.compression == "powersgd");
  CHECK(p.communication.powersgd_rank == 4);
  CHECK(p.communication.powersgd_start_step == 10);
  CHECK_FALSE(p.communication.powersgd_error_feedback);
  const TrainConfig t = load(R"({"communication": {"compression": {"topk": {"ratio": 0.25}}}})");
  CHECK(t.communication.compression == "topk");
  CHECK(t.communication.topk_ratio == doctest::Approx(0.25));
  // Defaults: PyTorch's rank 1, start at step 1000, error feedback on.
  const TrainConfig d = load("communication: {compression: powersgd}\n");
  CHECK(d.communication.powersgd_rank == 1);
  CHECK(d.communication.powersgd_start_step == 1000);
  CHECK(d.communication.powersgd_error_feedback);
  CHECK(load("communication: {compression: {topk: {ratio: 1.0}}}\n").communication.topk_ratio == 1.0);
}

TEST_CASE("compression: bad values are refused by name") {
  std::string m = error_of("communication: {compression: {powersgd: {rank: 0}}}\n");
  CHECK(has(m, "communication.powersgd.rank"));
  CHECK(has(m, "c.yaml:1"));
  m = error_of("communication: {compression: {topk: {ratio: 0}}}\n");
  CHECK(has(m, "communication.topk.ratio"));
  m = error_of("communication: {compression: {topk: {ratio: 1.5}}}\n");
  CHECK(has(m, "communication.topk.ratio"));
  m = error_of("communication: {compression: int8}\n");
  CHECK(has(m, "communication.compression"));
  CHECK(has(m, "int8"));
  m = error_of("communication: {compression: {onebit: {}}}\n");
  CHECK(has(m, "communication.compression"));
  CHECK(has(m, "onebit"));
  m = error_of("communication: {compression: {powersgd: {rank: 2}, topk: {ratio: 0.1}}}\n");
  CHECK(has(m, "one method"));
  m = error_of("communication: {compression: {powersgd: {rnk: 2}}}\n");
  CHECK(has(m, "communication.powersgd.rank"));  // the typo's suggestion
}

TEST_CASE("compression: communication_data_type is the 16-bit case; a conflict names both keys") {
  CHECK(load("communication_data_type: bf16\n").communication.compression == "bf16");
  CHECK(load("communication_data_type: fp16\n").communication.compression == "fp16");
  CHECK(load("communication_data_type: fp32\n").communication.compression == "none");
  CHECK(load("communication_data_type: bf16\ncommunication: {compression: bf16}\n").communication.compression ==
        "bf16");
  std::string m = error_of("communication_data_type: fp16\ncommunication: {compression: bf16}\n");
  CHECK(has(m, "communication_data_type"));
  CHECK(has(m, "communication.compression"));
  m = error_of("communication_data_type: fp32\ncommunication: {compression: {topk: {ratio: 0.1}}}\n");
  CHECK(has(m, "communication_data_type"));
  CHECK(has(m, "communication.compression"));
  CHECK(has(error_of("communication_data_type: int8\n"), "communication_data_type"));
}

TEST_CASE("compression: PowerSGD and top-k need ZeRO stage 0 or 1; 16-bit works at every stage") {
  for (const char* stage : {"2", "3"}) {
    const std::string z = std::string("zero_optimization: {stage: ") + stage + "}\n";
    std::string m = error_of(z + "communication: {compression: {powersgd: {rank: 2}}}\n");
    CHECK(has(m, "communication.compression"));
    CHECK(has(m, "zero_optimization.stage"));
    CHECK(has(m, std::string("stage is ") + stage));
    m = error_of(z + "communication: {compression: topk}\n");
    CHECK(has(m, "topk"));
    CHECK(has(m, "zero_optimization.stage"));
    CHECK(load(z + "communication: {compression: fp16}\n").communication.compression == "fp16");
  }
  CHECK(load("zero_optimization: {stage: 1}\ncommunication: {compression: topk}\n").communication.compression ==
        "topk");
}

TEST_CASE("compression: every method loads with training.device cuda (the CUDA device has their kernels)") {
  for (const char* c : {"bf16", "fp16", "powersgd", "topk"})
    CHECK(load(std::string("training: {device: cuda}\ncommunication: {compression: ") + c + "}\n")
              .communication.compression == c);
}
