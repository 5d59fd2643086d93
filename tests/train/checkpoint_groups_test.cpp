// Sharded checkpoints of a job with several data-parallel groups (a world of 4 split into
// 2 groups of 2, comm::ProcessGroups): every group's shards under their own names holding
// that group's state, resume giving each group the losses of an uninterrupted run (and
// resliced within a group), every group's every shard required, a shard of another group
// refused even where the manifest vouches for it, another number of groups on load a config
// error; one group keeps rank<r>.bin, and a checkpoint written before groups still loads.
#include "temp_dir.h"
#include "train/checkpoint.h"
#include "zero_harness.h"

#include "core/crc32c.h"
#include "core/error.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

using namespace zero_test;
using namespace dtrain::train;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using dtrain::test::TempDir;

// Group g's run: its own initial weights (seed_base + 10 g), so that the groups' states
// differ and a group that loaded another's shards would show it in its losses.
RunSpec group_spec(int stage, int group_size, int g, uint64_t seed_base) {
  RunSpec s;
  s.world = group_size;
  s.steps = 8;
  s.init_seed = seed_base + 10 * static_cast<uint64_t>(g);
  s.opts.stage = stage;
  s.opts.param_persistence_threshold = 0;
  s.opts.reduce_bucket_size = 10000;
  s.opts.allgather_bucket_size = 10000;
  return s;
}

// The trainer state of world rank r at step k (the per-rank RNG names the rank).
TrainState state_at(int step, int world_rank) {
  TrainState st;
  st.step = step;
  st.scheduler_step = step;
  st.sampler = {1, static_cast<uint64_t>(step) * 12};
  st.forward_count = static_cast<uint64_t>(step);
  st.has_rng = true;
  st.rng = {100u + static_cast<uint64_t>(world_rank), 2, 3, 4};
  st.config_yaml = "train_micro_batch_size_per_gpu: 4\n";
  return st;
}

struct Grouped {
  std::vector<std::vector<double>> losses;  // per group: its ranks' mean loss per step run
  std::vector<std::vector<float>> weights;  // per world rank: its full fp32 weights at the end
  std::vector<CheckpointLoadResult> loads;  // per world rank
  std::vector<std::string> errors;          // per world rank
  bool ok() const {
    return std::all_of(errors.begin(), errors.end(), [](const std::string& e) { return e.empty(); });
  }
  std::string error_text() const {
    std::string s;
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) s += "rank " + std::to_string(r) + ": " + errors[r] + "\n";
    return s;
  }
};

// A world of `world` ranks split into data-parallel groups of group_size (world rank r in
// group r / group_size, both groups' collectives at once over one store). Optionally loads
// from dir, then runs steps first..last, saving after each step in saves.
Grouped grouped_run(int stage, int world, int group_size, const fs::path& dir, bool load, int first, int last,
                    const std::vector<int>& saves, uint64_t seed_base = 7) {
  Grouped out;
  const auto W = static_cast<size_t>(world);
  std::vector<std::vector<float>> losses(W);
  out.loads.resize(W);
  out.weights.resize(W);
  out.errors = dtrain::test::run_gloo_ranks(world, [&](dtrain::comm::Communicator& w) {
    const int r = w.rank(), g = r / group_size;
    std::unique_ptr<dtrain::comm::Communicator> dp = w.split(g, r);
    RankTrainer t(group_spec(stage, group_size, g, seed_base), dtrain::comm::ProcessGroups{&w, dp.get()}, dp->rank());
    if (load) out.loads[static_cast<size_t>(r)] = checkpoint_load(dir.string(), t.engine->checkpoint_view());
    for (int s = first; s <= last; ++s) {
      losses[static_cast<size_t>(r)].push_back(t.step(s));
      if (std::find(saves.begin(), saves.end(), s) != saves.end())
        checkpoint_save(dir.string(), t.engine->checkpoint_view(), state_at(s, r));
    }
    out.weights[static_cast<size_t>(r)] = t.weights();
  });
  if (!out.ok()) return out;
  for (int g = 0; g < world / group_size; ++g) {
    std::vector<double> mean;
    for (size_t k = 0; k < losses[0].size(); ++k) {
      double sum = 0;
      for (int q = 0; q < group_size; ++q) sum += losses[static_cast<size_t>(g * group_size + q)][k];
      mean.push_back(sum / group_size);
    }
    out.losses.push_back(mean);
  }
  return out;
}

std::vector<double> tail(const std::vector<double>& v, size_t from) { return {v.begin() + from, v.end()}; }

