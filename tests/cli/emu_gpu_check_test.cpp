// The GPU check's rehearsal (scripts/gpu_check.sh --rehearse) against this EMU tree: every
// stage reports in gpu_check.json and gpu_check.md, the stages the CPU execution engine can
// run pass (env, tests, the default job against its CPU reference, the bench beside its
// plan, dtrain's HF export read back by apps/hf_logits on both devices, ranks' one
// configuration), the stages that need a real GPU's tools say SKIPPED with the reason
// (race8b after running dtrain's side of the race at a tiny shape; ranks' racecheck and
// synccheck); --only, a used-up budget and a bad
// stage name behave as the script says. So the script that meets a borrowed GPU is proven
// in every CI run. Built only in the EMU tree.
#include "cli_harness.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

RunResult gpu_check(const std::vector<std::string>& args, int timeout_s) {
  const std::string bin = dtrain_bin();
  std::vector<std::string> argv{"/bin/bash", source_root().string() + "/scripts/gpu_check.sh", "--rehearse", "--build",
                                fs::path(bin).parent_path().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, {}, std::chrono::seconds(timeout_s));
}

nlohmann::json report(const std::string& dir) {
  const std::string text = read_text(dir + "/gpu_check.json");
  REQUIRE_MESSAGE(!text.empty(), "no gpu_check.json in " << dir);
  return nlohmann::json::parse(text);
}

std::map<std::string, nlohmann::json> by_stage(const nlohmann::json& j) {
  std::map<std::string, nlohmann::json> m;
  for (const auto& s : j.at("stages")) m[s.at("stage").get<std::string>()] = s;
  return m;
}

}  // namespace

