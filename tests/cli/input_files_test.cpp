// Input files dtrain reads on the user's word, through the real binary (issue 33, items 6
// and 11, what their first fixes left): a cluster.ssh.known_hosts that is /dev/zero, a FIFO
// or a directory is refused before any connection (it hung the SSH session, as the
// identity file did), and every field of a checkpoint manifest is typed, the tensors of
// each buffer included, so a damaged one is skipped for the previous complete checkpoint.
#include "cli_harness.h"
#include "refusal_harness.h"
#include "tiny_job.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <functional>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Item 11: the known_hosts file

TEST_CASE("a known_hosts file that is /dev/zero, a FIFO or a directory fails launch and doctor before any connection") {
  const std::string bin = bin_or_skip("input file tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string fifo = t.fifo("known.fifo");
  fs::create_directory(t.path("known.dir"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/dev/zero", "is not a regular file (a character device)"},
      {fifo, "is not a regular file (a FIFO)"},
      {t.path("known.dir"), "is a directory"},
  };
  for (const auto& [file, why] : cases) {
    for (const std::string cmd : {"launch", "doctor"}) {
      CAPTURE(file);
      CAPTURE(cmd);
      // Before: the session read /dev/zero until memory ran out, a FIFO forever.
      expect_refused(run_unreachable(bin, t, cmd, "cluster.ssh.known_hosts=" + file),
                     {"cluster.ssh.known_hosts: " + file + " " + why});
    }
  }
  // A known_hosts that does not exist yet is still fine (accept-new creates it), and so is
  // /dev/null (ssh's UserKnownHostsFile=/dev/null: no keys): the job gets past validation.
  for (const std::string& file : {t.path("absent/known_hosts"), std::string("/dev/null")}) {
    CAPTURE(file);
    auto r = run({bin, "launch", "--dry-run", "--hostfile", t.unreachable_hostfile(), "--config", t.config,
                  "--output-dir", t.path("run"), "--set", "cluster.ssh.known_hosts=" + file},
                 {}, 60s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(!contains(r.out, "cluster.ssh.known_hosts"));
  }
}

// ---------------------------------------------------------------------------
// Item 6: every manifest field typed

TEST_CASE(
    "a manifest whose tensors or dtypes are mistyped is skipped; export and resume fall back and name the field") {
  const std::string bin = bin_or_skip("input file tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string trained = t.path("trained");
  {
    auto r = run({bin, "launch", "--config", t.config, "--output-dir", trained, "--master-port", "0"}, {}, 120s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    REQUIRE(r.rc == 0);
    REQUIRE(fs::exists(trained + "/checkpoints/step2/manifest.json"));
    REQUIRE(fs::exists(trained + "/checkpoints/step4/manifest.json"));
  }
  // The run as if interrupted after its last save: the weights are only in checkpoints/.
  fs::remove_all(trained + "/final");

  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> change;
    std::string why;  // the reason printed after the manifest's path
  };
  const std::vector<Case> cases = {
      {"shape", [](nlohmann::json& m) { m["buffers"][0]["tensors"][0]["shape"] = {"x"}; },
       "\"buffers\"[0].tensors[0].shape is [\"x\"], not a list of positive integers"},
      {"offset", [](nlohmann::json& m) { m["buffers"][1]["tensors"][1]["offset"] = 1000000000000LL; },
       "\"buffers\"[1].tensors[1]"},
      {"tensors", [](nlohmann::json& m) { m["buffers"][0]["tensors"] = nlohmann::json::object(); },
       "\"buffers\"[0].tensors is {}, not a list"},
      {"decay", [](nlohmann::json& m) { m["buffers"][1]["tensors"][0]["decay"] = "yes"; },
       "\"buffers\"[1].tensors[0].decay is \"yes\", not true or false"},
      {"dtype", [](nlohmann::json& m) { m["compute_dtype"] = 5; },
       "\"compute_dtype\" is 5, not \"float32\", \"bfloat16\" or \"float16\""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string run_dir = t.path("run-" + c.name);
    fs::copy(trained, run_dir, fs::copy_options::recursive);
    const std::string man = run_dir + "/checkpoints/step4/manifest.json";
    edit_manifest(man, c.change);
    auto r = run({bin, "export", run_dir, "-o", t.path("hf-" + c.name)}, {}, 60s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(contains(r.out, man + ": " + c.why));
    CHECK(contains(r.out, run_dir + "/checkpoints/step2"));  // before: step4 was exported as if whole
    CHECK(fs::exists(t.path("hf-" + c.name) + "/model.safetensors"));
  }

  {  // resume skips the mistyped step4 and continues from step2
    const std::string run_dir = t.path("run-resume");
    fs::copy(trained, run_dir, fs::copy_options::recursive);
    edit_manifest(run_dir + "/checkpoints/step4/manifest.json",
                  [](nlohmann::json& m) { m["buffers"][0]["tensors"][0]["shape"] = {"x"}; });
    auto r = run({bin, "resume", run_dir, "--master-port", "0", "--set", "training.max_steps=6"}, {}, 120s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(contains(r.out, "tensors[0].shape is [\"x\"]"));
    CHECK(contains(r.out, "falling back to the previous complete checkpoint"));
    CHECK(contains(r.out, "checkpoints/step2"));
  }
  {  // a tensor of another shape (same size) in an intact manifest: a model mismatch, exit 2
    const std::string run_dir = t.path("run-transposed");
    fs::copy(trained, run_dir, fs::copy_options::recursive);
    // Both checkpoints record the embedding transposed: the sizes agree, the layout does not.
    for (const char* step : {"step2", "step4"})
      edit_manifest(run_dir + "/checkpoints/" + step + "/manifest.json", [](nlohmann::json& m) {
        auto& shape = m["buffers"][0]["tensors"][0]["shape"];
        shape = {shape[1], shape[0]};
      });
    expect_refused(run({bin, "export", run_dir, "-o", t.path("hf-transposed")}, {}, 60s),
                   {"tensor 0 is", "in the checkpoint but"});
    CHECK(!fs::exists(t.path("hf-transposed") + "/model.safetensors"));
  }
}

// ---------------------------------------------------------------------------
// Item 21: status offers a resume only from a checkpoint the load would take

TEST_CASE("dtrain status names the checkpoint a resume would load, and offers none when no manifest verifies") {
  const std::string bin = bin_or_skip("input file tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string run_dir = t.path("run");
  {
    auto r = run({bin, "launch", "--config", t.config, "--output-dir", run_dir, "--master-port", "0"}, {}, 120s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    REQUIRE(r.rc == 0);
  }
  // As if the launcher had been killed after its last save: no final event.
  {
    std::string kept;
    for (const auto& line : split_lines(read_text(run_dir + "/events.jsonl")))
      if (!contains(line, "\"finished\"")) kept += line + "\n";
    std::ofstream(run_dir + "/events.jsonl", std::ios::trunc) << kept;
  }
  std::ofstream(run_dir + "/checkpoints/step4/manifest.json", std::ios::trunc) << "not json\n";
  auto r = run({bin, "status", run_dir}, {}, 60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(contains(r.out, "dtrain resume " + run_dir + " (from step2)"));  // before: (from step4)
  CHECK(contains(r.out, run_dir + "/checkpoints/step4/manifest.json"));

  std::ofstream(run_dir + "/checkpoints/step2/manifest.json", std::ios::trunc) << "not json\n";
  r = run({bin, "status", run_dir}, {}, 60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(!contains(r.out, "continue with: dtrain resume"));
  CHECK(contains(r.out, "no usable checkpoint to continue from"));
  CHECK(contains(r.out, "none verifies"));
}

// ---------------------------------------------------------------------------
// Item 22: every events.jsonl field status reads as a number is typed

TEST_CASE(
    "dtrain status on events.jsonl records whose round, time_ms or exit_code is not an integer: exit 3, file:line") {
  const std::string bin = bin_or_skip("input file tests");
  if (bin.empty()) return;
  constexpr int kIo = 3;  // main.cpp footer: 3 I/O error
  TinyTmp t;
  const std::string run_dir = t.path("run");
  fs::create_directories(run_dir);
  std::ofstream(run_dir + "/config.yaml") << tiny_cpu_job(2);
  const std::string events = run_dir + "/events.jsonl";
  const std::string start = R"({"time_ms":1,"event":"round_start","round":0,"world_size":1})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"time_ms":2,"event":"failure","round":"x","node":0,"exit_code":1})", "\"round\" field is \"x\""},
      {R"({"time_ms":"soon","event":"finished","round":0})", "\"time_ms\" field is \"soon\""},
      {R"({"time_ms":2,"event":"failure","round":0,"node":0,"exit_code":[1]})", "\"exit_code\" field is [1]"},
  };
  for (const auto& [line, why] : cases) {
    CAPTURE(line);
    std::ofstream(events, std::ios::trunc) << start << "\n" << line << "\n";
    RunResult r = run({bin, "status", run_dir}, {}, 60s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kIo);  // before: exit 0, the record read as round 0 / time 0 / exit code 0
    CHECK(contains(r.out, events + ":2:"));
    CHECK(contains(r.out, why + ", not an integer"));
  }
  // Null and absent stay what they were: not given.
  std::ofstream(events, std::ios::trunc) << start << "\n"
                                         << R"({"time_ms":2,"event":"failure","round":0,"node":null,"exit_code":null})"
                                         << "\n";
  RunResult r = run({bin, "status", run_dir}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc != kIo);
  CHECK(!contains(r.out, "corrupt line"));
}

// ---------------------------------------------------------------------------
// Item 7's sibling: the hostfile

TEST_CASE("--hostfile naming a FIFO nothing writes to or /dev/zero is exit 2 at once; a written pipe still works") {
  const std::string bin = bin_or_skip("input file tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string fifo = t.fifo("hosts.fifo");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "is a FIFO or pipe that gave no data"},  // before: blocked in open() for ever
      {"/dev/zero", "hostfile /dev/zero is not a regular file (a character device)"},
  };
  for (const auto& [file, why] : cases) {
    CAPTURE(file);
    expect_refused(
        run({bin, "launch", "--dry-run", "--config", t.config, "--hostfile", file, "--output-dir", t.path("run")}, {},
            60s),
        {why});
  }
  // bash's process substitution hands over a pipe with its writer: read as before.
  if (::access("/bin/bash", X_OK) != 0) return;
  auto r = run({"/bin/bash", "-c",
                shq(bin) + " launch --dry-run --config " + shq(t.config) + " --output-dir " + shq(t.path("run")) +
                    " --hostfile <(sleep 1; echo 'localhost slots=2')"},
               {}, 60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "WORLD_SIZE=2"));
}
