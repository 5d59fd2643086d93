// Sharded checkpoints: bit-exact resume at the same world size and stage, resharding
// (4->2, 2->3, stage 1->3, stage 3 -> one rank, LoRA stage 3 -> 2) continuing the same losses, a corrupt or
// truncated shard falling back to the previous checkpoint with the file named, an
// interrupted save leaving the previous `latest` loadable, pruning, and the trainer state;
// damaged checkpoints set aside rather than kept by pruning, manifest file names confined
// to their directory, checkpoint files as private as the run directory, no cluster.env in
// manifests.
#include "temp_dir.h"
#include "train/checkpoint.h"
#include "zero_harness.h"

#include "core/error.h"
#include "model/layout.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>

using namespace zero_test;
using namespace dtrain::train;
namespace fs = std::filesystem;

namespace {

using dtrain::test::TempDir;

RunSpec spec_for(int stage, int world, dtrain::DType dt = dtrain::DType::F32, bool lora = false) {
  RunSpec s;
  s.world = world;
  s.lora = lora;
  s.llama = lora;  // LoRA cases run on the Llama variant
  s.steps = 8;
  s.opts.stage = stage;
  s.opts.param_persistence_threshold = 0;
  s.opts.reduce_bucket_size = 10000;
  s.opts.allgather_bucket_size = 10000;
  s.opts.compute_dtype = dt;
  return s;
}

TrainState state_at(int step, int rank) {
  TrainState st;
  st.step = step;
  st.scheduler_step = step - 1;
  st.has_scaler = true;
  st.scaler.scale = 512.0f;
  st.scaler.cur_iter = step;
  st.scaler.last_overflow_iter = 1;
  st.scaler.cur_hysteresis = 2;
  st.sampler = {3, static_cast<uint64_t>(step) * 12};
  st.forward_count = static_cast<uint64_t>(step);
  st.has_rng = true;
  st.rng = {1u + static_cast<uint64_t>(rank), 2, 3, 4};
  st.config_yaml = "train_micro_batch_size_per_gpu: 4\n";
  return st;
}

struct Phase {
  std::vector<double> losses;  // global mean per step run
  std::vector<float> weights;
  std::vector<CheckpointLoadResult> loads;
  std::vector<std::string> errors;
  bool ok() const {
    for (const auto& e : errors)
      if (!e.empty()) return false;
    return true;
  }
  std::string error_text() const {
    std::string s;
    for (const auto& e : errors) s += e + "\n";
    return s;
  }
};

// Optionally loads from dir, then runs steps first..last, saving after each step in
// saves; returns the per-step global losses and rank 0's final weights.
Phase phase_run(const RunSpec& spec, const fs::path& dir, bool load, int first, int last, std::vector<int> saves,
                CheckpointSaveOptions sopts = {}) {
  Phase out;
  std::vector<std::vector<float>> losses(static_cast<size_t>(spec.world));
  out.loads.resize(static_cast<size_t>(spec.world));
  std::vector<std::vector<float>> weights(static_cast<size_t>(spec.world));
  out.errors = run_ranks(spec.world, [&](dtrain::comm::Communicator* comm, int r) {
    RankTrainer t(spec, comm, r);
    if (load) out.loads[static_cast<size_t>(r)] = checkpoint_load(dir.string(), t.engine->checkpoint_view());
    for (int s = first; s <= last; ++s) {
      losses[static_cast<size_t>(r)].push_back(t.step(s));
      if (std::find(saves.begin(), saves.end(), s) != saves.end())
        checkpoint_save(dir.string(), t.engine->checkpoint_view(), state_at(s, r), sopts);
    }
    weights[static_cast<size_t>(r)] = t.weights();
  });
  if (!out.ok()) return out;
  for (size_t k = 0; k < losses[0].size(); ++k) {
    double sum = 0;
    for (const auto& l : losses) sum += l[k];
    out.losses.push_back(sum / spec.world);
  }
  out.weights = weights[0];
  return out;
}

std::string latest_of(const fs::path& dir) {
  std::ifstream in(dir / "checkpoints" / "latest");
  std::string s;
  std::getline(in, s);
  return s;
}

void flip_byte(const fs::path& p, std::streamoff at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x5a));
}

}  // namespace