TEST_CASE("gpu_check --rehearse: every stage reports; the engine's stages pass, the GPU tools' stages skip") {
  REQUIRE_MESSAGE(!dtrain_bin().empty(), "$DTRAIN_BIN (dtrain-emu) is not set: run through ctest in the EMU tree");
  TempDir tmp("dtrain-gpu-check");
  REQUIRE(!tmp.path().empty());
  const RunResult r = gpu_check({"--out", tmp.path()}, 800);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  const nlohmann::json j = report(tmp.path());
  std::vector<std::string> order;
  for (const auto& s : j.at("stages")) order.push_back(s.at("stage"));
  CHECK(order == std::vector<std::string>{"env", "tests", "sanitizer", "job", "speed", "losses", "offload", "peers",
                                          "hf", "profile", "attention", "ranks", "race8b"});
  auto st = by_stage(j);
  for (const char* s : {"env", "tests", "ranks", "job", "speed", "losses", "offload", "hf", "attention"}) {
    INFO(s << ": " << st[s].dump());
    CHECK(st[s].at("status") == "PASS");
  }
  for (const char* s : {"sanitizer", "peers", "profile", "race8b"}) {
    INFO(s << ": " << st[s].dump());
    CHECK(st[s].at("status") == "SKIPPED");
    CHECK(contains(st[s].at("summary").get<std::string>(), "rehearsal"));  // says why
  }
  // attention: dtrain bench attention on the engine at a tiny GQA shape under each kernel
  // variant (finite outputs, each bench naming the variant it ran, and the faster one named);
  // the SDPA peer needs PyTorch on a GPU and its row says why it did not run
  const auto& attn = st["attention"].at("data").at("dtrain");
  for (const char* variant : {"legacy", "fa2", "hopper"}) {
    INFO(variant);
    REQUIRE(attn.contains(variant));
    REQUIRE(attn.at(variant).contains("1,130,4,2,64"));
    CHECK(attn.at(variant).at("1,130,4,2,64").at("finite") == true);
    CHECK(attn.at(variant).at("1,130,4,2,64").at("variant") == variant);
  }
  const std::string faster = st["attention"].at("data").at("faster").at("1,130,4,2,64");
  CHECK((faster == "legacy" || faster == "fa2" || faster == "hopper"));
  CHECK(contains(st["attention"].dump(), "fa2/legacy fwd"));
  CHECK(contains(st["attention"].dump(), "hopper/fa2 fwd"));
  CHECK(contains(st["attention"].dump(), "peer SKIPPED"));
  // ranks: the engine's one configuration (2 device-local ranks, ZeRO 2, the delay on)
  // against 1 rank; racecheck and synccheck need a GPU and say so
  const auto& ranks = st["ranks"].at("data").at("rows");
  REQUIRE(ranks.size() == 1);
  CHECK(ranks[0].at(0) == "2");
  CHECK(ranks[0].at(1) == "zero2");
  CHECK(ranks[0].at(2) == "200");
  CHECK(ranks[0].at(7) == "PASS");
  CHECK(st["ranks"].at("data").at("refs").size() == 1);
  CHECK(contains(st["ranks"].at("summary").get<std::string>(), "racecheck, synccheck SKIPPED (rehearsal"));
  // the job: three runs on the engine's CUDA device, each compared step by step, and the
  // fp32 run's resource monitor with GPU fields from the engine's NVML
  const auto& job = st["job"].at("data").at("rows");
  REQUIRE(job.size() == 4);
  for (const auto& row : job) CHECK(row.at(1) == "PASS");
  CHECK(job[1].at(0) == "monitor (NVML)");
  CHECK(contains(job[1].at(6).get<std::string>(), "SM clock 1980 MHz"));
  // hf: dtrain's export on the CUDA device (fp32, bf16) and with a LoRA adapter that
  // moved the logits, against the CPU
  const auto& hf = st["hf"].at("data").at("cases");
  REQUIRE(hf.size() == 3);
  for (const auto& c : hf) CHECK(c.at("ok") == true);
  // ... and the preference objectives on the CUDA device against PyTorch (or skipped, said so)
  const std::string hf_summary = st["hf"].at("summary").get<std::string>();
  CHECK((contains(hf_summary, "preference objectives match") || contains(hf_summary, "preference parity SKIPPED")));
  // the bench beside its plan
  const auto& sp = st["speed"].at("data").at("results").at("tiny-sft");
  CHECK(sp.at("bench").at("tokens_per_s").get<double>() > 0);
  CHECK(sp.at("plan").at("launches").get<int>() > 0);
  // the losses: bf16 and fp32 curves of the same steps, at both learning rates
  const auto& curves = st["losses"].at("data").at("curves");
  CHECK(curves.size() == 4);
  for (const auto& [k, v] : curves.items()) CHECK(v.size() == 3);
  // offload: the bench on the device, and offloaded with each bucket's host AdamW during the
  // backward (clipping 0) and after it (clipping 1.0)
  const auto& off = st["offload"].at("data").at("results");
  REQUIRE(off.size() == 3);
  CHECK(off.at("on the GPU").at("trace").empty());
  CHECK(off.at("offload, clipping 0").at("host_adamw_ms").get<double>() > 0);
  CHECK(off.at("offload, clipping 1.0").at("host_bytes").get<double>() > 0);
  // race8b: dtrain's side of the race (LoRA, then full SFT with the optimizer offloaded) runs
  // at the tiny shape on the engine; the peer (transformers + PEFT) is skipped, saying why
  const auto& race = st["race8b"].at("data").at("rows");
  int dtrain_runs = 0, peer_skipped = 0;
  for (const auto& row : race) {
    if (row.at(1) == "dtrain" && row.at(3) == "PASS") ++dtrain_runs;
    if (row.at(1) == "transformers+peft" && row.at(3) == "SKIPPED") ++peer_skipped;
  }
  CHECK(dtrain_runs == 2);
  CHECK(peer_skipped == 1);
  const auto& race_dtrain = st["race8b"].at("data").at("cases").at("tiny-llama").at("dtrain");
  CHECK(race_dtrain.at("tokens_per_s").get<double>() > 0);
  CHECK(race_dtrain.at("step_ms_each").size() == 3);  // every step's time, the warm-up's first
  // the person-readable table has a row per stage
  const std::string md = read_text(tmp.path() + "/gpu_check.md");
  for (const std::string& s : order) CHECK(contains(md, "| " + s + " | "));
}

TEST_CASE("gpu_check --rehearse: --only runs the named stages; a used-up budget and a bad name are reported") {
  REQUIRE_MESSAGE(!dtrain_bin().empty(), "$DTRAIN_BIN (dtrain-emu) is not set: run through ctest in the EMU tree");
  TempDir tmp("dtrain-gpu-check-only");
  REQUIRE(!tmp.path().empty());
  RunResult r = gpu_check({"--out", tmp.path(), "--only", "speed,env"}, 300);
  INFO(r.out);
  CHECK(r.rc == 0);
  {
    auto st = by_stage(report(tmp.path()));
    CHECK(st.size() == 2);
    CHECK(st["env"].at("status") == "PASS");
    CHECK(st["speed"].at("status") == "PASS");
  }
  // a budget too small for any stage: each is NOT RUN, and the check fails
  r = gpu_check({"--out", tmp.path(), "--only", "env,tests", "--budget", "2"}, 60);
  CHECK(r.rc == 1);
  {
    auto st = by_stage(report(tmp.path()));
    CHECK(st["env"].at("status") == "NOT RUN");
    CHECK(st["tests"].at("status") == "NOT RUN");
  }
  r = gpu_check({"--out", tmp.path(), "--only", "env,gpus"}, 60);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "unknown stage(s) gpus"));
}