json manifest_of(const fs::path& ckpt) { return json::parse(std::ifstream(ckpt / "manifest.json")); }

void manifest_put(const fs::path& ckpt, const json& man) {
  dtrain::test::file_put(ckpt / "manifest.json", man.dump(1));
}

// A shard file: its JSON header and the data behind it.
struct Shard {
  json head;
  std::string data;
};

Shard shard_read(const fs::path& p) {
  const std::string bytes = dtrain::test::file_bytes(p);
  REQUIRE(bytes.size() >= 16);
  REQUIRE(bytes.compare(0, 8, "DTRNCKP1") == 0);
  uint64_t hl = 0;
  std::memcpy(&hl, bytes.data() + 8, 8);
  REQUIRE(16 + hl <= bytes.size());
  return {json::parse(bytes.substr(16, hl)), bytes.substr(16 + hl)};
}

// Writes a shard file (magic, header, data) and records its size and CRC32C as files[i] of
// the manifest, as checkpoint_save would have.
void shard_write(const fs::path& ckpt, json& man, size_t i, const Shard& s) {
  const std::string head = s.head.dump();
  const uint64_t hl = head.size();
  std::string bytes = "DTRNCKP1" + std::string(reinterpret_cast<const char*>(&hl), 8) + head + s.data;
  dtrain::test::file_put(ckpt / man["files"][i]["name"].get<std::string>(), bytes);
  man["files"][i]["bytes"] = bytes.size();
  man["files"][i]["crc32c"] = dtrain::crc32c(bytes.data(), bytes.size());
}

// True when the shard's master slices are the elements of `weights` (every buffer, base
// then adapters, as RankTrainer::weights lays them out) that its entries say they are.
bool shard_holds(const Shard& s, const json& man, const std::vector<float>& weights) {
  std::vector<size_t> at;  // each buffer's first element in weights
  size_t n = 0;
  for (const auto& b : man.at("buffers")) {
    at.push_back(n);
    n += b.at("size").get<size_t>();
  }
  if (n != weights.size()) return false;
  size_t masters = 0;
  for (const auto& e : s.head.at("entries")) {
    if (e.at("kind") != "master") continue;
    ++masters;
    const size_t b = e.at("buffer").get<size_t>(), lo = e.at("lo").get<size_t>(), cnt = e.at("count").get<size_t>();
    const size_t off = e.at("offset").get<size_t>();
    if (off + cnt * sizeof(float) > s.data.size()) return false;
    if (std::memcmp(s.data.data() + off, weights.data() + at[b] + lo, cnt * sizeof(float)) != 0) return false;
  }
  return masters == at.size();
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const char* const kGroupFiles[] = {"group0-rank0.bin", "group0-rank1.bin", "group1-rank0.bin", "group1-rank1.bin"};

}  // namespace