TEST_CASE("resume at the same world size and stage continues bit-exactly") {
  struct Case {
    int stage, world;
    dtrain::DType dt;
  };
  for (const Case& c : {Case{0, 2, dtrain::DType::F32}, Case{1, 3, dtrain::DType::F32}, Case{2, 2, dtrain::DType::BF16},
                        Case{3, 3, dtrain::DType::F32}, Case{3, 2, dtrain::DType::BF16}}) {
    CAPTURE(c.stage);
    CAPTURE(c.world);
    TempDir tmp;
    const RunSpec spec = spec_for(c.stage, c.world, c.dt);
    const Phase full = phase_run(spec, tmp.path / "a", false, 1, 8, {});
    REQUIRE_MESSAGE(full.ok(), full.error_text());
    const Phase first = phase_run(spec, tmp.path / "b", false, 1, 4, {4});
    REQUIRE_MESSAGE(first.ok(), first.error_text());
    RunSpec other = spec;
    other.init_seed = 99;  // everything must come from the checkpoint
    const Phase second = phase_run(other, tmp.path / "b", true, 5, 8, {});
    REQUIRE_MESSAGE(second.ok(), second.error_text());
    REQUIRE(second.loads[0].loaded);
    CHECK(second.loads[0].state.step == 4);
    CHECK(std::vector<double>(full.losses.begin() + 4, full.losses.end()) == second.losses);
    CHECK(full.weights == second.weights);
  }
}

TEST_CASE("reshard on load: another world size or stage continues with the same losses") {
  struct Case {
    int s1, w1, s2, w2;
    bool lora;
  };
  for (const Case& c : {Case{2, 4, 2, 2, false}, Case{1, 2, 3, 3, false}, Case{1, 2, 3, 2, false},
                        Case{3, 3, 0, 1, false}, Case{0, 3, 2, 4, false}, Case{3, 3, 2, 2, true}}) {
    CAPTURE(c.s1);
    CAPTURE(c.w1);
    CAPTURE(c.s2);
    CAPTURE(c.w2);
    CAPTURE(c.lora);
    TempDir tmp;
    const dtrain::DType f32 = dtrain::DType::F32;
    const Phase full = phase_run(spec_for(0, 1, f32, c.lora), tmp.path / "a", false, 1, 8, {});
    const Phase first = phase_run(spec_for(c.s1, c.w1, f32, c.lora), tmp.path / "b", false, 1, 4, {4});
    REQUIRE_MESSAGE(first.ok(), first.error_text());
    RunSpec other = spec_for(c.s2, c.w2, f32, c.lora);
    other.init_seed = 99;
    const Phase second = phase_run(other, tmp.path / "b", true, 5, 8, {});
    REQUIRE_MESSAGE(second.ok(), second.error_text());
    CHECK(second.loads[0].saved_world_size == c.w1);
    CHECK(second.loads[0].saved_stage == c.s1);
    const std::vector<double> tail(full.losses.begin() + 4, full.losses.end());
    CHECK(max_rel_diff(second.losses, tail) <= 2e-5);
    CHECK(max_abs_diff(second.weights, full.weights) <= 5e-5);
    // The global state comes back at any world size; the per-rank RNG only where the
    // rank existed.
    for (int r = 0; r < c.w2; ++r) {
      const TrainState& st = second.loads[static_cast<size_t>(r)].state;
      CHECK(st.sampler == dtrain::data::SamplerPosition{3, 48});
      CHECK(st.scheduler_step == 3);
      CHECK(st.has_scaler);
      CHECK(st.scaler.scale == 512.0f);
      CHECK(st.scaler.cur_hysteresis == 2);
      CHECK(st.config_yaml == "train_micro_batch_size_per_gpu: 4\n");
      CHECK(st.has_rng == (r < c.w1));
      if (r < c.w1) CHECK(st.rng[0] == 1u + static_cast<uint64_t>(r));
    }
  }
}

