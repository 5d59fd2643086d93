// The run directory of a live job and one dtrain did not create, through the real binary
// (issue 33, items 1 and 3): `dtrain run` and `launch` adopt an empty 1777 directory
// without changing its mode, and write their checkpoints with training.run_dir_mode, not
// the directory's world-writable bits; a second launch, resume or `dtrain run` on a live launch's directory, even
// with another training.run_dir_mode, is refused naming the holder before it changes the
// directory's mode, marker or files; and a launch on a live `dtrain run`'s directory is
// refused the same way; and `dtrain run`'s rank 0 removes the checkpoints/tmp-step<k>/ an
// earlier set's interrupted save left (issue 33, item 23). Local CPU runs, no root needed.
#include "cli_harness.h"
#include "rundir_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <fmt/format.h>

#include <sys/stat.h>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

TEST_CASE("dtrain run adopts an empty 1777 directory without changing its mode; its files are private") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-rundir-lock");
  const std::string shared = s.shared_1777();
  RunResult r = run(
      {bin, "run", "--config", s.config, "--output-dir", shared, "--set", "cluster.rendezvous.token_file=" + s.token},
      lone_rank_env(), 120s);
  expect_adopted(r, shared);
  REQUIRE(fs::exists(shared + "/checkpoints/step4/manifest.json"));
  // The checkpoints follow training.run_dir_mode (0700), not the directory's 1777: no
  // other user may replace the weights the next resume loads.
  for (const char* d : {"checkpoints", "checkpoints/step4"}) {
    CAPTURE(d);
    CHECK(mode_of(shared + "/" + d) == 0700);
  }
  for (const char* f : {"checkpoints/latest", "checkpoints/step4/manifest.json", "checkpoints/step4/rank0.bin"}) {
    CAPTURE(f);
    CHECK(mode_of(shared + "/" + f) == 0600);
  }
  // So do the run's other files, whatever the caller's umask (dtrain launch's ranks get
  // the launcher's; dtrain run sets its own).
  CHECK(mode_of(shared + "/final") == 0700);
  for (const char* f : {"events.jsonl", "metrics.jsonl", "final/model.safetensors", "final/config.json"}) {
    CAPTURE(f);
    CHECK(mode_of(shared + "/" + f) == 0600);
  }
}

TEST_CASE("a launch into an adopted 1777 directory writes its checkpoints with training.run_dir_mode") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-rundir-lock");
  const std::string shared = s.shared_1777();
  RunResult r = run({bin, "launch", "--config", s.config, "--output-dir", shared, "--master-port", "0", "--set",
                     "training.run_dir_mode=0750"},
                    {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(mode_of(shared) == 01777);
  REQUIRE(fs::exists(shared + "/checkpoints/step4/manifest.json"));
  for (const char* d : {"checkpoints", "checkpoints/step2", "checkpoints/step4"}) {
    CAPTURE(d);
    CHECK(mode_of(shared + "/" + d) == 0750);
  }
  for (const char* f :
       {"config.yaml", "checkpoints/latest", "checkpoints/step4/manifest.json", "checkpoints/step4/rank0.bin"}) {
    CAPTURE(f);
    CHECK(mode_of(shared + "/" + f) == 0640);
  }
}

TEST_CASE("a second launch, resume or dtrain run on a live launch's directory changes nothing, its mode included") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-rundir-lock");
  const std::string& run_dir = s.run_dir;
  LiveLaunch first(bin, s.config, run_dir);
  REQUIRE(mode_of(run_dir) == 0700);
  const std::string marker = read_text(run_dir + "/.dtrain-run");
  const std::string config = read_text(run_dir + "/config.yaml");
  REQUIRE(contains(marker, "\"created\":true"));

  // Each asks for another run_dir_mode: applied before the lock, it would loosen the
  // live run's directory.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"launch",
       {bin, "launch", "--config", s.config, "--output-dir", run_dir, "--master-port", "0", "--set",
        "training.run_dir_mode=0755"}},
      {"resume", {bin, "resume", run_dir, "--master-port", "0", "--set", "training.run_dir_mode=0750"}},
      {"run",
       {bin, "run", "--config", s.config, "--output-dir", run_dir, "--set", "training.run_dir_mode=0755", "--set",
        "cluster.rendezvous.token_file=" + s.token}},
  };
  for (const auto& [name, argv] : cases) {
    CAPTURE(name);
    expect_lock_refused(run(argv, name == "run" ? lone_rank_env() : std::map<std::string, std::string>{}, 60s),
                        first.pid());
    CHECK(mode_of(run_dir) == 0700);
    CHECK(read_text(run_dir + "/.dtrain-run") == marker);
    CHECK(read_text(run_dir + "/config.yaml") == config);
    CHECK(first.running());
  }
  first.kill_group();
}

TEST_CASE("a launch on the directory of a live dtrain run is refused naming it") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-rundir-lock");
  const std::string& run_dir = s.run_dir;
  Child first({bin, "run", "--config", s.config, "--output-dir", run_dir, "--set", "training.max_steps=100000", "--set",
               "training.save_steps=0", "--set", "cluster.rendezvous.token_file=" + s.token},
              lone_rank_env());
  REQUIRE(first.started());
  REQUIRE_MESSAGE(first.wait_output("rank(s) train on", 60s), first.output());
  const std::string config = read_text(run_dir + "/config.yaml");
  REQUIRE(!config.empty());

  expect_lock_refused(run({bin, "launch", "--config", s.config, "--output-dir", run_dir, "--master-port", "0", "--set",
                           "model.d_model=64"},
                          {}, 60s),
                      first.pid());
  CHECK(read_text(run_dir + "/config.yaml") == config);
  CHECK(mode_of(run_dir) == 0700);
  CHECK(first.running());
  first.kill_group();
}

TEST_CASE("dtrain run removes the tmp-step<k>/ an interrupted save of an earlier set left") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-rundir-lock");
  const std::string& run_dir = s.run_dir;
  const std::vector<std::string> argv{
      bin, "run", "--config", s.config, "--output-dir", run_dir, "--set", "cluster.rendezvous.token_file=" + s.token};
  RunResult r = run(argv, lone_rank_env(), 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);
  // As a set whose save of step 99 a full disk or a crash cut short leaves it.
  const std::string partial = run_dir + "/checkpoints/tmp-step99";
  fs::create_directories(partial);
  std::ofstream(partial + "/rank0.bin.tmp") << std::string(4096, 'x');
  const std::string mine = run_dir + "/checkpoints/notes-tmp-step1";  // not dtrain's name: kept
  std::ofstream(mine) << "keep\n";
  r = run(argv, lone_rank_env(), 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(!fs::exists(partial));
  CHECK(contains(r.out, "removed " + partial + ", left by a checkpoint save that did not complete"));
  CHECK(read_text(mine) == "keep\n");
  CHECK(fs::exists(run_dir + "/checkpoints/step4/manifest.json"));
}