TEST_CASE(
    "two data-parallel groups of a world of 4: each group's shards under its own names, and each resumes "
    "from its own") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    TempDir tmp;
    const Grouped full = grouped_run(stage, 4, 2, tmp.path / "a", false, 1, 8, {});
    REQUIRE_MESSAGE(full.ok(), full.error_text());
    REQUIRE(full.losses[0] != full.losses[1]);  // the groups' states differ
    const Grouped first = grouped_run(stage, 4, 2, tmp.path / "b", false, 1, 4, {4});
    REQUIRE_MESSAGE(first.ok(), first.error_text());

    // Every group's every shard, named by group and rank; no two groups on one file.
    const fs::path ck = tmp.path / "b" / "checkpoints" / "step4";
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"group0-rank0.bin", "group0-rank1.bin", "group1-rank0.bin",
                                            "group1-rank1.bin", "manifest.json"});
    const json man = manifest_of(ck);
    CHECK(man.at("world_size") == 2);
    CHECK(man.at("data_parallel_groups") == 2);
    REQUIRE(man.at("files").size() == 4);
    for (size_t i = 0; i < 4; ++i) CHECK(man.at("files")[i].at("name") == kGroupFiles[i]);
    CHECK(checkpoint_problem(ck.string()).empty());
    // Each file holds its own group's state: rank q of group g's slices of that group's
    // weights (world rank 2 g + q), and the groups' weights differ.
    REQUIRE(first.weights[0] != first.weights[2]);
    for (int g = 0; g < 2; ++g)
      for (int q = 0; q < 2; ++q) {
        CAPTURE(g);
        CAPTURE(q);
        const Shard s = shard_read(ck / kGroupFiles[2 * g + q]);
        CHECK(s.head.at("group") == g);
        CHECK(s.head.at("rank") == q);
        CHECK(s.head.at("data_parallel_groups") == 2);
        CHECK(s.head.at("rng")[0] == 100 + 2 * g + q);
        CHECK(shard_holds(s, man, first.weights[static_cast<size_t>(2 * g)]));
        CHECK(!shard_holds(s, man, first.weights[static_cast<size_t>(2 * (1 - g))]));
      }

    // Resume: other initial weights (everything must come from the checkpoint), and each
    // group continues with its own uninterrupted losses and weights, bit for bit.
    const Grouped second = grouped_run(stage, 4, 2, tmp.path / "b", true, 5, 8, {}, 99);
    REQUIRE_MESSAGE(second.ok(), second.error_text());
    for (int g = 0; g < 2; ++g) {
      CAPTURE(g);
      CHECK(second.losses[static_cast<size_t>(g)] == tail(full.losses[static_cast<size_t>(g)], 4));
    }
    for (size_t r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(second.weights[r] == full.weights[r]);
      const CheckpointLoadResult& ld = second.loads[r];
      CHECK(ld.loaded);
      CHECK(ld.state.step == 4);
      CHECK(ld.saved_world_size == 2);
      CHECK(ld.state.rng[0] == 100 + r);  // its own shard's
      CHECK(ld.skipped.empty());
    }

    // Groups of one rank each (a world of 2, 2 groups): each group reslices its own shards.
    const Grouped narrow = grouped_run(stage, 2, 1, tmp.path / "b", true, 5, 8, {}, 99);
    REQUIRE_MESSAGE(narrow.ok(), narrow.error_text());
    for (int g = 0; g < 2; ++g) {
      CAPTURE(g);
      CHECK(max_rel_diff(narrow.losses[static_cast<size_t>(g)], tail(full.losses[static_cast<size_t>(g)], 4)) <= 2e-5);
      CHECK(max_abs_diff(narrow.weights[static_cast<size_t>(g)], full.weights[static_cast<size_t>(2 * g)]) <= 5e-5);
    }
  }
}

TEST_CASE("another number of data-parallel groups on load is a config error naming the manifest") {
  TempDir tmp;
  const int stage = 1;
  REQUIRE(grouped_run(stage, 4, 2, tmp.path / "two", false, 1, 2, {2}).ok());
  REQUIRE(grouped_run(stage, 2, 2, tmp.path / "one", false, 1, 2, {2}).ok());  // one group of 2
  struct Case {
    const char* run;
    int world, group_size;
    const char* holds;
    const char* loaded_by;
  };
  for (const Case& c : {Case{"two", 2, 2, "2 data-parallel groups of 2", "loaded by one data-parallel group"},
                        Case{"two", 4, 1, "2 data-parallel groups of 2", "loaded by 4 data-parallel groups"},
                        Case{"one", 4, 2, "one data-parallel group of 2", "loaded by 2 data-parallel groups"}}) {
    CAPTURE(c.run);
    CAPTURE(c.world);
    CAPTURE(c.group_size);
    const fs::path run = tmp.path / c.run;
    const Grouped r = grouped_run(stage, c.world, c.group_size, run, true, 3, 3, {});
    for (size_t q = 0; q < r.errors.size(); ++q) {
      CAPTURE(q);
      const std::string& e = r.errors[q];
      CHECK_MESSAGE(has(e, (run / "checkpoints" / "step2" / "manifest.json").string()), e);
      CHECK_MESSAGE(has(e, c.holds), e);
      CHECK_MESSAGE(has(e, c.loaded_by), e);
      CHECK_MESSAGE(has(e, "start a new run with --output-dir"), e);
    }
    // Not a damaged checkpoint: left where it is, still `latest`.
    CHECK(checkpoint_problem((run / "checkpoints" / "step2").string()).empty());
    CHECK(dtrain::test::file_bytes(run / "checkpoints" / "latest") == "step2");
  }
  // Nor does a one-process read (dtrain export) take one group's state as the model.
  const std::vector<std::pair<dtrain::model::BufferLayout, bool>> none;
  try {
    CheckpointMasters m((tmp.path / "two").string(), none);
    FAIL("a checkpoint of 2 groups was read as one model");
  } catch (const dtrain::ConfigError& e) {
    CHECK_MESSAGE(has(e.what(), "2 data-parallel groups of 2"), e.what());
  }
}