TEST_CASE("a corrupt or truncated shard falls back to the previous checkpoint, naming the file") {
  TempDir tmp;
  const RunSpec spec = spec_for(2, 2);
  CheckpointSaveOptions keep3;
  keep3.keep_last = 3;
  const Phase p = phase_run(spec, tmp.path, false, 1, 4, {2, 4}, keep3);
  REQUIRE_MESSAGE(p.ok(), p.error_text());
  REQUIRE(latest_of(tmp.path) == "step4");
  const fs::path bad = tmp.path / "checkpoints" / "step4" / "rank1.bin";
  flip_byte(bad, static_cast<std::streamoff>(fs::file_size(bad) - 7));

  const Phase resumed = phase_run(spec, tmp.path, true, 3, 4, {});
  REQUIRE_MESSAGE(resumed.ok(), resumed.error_text());
  const auto& ld = resumed.loads[0];
  CHECK(ld.state.step == 2);
  REQUIRE(ld.skipped.size() == 1);
  CHECK(ld.skipped[0].find("step4/rank1.bin") != std::string::npos);
  CHECK(ld.skipped[0].find("checksum") != std::string::npos);
  // Continuing from step 2 reproduces the original steps 3-4.
  const Phase orig = phase_run(spec, tmp.path / "x", false, 1, 4, {});
  CHECK(resumed.losses == std::vector<double>(orig.losses.begin() + 2, orig.losses.end()));

  // Truncated: named as such.
  TempDir tmp2;
  REQUIRE(phase_run(spec, tmp2.path, false, 1, 4, {2, 4}, keep3).ok());
  const fs::path cut = tmp2.path / "checkpoints" / "step4" / "rank0.bin";
  fs::resize_file(cut, fs::file_size(cut) / 2);
  const Phase r2 = phase_run(spec, tmp2.path, true, 3, 3, {});
  REQUIRE_MESSAGE(r2.ok(), r2.error_text());
  CHECK(r2.loads[1].state.step == 2);
  REQUIRE(r2.loads[1].skipped.size() == 1);
  CHECK(r2.loads[1].skipped[0].find("step4/rank0.bin") != std::string::npos);
  CHECK(r2.loads[1].skipped[0].find("truncated") != std::string::npos);

  // Nothing usable: CheckpointError naming both.
  TempDir tmp3;
  REQUIRE(phase_run(spec, tmp3.path, false, 1, 4, {2, 4}, keep3).ok());
  const fs::path cut3 = tmp3.path / "checkpoints" / "step4" / "rank0.bin";
  fs::resize_file(cut3, fs::file_size(cut3) / 2);
  fs::remove(tmp3.path / "checkpoints" / "step2" / "manifest.json");
  const Phase r3 = phase_run(spec, tmp3.path, true, 3, 3, {});
  REQUIRE(r3.errors[0] != "");
  CHECK(r3.errors[0].find("no usable checkpoint") != std::string::npos);
  CHECK(r3.errors[0].find("step4/rank0.bin") != std::string::npos);
  CHECK(r3.errors[0].find("step2/manifest.json") != std::string::npos);
}

