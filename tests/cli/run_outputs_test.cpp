// What an operator sees of a real tiny run, through the binary with output that is not
// a TTY: plain progress lines without control characters, metrics.jsonl records with the
// documented fields (and the wall-clock breakdown), eval records, `dtrain plot` writing
// a PNG of the requested size with non-blank content, and `dtrain status` saying finished.
#include "report/png_reader.h"
#include "run_binary.h"
#include "tiny_job.h"
#include "skip.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using dtrain::test::run_dtrain;

namespace {

// A tiny 12-step CPU run with an eval and a checkpoint every 6 steps.
std::string config_text() {
  return dtrain::cli_test::tiny_job({.top = R"(train_micro_batch_size_per_gpu: 4
gradient_accumulation_steps: 1
steps_per_print: 2
wall_clock_breakdown: true
)",
                                     .seq_len = 48,
                                     .valid = true,
                                     .max_steps = 12,
                                     .eval_steps = 6,
                                     .save_steps = 6,
                                     .training_more = "  device: cpu\n"});
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("a tiny run: plain progress, metrics, plot and status") {
  if (!dtrain::test::dtrain_bin()) {
    ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
    return;
  }
  fs::path dir = fs::temp_directory_path() / ("dtrain-outputs-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "tiny.yaml") << config_text();
  fs::path run = dir / "run";

  auto r = run_dtrain(
      "launch --config " + (dir / "tiny.yaml").string() + " --master-port 0 --output-dir " + run.string(), 120);
  INFO(r.out);
  REQUIRE(r.code == 0);

  // Not a TTY: plain lines, no control characters other than newline.
  for (unsigned char c : r.out) CHECK_MESSAGE((c >= 0x20 || c == '\n'), "control byte " << int(c));
  CHECK(r.out.find("step 12/12 | loss ") != std::string::npos);
  CHECK(r.out.find("step 2/12 | loss ") != std::string::npos);

  // metrics.jsonl: one record per printed step with the documented fields, plus evals.
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  int steps = 0, evals = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) {
      ++evals;
      CHECK(j.contains("eval_ppl"));
      continue;
    }
    ++steps;
    for (const char* k : {"step", "loss", "lr", "grad_norm", "loss_scale", "tokens", "tokens_per_s", "step_time",
                          "memory_state_bytes", "memory_rss_bytes", "time_ms", "forward_ms", "backward_ms", "comm_ms",
                          "optimizer_ms", "data_ms", "checkpoint_ms", "comm_exposed_ms", "comm_overlapped_ms"})
      CHECK_MESSAGE(j.contains(k), "missing " << k << " in " << line);
    CHECK(j["loss"].get<double>() > 0);
    CHECK(j["memory_state_bytes"].get<double>() > 0);
  }
  CHECK(steps == 6);
  CHECK(evals == 2);

  // dtrain plot: a PNG of the requested size whose pixels are not all one colour.
  fs::path png = dir / "plot.png";
  auto p = run_dtrain("plot " + run.string() + " -o " + png.string() + " --width 900 --height 600", 60);
  INFO(p.out);
  REQUIRE(p.code == 0);
  auto d = dtrain::test::png_decode(slurp(png));
  CHECK(d.width == 900);
  CHECK(d.height == 600);
  std::set<uint32_t> colours;
  for (const auto& px : d.pixels) colours.insert((uint32_t(px[0]) << 16) | (uint32_t(px[1]) << 8) | px[2]);
  CHECK(colours.size() >= 4);

  // dtrain status: finished, at the last step, with its checkpoint.
  auto s = run_dtrain("status " + run.string(), 30);
  INFO(s.out);
  CHECK(s.code == 0);
  CHECK(s.out.find("finished") != std::string::npos);
  CHECK(s.out.find("step 12") != std::string::npos);
  CHECK(s.out.find("step12") != std::string::npos);

  // A second launch into the same run directory is refused, pointing to resume.
  auto again = run_dtrain(
      "launch --config " + (dir / "tiny.yaml").string() + " --master-port 0 --output-dir " + run.string(), 60);
  CHECK(again.code == 2);
  CHECK(again.out.find("dtrain resume") != std::string::npos);
  fs::remove_all(dir);
}