TEST_CASE("every group's every shard is required, and a shard of another group is refused") {
  const int stage = 3;
  TempDir tmp;
  const Grouped orig = grouped_run(stage, 4, 2, tmp.path / "orig", false, 1, 4, {});
  REQUIRE_MESSAGE(orig.ok(), orig.error_text());
  // Each case: a fresh run saved at steps 2 and 4, step4 damaged in group 1 only, then a
  // load that must fall back to step 2 on every rank of both groups.
  struct Case {
    const char* what;
    const char* file;
    const char* why;
  };
  for (const Case& c :
       {Case{"missing", "group1-rank1.bin", ": missing"}, Case{"corrupt", "group1-rank0.bin", "checksum mismatch"},
        Case{"another group's", "group1-rank0.bin", "a shard file of another group"}}) {
    CAPTURE(c.what);
    TempDir run;
    REQUIRE(grouped_run(stage, 4, 2, run.path, false, 1, 4, {2, 4}).ok());
    const fs::path ck = run.path / "checkpoints" / "step4";
    const std::string file = c.file;
    if (has(c.what, "missing")) {
      fs::remove(ck / file);
    } else if (has(c.what, "corrupt")) {
      std::string bytes = dtrain::test::file_bytes(ck / file);
      bytes[bytes.size() - 7] ^= 0x5a;
      dtrain::test::file_put(ck / file, bytes);
    } else {
      // Group 0's rank-0 shard in group 1's place, the manifest's size and CRC made to
      // match: only the shard's own header can tell.
      json man = manifest_of(ck);
      shard_write(ck, man, 2, shard_read(ck / "group0-rank0.bin"));
      manifest_put(ck, man);
    }
    const std::string problem = checkpoint_problem(ck.string());  // what `dtrain status` says
    if (has(c.what, "missing")) CHECK_MESSAGE(has(problem, file + ": missing"), problem);
    else CHECK(problem.empty());  // sizes only: the load reads the rest

    const Grouped r = grouped_run(stage, 4, 2, run.path, true, 3, 4, {});
    REQUIRE_MESSAGE(r.ok(), r.error_text());
    for (size_t q = 0; q < 4; ++q) CHECK(r.loads[q].state.step == 2);
    // Rank 0 verifies every group's shards: it names the file and sets the checkpoint aside.
    REQUIRE(r.loads[0].skipped.size() == 1);
    const std::string& why = r.loads[0].skipped[0];
    CHECK_MESSAGE(has(why, "step4/" + file), why);
    CHECK_MESSAGE(has(why, c.why), why);
    CHECK_MESSAGE(has(why, "set aside as step4.corrupt-"), why);
    CHECK(!fs::exists(ck));
    for (int g = 0; g < 2; ++g) CHECK(r.losses[static_cast<size_t>(g)] == tail(orig.losses[static_cast<size_t>(g)], 2));
  }
}

TEST_CASE("one data-parallel group keeps rank<r>.bin, and a checkpoint written before groups still loads") {
  const int stage = 1;
  TempDir tmp;
  // A world of 2 split into one group of 2: the group is the world.
  const Grouped full = grouped_run(stage, 2, 2, tmp.path / "a", false, 1, 6, {});
  REQUIRE_MESSAGE(full.ok(), full.error_text());
  REQUIRE(grouped_run(stage, 2, 2, tmp.path / "b", false, 1, 3, {3}).ok());
  const fs::path ck = tmp.path / "b" / "checkpoints" / "step3";
  CHECK(fs::exists(ck / "rank0.bin"));
  CHECK(fs::exists(ck / "rank1.bin"));
  CHECK(!fs::exists(ck / "group0-rank0.bin"));
  json man = manifest_of(ck);
  CHECK(man.at("data_parallel_groups") == 1);
  CHECK(man.at("files")[0].at("name") == "rank0.bin");

  // The format before groups: no data_parallel_groups in the manifest, no group, group
  // count or optimizer step in the shard headers.
  man.erase("data_parallel_groups");
  for (size_t i = 0; i < 2; ++i) {
    Shard s = shard_read(ck / man["files"][i]["name"].get<std::string>());
    for (const char* k : {"group", "data_parallel_groups", "optimizer_step"}) CHECK(s.head.erase(k) == 1);
    shard_write(ck, man, i, s);
  }
  manifest_put(ck, man);
  const Grouped r = grouped_run(stage, 2, 2, tmp.path / "b", true, 4, 6, {}, 99);
  REQUIRE_MESSAGE(r.ok(), r.error_text());
  CHECK(r.loads[1].state.step == 3);
  CHECK(r.loads[1].skipped.empty());
  CHECK(r.losses[0] == tail(full.losses[0], 3));
  CHECK(r.weights[1] == full.weights[1]);
}