TEST_CASE("an interrupted save leaves the previous checkpoint as latest, and it loads") {
  TempDir tmp;
  const RunSpec spec = spec_for(3, 2);
  REQUIRE(phase_run(spec, tmp.path, false, 1, 2, {2}).ok());
  CheckpointSaveOptions crash;
  crash.fault_hook = [](const std::string& point) {
    if (point == "shard_written") throw std::runtime_error("simulated crash after the shard");
  };
  {
    RunSpec s = spec;
    const Phase p = phase_run(s, tmp.path, true, 3, 4, {4}, crash);
    CHECK(!p.ok());
  }
  CHECK(latest_of(tmp.path) == "step2");
  CHECK(fs::exists(tmp.path / "checkpoints" / "tmp-step4" / "rank0.bin"));
  CHECK(!fs::exists(tmp.path / "checkpoints" / "step4"));
  const Phase resumed = phase_run(spec, tmp.path, true, 3, 3, {});
  REQUIRE_MESSAGE(resumed.ok(), resumed.error_text());
  CHECK(resumed.loads[0].state.step == 2);
  CHECK(resumed.loads[0].skipped.empty());

  // Rank 0 dies after the rename but before `latest` moves: the unconfirmed step4 is
  // ignored.
  TempDir one;
  const RunSpec single = spec_for(1, 1);
  REQUIRE(phase_run(single, one.path, false, 1, 2, {2}).ok());
  CheckpointSaveOptions late;
  late.fault_hook = [](const std::string& point) {
    if (point == "renamed") throw std::runtime_error("simulated crash before latest");
  };
  CHECK(!phase_run(single, one.path, true, 3, 4, {4}, late).ok());
  CHECK(latest_of(one.path) == "step2");
  CHECK(fs::exists(one.path / "checkpoints" / "step4" / "manifest.json"));
  const Phase r = phase_run(single, one.path, true, 3, 3, {});
  REQUIRE_MESSAGE(r.ok(), r.error_text());
  CHECK(r.loads[0].state.step == 2);
}

TEST_CASE("keep_last prunes old checkpoints; no checkpoint means a fresh start") {
  TempDir tmp;
  const RunSpec spec = spec_for(1, 2);
  {
    const Phase fresh = phase_run(spec, tmp.path, true, 1, 6, {2, 4, 6});
    REQUIRE_MESSAGE(fresh.ok(), fresh.error_text());
    CHECK(!fresh.loads[0].loaded);
  }
  CHECK(latest_of(tmp.path) == "step6");
  CHECK(!fs::exists(tmp.path / "checkpoints" / "step2"));
  CHECK(fs::exists(tmp.path / "checkpoints" / "step4" / "manifest.json"));
  CHECK(fs::exists(tmp.path / "checkpoints" / "step6" / "rank1.bin"));
  CHECK(!fs::exists(tmp.path / "checkpoints" / "latest.tmp"));
}

// ---------------------------------------------------------------------------
// Safety (issue 12): damaged checkpoints and pruning, forged manifests, secrets.

