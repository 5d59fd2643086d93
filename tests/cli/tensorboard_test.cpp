// TensorBoard logs through the real binary: a tiny CPU job with `tensorboard: {enabled:
// true}` leaves one event file in RUN_DIR/tensorboard, named as TensorFlow names them,
// that the independent reader (tests/tensorboard/tfevents_read.py: its own TFRecord
// parser, CRC32C and protobuf decoding) accepts and finds equal to metrics.jsonl; a
// flipped byte in a copy is a checksum error; `dtrain resume` with more steps adds a
// second file and leaves the first byte for byte as it was.
#include "cli_harness.h"
#include "tiny_job.h"

#include "tensorboard/tfevents_reader.h"
#include "skip.h"

#include <regex>

using namespace dtrain::cli_test;
using dtrain::test::tfevents_read;
using dtrain::test::tfevents_steps;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  // Files only: the ranks' resource monitors write theirs below, in resources/rank<R>/.
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("tensorboard: a tiny CPU run's event files, read back independently, match metrics.jsonl") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) {
    ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
    return;
  }
  TempDir tmp("dtrain-tensorboard");
  REQUIRE(!tmp.path().empty());
  const std::string config = tmp.path() + "/tiny.yaml";
  const fs::path run_dir = tmp.path() + "/run";
  // 4 steps, printed (and logged) every step, an evaluation and a checkpoint every 2.
  std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 4\nsteps_per_print: 1\n",
                                     .n_layer = 1,
                                     .valid = true,
                                     .eval_steps = 2,
                                     .training_more = "  device: cpu\n",
                                     .rest = "fault_tolerance:\n  max_retries: 0\ntensorboard:\n  enabled: true\n"});
  auto r = run({bin, "launch", "--config", config, "--master-port", "0", "--output-dir", run_dir.string()}, {}, 120s);
  INFO("launch output:\n" << r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);

  const fs::path logs = run_dir / "tensorboard";
  auto files = event_files(logs);
  REQUIRE(files.size() == 1);
  const std::string name = files[0].filename().string();
  CHECK(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[^/]+)")));
  CHECK(contains(r.out, "tensorboard: writing " + files[0].string()));
  {
    const auto v = tfevents_read(logs.string(), (run_dir / "metrics.jsonl").string());
    INFO("reader:\n" << v.output);
    REQUIRE(v.code == 0);
    CHECK(v.result["sessions"] == nlohmann::json::array({1}));
    for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"})
      CHECK_MESSAGE((tfevents_steps(v, tag) == std::vector<int64_t>{1, 2, 3, 4}), tag);
    CHECK(tfevents_steps(v, "eval/loss") == std::vector<int64_t>{2, 4});
    CHECK(!v.result["scalars"].contains("train/loss_scale"));  // fp16 is off
    CHECK(v.result["metrics_checked"] == 4 * 4 + 2 * 2);
  }

  SUBCASE("a flipped byte in a copy: the reader reports a checksum error") {
    const fs::path bad = tmp.path() + "/corrupt";
    fs::create_directories(bad);
    std::string bytes = read_text(files[0].string());
    REQUIRE(bytes.size() > 100);
    bytes[bytes.size() / 2] ^= 0x10;
    std::ofstream(bad / name, std::ios::binary) << bytes;
    const auto v = tfevents_read(bad.string());
    INFO("reader:\n" << v.output);
    CHECK(v.code == 1);
    CHECK(v.result["ok"] == false);
    CHECK(contains(v.result["error"].get<std::string>(), "checksum mismatch"));
    CHECK(contains(v.result["error"].get<std::string>(), name));
  }

  SUBCASE("dtrain resume with more steps: a second file; the first one untouched") {
    const std::string before = read_text(files[0].string());
    auto r2 = run({bin, "resume", run_dir.string(), "--master-port", "0", "--set", "training.max_steps=6"}, {}, 120s);
    INFO("resume output:\n" << r2.out);
    REQUIRE(!r2.timed_out);
    REQUIRE(r2.rc == 0);
    REQUIRE(contains(r2.out, "resumed from step 4"));
    const auto after = event_files(logs);
    REQUIRE(after.size() == 2);
    CHECK(after[0] == files[0]);  // the new name sorts after the old one
    CHECK(read_text(files[0].string()) == before);
    const auto v = tfevents_read(logs.string(), (run_dir / "metrics.jsonl").string());
    INFO("reader:\n" << v.output);
    REQUIRE(v.code == 0);
    CHECK(v.result["sessions"] == nlohmann::json::array({1, 5}));
    CHECK(v.result["purged"] == 0);
    CHECK(tfevents_steps(v, "train/loss") == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
    CHECK(tfevents_steps(v, "eval/loss") == std::vector<int64_t>{2, 4, 6});
  }
}
