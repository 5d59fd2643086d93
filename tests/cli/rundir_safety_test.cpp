// Run directory safety through the real binary, on tiny local CPU runs (no root, no SSH):
// one launcher per run directory (a second launch is refused naming the first, a stale
// lock record is taken over), a failed `resume --set` leaves config.yaml as it was
// (config.prev.yaml keeps the one a good resume replaced), and the run is private (0700
// directory, 0600 files, cluster.env values not in checkpoint manifests).
#include "cli_harness.h"
#include "tiny_job.h"
#include "skip.h"

#include <fmt/format.h>

#include <sys/stat.h>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

struct TempRun {
  std::string dir = make_temp_dir("dtrain-rundir");
  std::string config = dir + "/tiny.yaml";
  std::string run = dir + "/run";
  TempRun() { std::ofstream(config) << tiny_cpu_job(2); }  // 4 steps, a checkpoint every 2
  ~TempRun() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::vector<std::string> manifests(const std::string& run) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(run + "/checkpoints", ec))
    if (e.path().filename() == "manifest.json") out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST_CASE("one launcher per run directory; a stale lock record is taken over") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) {
    ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
    return;
  }
  TempRun t;
  // The first job trains long enough to still hold the directory when the second starts.
  Child first({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0", "--set",
               "training.max_steps=100000", "--set", "training.save_steps=0"});
  REQUIRE(first.started());
  REQUIRE_MESSAGE(first.wait_output("round 0:", 60s), first.output());

  for (const std::string& cmd : {std::string("launch"), std::string("resume")}) {
    CAPTURE(cmd);
    std::vector<std::string> argv =
        cmd == "launch"
            ? std::vector<std::string>{bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0"}
            : std::vector<std::string>{bin, "resume", t.run, "--master-port", "0"};
    RunResult second = run(argv, {}, 60s);
    INFO(second.out);
    REQUIRE(!second.timed_out);
    CHECK(second.rc == 2);
    CHECK(contains(second.out, "in use by another dtrain launcher"));
    CHECK(contains(second.out, fmt::format("pid {} on host ", first.pid())));
    CHECK(first.running());
  }
  first.kill_group();
  CHECK(!first.running());

  // A launcher that died without clearing its record (SIGKILL, a crash): the kernel
  // dropped its flock, so the next launcher reports the record in one line and goes on.
  TempRun s;
  fs::create_directories(s.run);
  std::ofstream(s.run + "/launcher.lock") << R"({"host":"ghost-node","pid":999999,"started":"2020-01-01T00:00:00Z"})"
                                          << "\n";
  RunResult r = run({bin, "launch", "--config", s.config, "--output-dir", s.run, "--master-port", "0"}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "stale lock record of pid 999999 on host ghost-node"));
  // Released at the end: the record is cleared, the lock free for the next launcher.
  CHECK(read_text(s.run + "/launcher.lock").empty());
}

TEST_CASE("a failed resume --set changes nothing; a good one keeps config.prev.yaml; the run is private") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) {
    ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
    return;
  }
  TempRun t;
  const std::string secret = "hunter2-do-not-copy";
  RunResult r = run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0", "--set",
                     "cluster.env.set={DTRAIN_TEST_SECRET: " + secret + "}"},
                    {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);

  // Private: the directory 0700, every file the launcher and the ranks wrote 0600.
  CHECK(mode_of(t.run) == 0700);
  for (const char* f : {"config.yaml", "hostfile", "events.jsonl", "metrics.jsonl", "logs/rank0.log",
                        "checkpoints/latest", "checkpoints/step4/manifest.json", "checkpoints/step4/rank0.bin"}) {
    CAPTURE(f);
    CHECK(mode_of(t.run + "/" + f) == 0600);
  }
  CHECK(mode_of(t.run + "/checkpoints/step4") == 0700);
  // The secret stays in config.yaml (resume needs it) and out of every manifest.
  CHECK(contains(read_text(t.run + "/config.yaml"), secret));
  const auto mans = manifests(t.run);
  REQUIRE(mans.size() == 2);
  for (const auto& m : mans) {
    CAPTURE(m);
    CHECK(!contains(read_text(m), secret));
  }

  // A resume whose --set does not fit the checkpoint fails (2: the config describes another
  // model, which no retry fixes) and rewrites nothing.
  const std::string before = read_text(t.run + "/config.yaml");
  const std::string hosts_before = read_text(t.run + "/hostfile");
  RunResult bad =
      run({bin, "resume", t.run, "--master-port", "0", "--set", "model.d_model=64", "--set", "training.max_steps=6"},
          {}, 120s);
  INFO(bad.out);
  REQUIRE(!bad.timed_out);
  CHECK(bad.rc == 2);
  CHECK(read_text(t.run + "/config.yaml") == before);
  CHECK(read_text(t.run + "/hostfile") == hosts_before);
  CHECK(!fs::exists(t.run + "/config.pending.yaml"));
  CHECK(!fs::exists(t.run + "/config.prev.yaml"));

  // So a plain resume still works (nothing left to train at max_steps 4).
  RunResult plain = run({bin, "resume", t.run, "--master-port", "0"}, {}, 120s);
  INFO(plain.out);
  REQUIRE(!plain.timed_out);
  CHECK(plain.rc == 0);
  CHECK(read_text(t.run + "/config.yaml") == before);

  // A resume that starts replaces config.yaml and keeps the previous one.
  RunResult more = run({bin, "resume", t.run, "--master-port", "0", "--set", "training.max_steps=6"}, {}, 120s);
  INFO(more.out);
  REQUIRE(!more.timed_out);
  CHECK(more.rc == 0);
  CHECK(contains(more.out, "resumed from step 4"));
  CHECK(contains(read_text(t.run + "/config.yaml"), "max_steps: 6"));
  CHECK(read_text(t.run + "/config.prev.yaml") == before);
  CHECK(mode_of(t.run + "/config.yaml") == 0600);
  CHECK(!fs::exists(t.run + "/config.pending.yaml"));
  CHECK(fs::exists(t.run + "/checkpoints/step6/manifest.json"));
}