namespace {

std::vector<std::string> set_aside(const fs::path& run, const std::string& step) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(run / "checkpoints"))
    if (e.path().filename().string().rfind(step + ".corrupt-", 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("a damaged latest is set aside on load, so pruning keeps the checkpoint resumed from") {
  TempDir tmp;
  const RunSpec spec = spec_for(1, 2);
  REQUIRE(phase_run(spec, tmp.path, false, 1, 4, {2, 4}).ok());
  const fs::path cut = tmp.path / "checkpoints" / "step4" / "rank0.bin";
  fs::resize_file(cut, fs::file_size(cut) / 2);

  // Resume falls back to step 2, trains to 6 and saves there (keep_last = 2).
  const Phase p = phase_run(spec, tmp.path, true, 3, 6, {6});
  REQUIRE_MESSAGE(p.ok(), p.error_text());
  CHECK(p.loads[0].state.step == 2);
  REQUIRE(p.loads[0].skipped.size() == 1);
  CHECK(p.loads[0].skipped[0].find("set aside as step4.corrupt-") != std::string::npos);
  CHECK(latest_of(tmp.path) == "step6");
  CHECK(fs::exists(tmp.path / "checkpoints" / "step6" / "manifest.json"));
  CHECK(fs::exists(tmp.path / "checkpoints" / "step2" / "manifest.json"));  // the good fallback survives
  CHECK(!fs::exists(tmp.path / "checkpoints" / "step4"));
  const auto aside = set_aside(tmp.path, "step4");
  REQUIRE(aside.size() == 1);  // renamed, not deleted
  CHECK(fs::exists(tmp.path / "checkpoints" / aside[0] / "manifest.json"));
}

TEST_CASE("pruning sets a damaged checkpoint aside instead of keeping it in place of a good one") {
  TempDir tmp;
  const RunSpec spec = spec_for(0, 1);
  REQUIRE(phase_run(spec, tmp.path, false, 1, 4, {2, 4}).ok());
  const fs::path cut = tmp.path / "checkpoints" / "step4" / "rank0.bin";
  fs::resize_file(cut, fs::file_size(cut) - 1);
  // No load in between: the save at 6 finds step4 damaged while pruning.
  REQUIRE(phase_run(spec, tmp.path, false, 5, 6, {6}).ok());
  CHECK(latest_of(tmp.path) == "step6");
  CHECK(fs::exists(tmp.path / "checkpoints" / "step2" / "manifest.json"));
  CHECK(!fs::exists(tmp.path / "checkpoints" / "step4"));
  CHECK(set_aside(tmp.path, "step4").size() == 1);
  // And step6 then step2 remain loadable in that order.
  const Phase r = phase_run(spec, tmp.path, true, 7, 7, {});
  REQUIRE_MESSAGE(r.ok(), r.error_text());
  CHECK(r.loads[0].state.step == 6);
}

TEST_CASE("manifest file names must be bare names in the checkpoint directory") {
  const RunSpec spec = spec_for(0, 1);
  for (const std::string& forged : {std::string("../../secret.txt"), std::string("/etc/hostname"), std::string(""),
                                    std::string("sub/rank0.bin"), std::string(".."), std::string("rank0.bin\0x", 11)}) {
    CAPTURE(forged);
    TempDir tmp;
    // A file outside the checkpoint that a forged manifest points at; its size must not
    // appear anywhere (the warning used to print it).
    { std::ofstream(tmp.path / "secret.txt") << std::string(12345, 's'); }
    REQUIRE(phase_run(spec, tmp.path, false, 1, 4, {2, 4}).ok());
    const fs::path mpath = tmp.path / "checkpoints" / "step4" / "manifest.json";
    nlohmann::json man = nlohmann::json::parse(std::ifstream(mpath));
    man["files"][0]["name"] = forged;
    std::ofstream(mpath, std::ios::trunc) << man.dump(1);

    const Phase r = phase_run(spec, tmp.path, true, 3, 3, {});
    REQUIRE_MESSAGE(r.ok(), r.error_text());
    CHECK(r.loads[0].state.step == 2);  // the normal fallback
    REQUIRE(r.loads[0].skipped.size() == 1);
    const std::string& why = r.loads[0].skipped[0];
    CHECK(why.find("not a bare file name") != std::string::npos);
    CHECK(why.find("12345") == std::string::npos);
    CHECK(why.find("bytes") == std::string::npos);
  }
}

TEST_CASE("a manifest step or counter out of range makes the checkpoint unusable, not a resume at step -5") {
  const RunSpec spec = spec_for(0, 1);
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* why;
  };
  const Case cases[] = {
      {"step", -5, "\"step\" is -5, not an integer from 0 to 2147483647"},
      {"step", 3, "\"step\" is 3 but the directory is step4"},
      {"step", "4", "\"step\" is \"4\", not an integer"},
      {"step", 4294967296LL, "\"step\" is 4294967296"},
      {"scheduler_step", -1, "\"scheduler_step\" is -1"},
      {"optimizer_step", 1.5, "\"optimizer_step\" is 1.5"},
      {"zero_stage", 7, "\"zero_stage\" is 7, not an integer from 0 to 3"},
      {"forward_count", -2, "\"forward_count\" is -2"},
      {"sampler", nlohmann::json{{"epoch", -1}, {"offset", 0}}, "\"sampler/epoch\" is -1"},
      {"loss_scaler", nlohmann::json{{"scale", -1.0}}, "positive finite \"scale\""},
      {"config_yaml", nullptr, "config_yaml"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.key);
    CAPTURE(c.value.dump());
    TempDir tmp;
    REQUIRE(phase_run(spec, tmp.path, false, 1, 4, {2, 4}).ok());
    const fs::path mpath = tmp.path / "checkpoints" / "step4" / "manifest.json";
    nlohmann::json man = nlohmann::json::parse(std::ifstream(mpath));
    man[c.key] = c.value;
    std::ofstream(mpath, std::ios::trunc) << man.dump(1);

    const Phase r = phase_run(spec, tmp.path, true, 3, 3, {});
    REQUIRE_MESSAGE(r.ok(), r.error_text());
    CHECK(r.loads[0].state.step == 2);  // the previous checkpoint
    REQUIRE(r.loads[0].skipped.size() == 1);
    const std::string& why = r.loads[0].skipped[0];
    CHECK_MESSAGE(why.find("step4/manifest.json: ") != std::string::npos, why);
    CHECK_MESSAGE(why.find(c.why) != std::string::npos, why);
    CHECK(set_aside(tmp.path, "step4").size() == 1);
  }
}

TEST_CASE("checkpoint files are as private as the run directory; manifests carry no cluster.env") {
  TempDir tmp;
  const RunSpec spec = spec_for(1, 2);
  fs::permissions(tmp.path, fs::perms::owner_all, fs::perm_options::replace);  // a 0700 run directory
  const std::string secret = "hunter2-token";
  std::vector<std::string> errors = run_ranks(2, [&](dtrain::comm::Communicator* comm, int r) {
    RankTrainer t(spec, comm, r);
    t.step(1);
    TrainState st = state_at(1, r);
    st.config_yaml =
        "training:\n  keep_last: 2\ncluster:\n  env:\n    forward_prefixes: [\"NCCL_\"]\n    set: {\"HF_TOKEN\": \"" +
        secret + "\"}\n  workdir: \"/w\"\nmodel:\n  d_model: 32\n";
    checkpoint_save(tmp.path.string(), t.engine->checkpoint_view(), st);
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
  const fs::path dir = tmp.path / "checkpoints" / "step1";
  for (const char* f : {"manifest.json", "rank0.bin", "rank1.bin"}) {
    CAPTURE(f);
    CHECK((fs::status(dir / f).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
  }
  CHECK((fs::status(dir).permissions() & fs::perms::all) == fs::perms::owner_all);
  std::ifstream in(dir / "manifest.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find(secret) == std::string::npos);
  CHECK(text.find("HF_TOKEN") == std::string::npos);
  const std::string yaml = nlohmann::json::parse(text).at("config_yaml").get<std::string>();
  CHECK(yaml.find("workdir: \"/w\"") != std::string::npos);  // the rest of the config is kept
  CHECK(yaml.find("d_model: 32") != std::string::npos);
}

namespace {
// qwen2's layer buffer as builds before the fused projections laid it out: HF's module
// order, each bias right after its own weight (the current layout puts the q/k/v biases
// after the three weights).
dtrain::model::BufferLayout hf_order(const dtrain::model::BufferLayout& cur) {
  std::vector<dtrain::model::TensorSpec> ts = cur.tensors;
  auto rank = [](const std::string& n) {
    for (const char* m : {"q_proj", "k_proj", "v_proj"})
      if (n.find(m) != std::string::npos) return 1;
    return 0;
  };
  // q.w q.b k.w k.b v.w v.b: a stable order by (module index, weight before bias).
  std::vector<dtrain::model::TensorSpec> out;
  for (const auto& t : ts) {
    if (rank(t.name) && t.name.ends_with(".bias")) continue;
    out.push_back(t);
    if (rank(t.name)) {
      const std::string bias = t.name.substr(0, t.name.size() - std::string("weight").size()) + "bias";
      for (const auto& b : ts)
        if (b.name == bias) out.push_back(b);
    }
  }
  dtrain::model::BufferLayout l = cur;
  l.tensors = out;
  size_t off = 0;
  for (auto& t : l.tensors) {
    t.offset = off;
    off += t.numel();
  }
  return l;
}
}  // namespace

TEST_CASE("a checkpoint with the tensors in an earlier build's order loads by tensor name") {
  dtrain::model::ModelConfig cfg;
  cfg.arch = dtrain::model::ModelConfig::Arch::QWEN2;
  cfg.qkv_bias = true;
  cfg.vocab_size = 16;
  cfg.max_seq_len = 8;
  cfg.n_layer = 1;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.d_model = 8;
  cfg.d_ff = 12;
  const auto cur = dtrain::model::layout_build(cfg);
  const dtrain::model::BufferLayout& layer = cur[1];
  const dtrain::model::BufferLayout old = hf_order(layer);
  REQUIRE(old.tensors[2].name != layer.tensors[2].name);  // the orders differ (q.b against k.w)
  const size_t n = layer.size;
  REQUIRE(old.size == n);

  // Save the old layout's buffer (values = 1000 * tensor index + element, m and v offset).
  TempDir tmp;
  dtrain::model::ParamBuffer saved_pb;
  saved_pb.layout = old;
  saved_pb.size = n;
  std::vector<float> master(n), m(n), v(n);
  for (size_t t = 0; t < old.tensors.size(); ++t)
    for (size_t i = 0; i < old.tensors[t].numel(); ++i) {
      const size_t at = old.tensors[t].offset + i;
      master[at] = static_cast<float>(1000 * t + i);
      m[at] = master[at] + 0.25f;
      v[at] = master[at] + 0.5f;
    }
  ZeroCheckpointView sv;
  sv.buffers.push_back({&saved_pb, true, false, 0, n, master.data(), m.data(), v.data(), nullptr});
  checkpoint_save(tmp.path.string(), sv, state_at(3, 0));

  // Load into the current layout: each tensor's values under its name.
  dtrain::model::ParamBuffer pb;
  pb.layout = layer;
  pb.size = n;
  std::vector<float> lm(n, -1.0f), lmm(n, -1.0f), lv(n, -1.0f);
  ZeroCheckpointView lvw;
  lvw.buffers.push_back({&pb, true, false, 0, n, lm.data(), lmm.data(), lv.data(), nullptr});
  lvw.loaded = [](int64_t) {};
  const CheckpointLoadResult res = checkpoint_load(tmp.path.string(), lvw);
  REQUIRE(res.loaded);
  bool same = true;
  for (const auto& t : layer.tensors) {
    const dtrain::model::TensorSpec* o = old.find(t.name);
    REQUIRE(o != nullptr);
    for (size_t i = 0; i < t.numel(); ++i) {
      same = same && lm[t.offset + i] == master[o->offset + i] && lmm[t.offset + i] == m[o->offset + i] &&
             lv[t.offset + i] == v[o->offset + i];
    }
  }
  CHECK(same);
  // A range across tensor boundaries, as dtrain export streams it.
  CheckpointMasters cm(tmp.path.string(), {{layer, true}});
  std::vector<float> part(n - 9);
  cm.read(0, 5, n - 4, part.data());
  CHECK(std::equal(part.begin(), part.end(), lm.begin() + 5));

  // Another shape under a name, or a name the checkpoint lacks, is another model: refused
  // as before, naming the tensor.
  for (int k = 0; k < 2; ++k) {
    dtrain::model::ParamBuffer bad = pb;
    if (k == 0) bad.layout.tensors[0].shape = {99};
    else bad.layout.tensors[4].name += ".renamed";  // a bias, where the orders differ
    ZeroCheckpointView bv = lvw;
    bv.buffers[0].buffer = &bad;
    CHECK_THROWS_AS(checkpoint_load(tmp.path.string(), bv), dtrain::ConfigError);
  }
}
