// The memory plan against what the ranks hold (issue 50): real `dtrain launch` jobs of a
// 16M-parameter Llama on 2 and 4 CPU ranks, ZeRO stages 0-3, full fine-tuning and LoRA,
// from random weights and from a model the first job exported (model.init_from). Each
// rank's peak resident memory of building, training and checkpointing (its own log line,
// the kernel's VmHWM) must lie within [80 %, 100 %] of what `--dry-run` planned for it:
// the plan is an upper bound a user sizes a cluster by, and a tight one.
#include "cli_harness.h"

#include <fmt/format.h>

#include <regex>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

// Bytes from "3.20 GiB" / "830.5 MiB".
double parse_bytes(const std::string& num, const std::string& unit) {
  return std::stod(num) * (unit == "GiB" ? 1024.0 * 1024 * 1024 : 1024.0 * 1024);
}

struct Job {
  std::string name;
  int world, stage;
  bool lora = false, init_from = false;
};

// The model: big enough that the ZeRO state and the step's working buffers, not the
// program itself, make up most of a rank's memory (15.7M parameters, 63 MB in fp32); no
// evaluation (the final one would be a forward like the step's).
std::vector<std::string> job_args(const Job& j, const std::string& dir, const std::string& init) {
  std::vector<std::string> a = {"launch",
                                "--config",
                                (source_root() / "configs/tiny-sft.yaml").string(),
                                "--nproc-per-node",
                                std::to_string(j.world),
                                "--master-port",
                                "0",  // the kernel's choice: tests run side by side
                                "--output-dir",
                                dir,
                                "--set",
                                "zero_optimization.stage=" + std::to_string(j.stage),
                                "--set",
                                "training.max_steps=2",
                                "--set",
                                "training.eval_steps=0",
                                "--set",
                                "data.valid=",
                                "--set",
                                "data.seq_len=64",
                                "--set",
                                "train_micro_batch_size_per_gpu=1",
                                "--set",
                                "monitor.interval=1"};
  // With init_from the shape comes from its config.json; the same values given here agree.
  for (const char* kv : {"model.vocab_size=8192", "model.d_model=384", "model.n_layer=4", "model.d_ff=1536",
                         "model.n_head=6", "model.n_kv_head=6", "model.max_seq_len=64"}) {
    a.push_back("--set");
    a.push_back(kv);
  }
  if (!init.empty()) {
    a.push_back("--set");
    a.push_back("model.init_from=" + init);
  }
  if (j.lora)
    for (const char* kv : {"lora.r=16", "lora.target_modules=[q_proj,k_proj,v_proj,o_proj]"}) {
      a.push_back("--set");
      a.push_back(kv);
    }
  return a;
}

}  // namespace

TEST_CASE("each rank's peak resident memory lies within 80-100 % of the --dry-run plan") {
  const std::string tmp = make_temp_dir("memplan");
  const std::string first = tmp + "/s0w2";
  // Every stage, 2 and 4 ranks, full and LoRA (built whole below stage 3, built buffer by
  // buffer at stage 3), random weights and the first job's export.
  const std::vector<Job> jobs = {
      {"s0w2", 2, 0},
      {"s1w4", 4, 1},
      {"s2w2", 2, 2},
      {"s3w2", 2, 3},
      {"s3w4", 4, 3},
      {"lora-s2w2", 2, 2, true},
      {"lora-s3w2-init", 2, 3, true, true},
  };
  const std::regex plan_re(R"(host\s+([0-9.]+) (GiB|MiB):)");
  const std::regex peak_re(R"(memory: rank (\d+) peak resident [0-9.]+ GiB \((\d+) MiB\))");
  for (const Job& j : jobs) {
    CAPTURE(j.name);
    const std::string dir = tmp + "/" + j.name;
    const std::string init = j.init_from ? first + "/final" : "";
    std::vector<std::string> args = job_args(j, dir, init);
    std::vector<std::string> dry = args;
    dry.push_back("--dry-run");
    const RunResult plan = run_dtrain(dry, 60);
    INFO(plan.out);
    REQUIRE(plan.rc == 0);
    std::smatch m;
    REQUIRE(std::regex_search(plan.out, m, plan_re));
    const double planned = parse_bytes(m[1], m[2]);
    const RunResult r = run_dtrain(args);
    INFO(r.out);
    REQUIRE(r.rc == 0);
    int ranks = 0;
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), peak_re); it != std::sregex_iterator(); ++it) {
      const double peak = std::stod((*it)[2]) * 1024.0 * 1024;
      INFO(fmt::format("{} rank {}: peak {:.0f} MiB, plan {:.0f} MiB ({:.0f} %)", j.name, (*it)[1].str(),
                       peak / 1048576, planned / 1048576, 100 * peak / planned));
      CHECK(peak <= planned);
      CHECK(peak >= 0.8 * planned);
      MESSAGE(fmt::format("{} rank {}: peak {:.0f} MiB of a planned {:.0f} MiB ({:.0f} %)", j.name, (*it)[1].str(),
                          peak / 1048576, planned / 1048576, 100 * peak / planned));
      ++ranks;
    }
    CHECK(ranks == j.world);
  }
  fs::remove_all(tmp);
}
