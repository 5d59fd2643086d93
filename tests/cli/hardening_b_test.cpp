// Issue 33 ("nothing lost, round two"), part B, through the real binary on this machine:
// batch sizes no rank can hold refused at validation (item 5), typed checkpoint manifests
// with fallback (6), token and identity files checked before reading (7, 11), a 200,000
// host hostfile (12), cluster.env.set out of command lines (13), a model/checkpoint
// mismatch not retried (15), DTRAIN_PREFLIGHT=0 and --help-config (16), and the messages
// of item 21. The SSH halves of 13 and 15 are in hardening_b_ssh_test.cpp.
#include "cli_harness.h"
#include "refusal_harness.h"
#include "tiny_job.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

// `dtrain run` as torchrun would start a lone rank 0 on this host.
RunResult run_external(const std::string& bin, const std::string& run_dir, std::vector<std::string> extra,
                       std::chrono::milliseconds timeout = 60s) {
  std::vector<std::string> argv = {bin, "run", "--output-dir", run_dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const int port = free_port();
  return run(argv,
             {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}},
             timeout);
}

// A finished tiny run with checkpoints step2 and step4 (manifest format as written).
void train_tiny(const std::string& bin, const TinyTmp& t) {
  auto r = run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0"}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);
  REQUIRE(fs::exists(t.run + "/checkpoints/step2/manifest.json"));
  REQUIRE(fs::exists(t.run + "/checkpoints/step4/manifest.json"));
}

}  // namespace

// ---------------------------------------------------------------------------
// Item 5

TEST_CASE("item 5: a batch no rank can hold is refused at validation with the key and the numbers") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  auto dry = [&](std::vector<std::string> sets) {
    std::vector<std::string> argv = {bin, "launch", "--config", t.config, "--output-dir", t.run, "--dry-run"};
    for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
    return run(argv, {}, 60s);
  };
  SUBCASE("micro 2^31-1: the micro-batch's token count does not fit the model's 32-bit rows") {
    expect_refused(dry({"train_micro_batch_size_per_gpu=2147483647"}),
                   {"train_micro_batch_size_per_gpu: 2147483647 sequences x data.seq_len 32", "lower"});
  }
  SUBCASE("micro 2^26") {
    expect_refused(dry({"train_micro_batch_size_per_gpu=67108864"}),
                   {"train_micro_batch_size_per_gpu: 67108864 sequences", "at most 67108863"});
  }
  SUBCASE("micro 65536 x accumulation 65536: more memory than this machine has, with the numbers") {
    expect_refused(dry({"train_micro_batch_size_per_gpu=65536", "gradient_accumulation_steps=65536"}),
                   {"gradient_accumulation_steps: the job needs at least", "GiB", "of memory",
                    "lower train_micro_batch_size_per_gpu (now 65536) or gradient_accumulation_steps (now 65536)"});
  }
  SUBCASE("the same without --dry-run: refused before any rank starts") {
    auto r = run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0", "--set",
                  "train_micro_batch_size_per_gpu=65536", "--set", "gradient_accumulation_steps=65536"},
                 {}, 60s);
    expect_refused(r, {"gradient_accumulation_steps: the job needs at least"});
  }
  SUBCASE("dtrain run: the rank checks its own memory before allocating") {
    std::ofstream(t.path("token")) << "hardening-test-token-0123456789abcdef\n";
    ::chmod(t.path("token").c_str(), 0600);
    auto r = run_external(bin, t.run,
                          {"--config", t.config, "--set", "cluster.rendezvous.token_file=" + t.path("token"), "--set",
                           "train_micro_batch_size_per_gpu=65536", "--set", "gradient_accumulation_steps=65536"});
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kUsage);
    CHECK(contains(r.out, "the job needs at least"));
    CHECK(!contains(r.out, "bad_alloc"));
  }
}

// ---------------------------------------------------------------------------
// Item 6

TEST_CASE("item 6: a mistyped manifest field makes that checkpoint unusable; export and resume fall back") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  train_tiny(bin, t);
  const std::string man = t.run + "/checkpoints/step4/manifest.json";
  // export takes final/ when there is one: these cases are the run interrupted after its
  // last save, whose weights are only in the checkpoints
  fs::remove_all(t.run + "/final");

  SUBCASE("buffers[0].size = \"abc\": export writes step2 and names the field") {
    edit_manifest(man, [](nlohmann::json& m) { m["buffers"][0]["size"] = "abc"; });
    auto r = run({bin, "export", t.run, "-o", t.path("hf")}, {}, 60s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(contains(r.out, man + ": \"buffers\"[0].size is \"abc\", not a non-negative integer"));
    CHECK(contains(r.out, "step2"));
    CHECK(fs::exists(t.path("hf") + "/model.safetensors"));
  }
  SUBCASE("buffers[0].name = 5: resume continues from step2") {
    edit_manifest(man, [](nlohmann::json& m) { m["buffers"][0]["name"] = 5; });
    auto r = run({bin, "resume", t.run, "--master-port", "0", "--set", "training.max_steps=6"}, {}, 120s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(contains(r.out, "\"buffers\"[0].name is 5, not a string"));
    CHECK(contains(r.out, "checkpoints/step2"));
    CHECK(!contains(r.out, "type_error"));
  }
  SUBCASE("files[0].bytes = -1 and world_size = \"2\": each a clear reason, never a json exception") {
    edit_manifest(man, [](nlohmann::json& m) { m["files"][0]["bytes"] = -1; });
    edit_manifest(t.run + "/checkpoints/step2/manifest.json", [](nlohmann::json& m) { m["world_size"] = "2"; });
    auto r = run({bin, "export", t.run, "-o", t.path("hf")}, {}, 60s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 7);  // no usable checkpoint
    CHECK(contains(r.out, "\"files\"[0].bytes is not a non-negative integer"));
    CHECK(contains(r.out, "\"world_size\" is \"2\", not an integer"));
    CHECK(!contains(r.out, "internal error"));
  }
}

// ---------------------------------------------------------------------------
// Item 7

TEST_CASE("item 7: a token_file that is a directory, /dev/zero or a FIFO is a config error at once") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string fifo = t.fifo("token.fifo");
  fs::create_directory(t.path("token.dir"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {t.path("token.dir"), "is a directory"},
      {"/dev/zero", "is not a regular file (a character device)"},
      {fifo, "is not a regular file (a FIFO)"},
  };
  for (const auto& [file, why] : cases) {
    CAPTURE(file);
    auto r = run_external(bin, t.run, {"--config", t.config, "--set", "cluster.rendezvous.token_file=" + file}, 30s);
    expect_refused(r, {"cluster.rendezvous.token_file " + file + " " + why});
  }
}

// ---------------------------------------------------------------------------
// Item 11

TEST_CASE("item 11: an identity_file that is /dev/zero or a FIFO fails launch and doctor before any connection") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string fifo = t.fifo("key.fifo");
  for (const std::string& key : {std::string("/dev/zero"), fifo}) {
    for (const std::string& cmd : {std::string("launch"), std::string("doctor")}) {
      CAPTURE(key);
      CAPTURE(cmd);
      auto r = run_unreachable(bin, t, cmd, "cluster.ssh.identity_file=" + key);
      expect_refused(r, {"cluster.ssh.identity_file: " + key + " is not a regular file"});
      MESSAGE(fmt::format("dtrain {} with cluster.ssh.identity_file={}: exit {} after {:.2f} s", cmd, key, r.rc,
                          r.seconds));
    }
  }
}

// ---------------------------------------------------------------------------
// Item 12

TEST_CASE("item 12: a 200,000-host hostfile --dry-run ends promptly with a clear answer") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  {
    std::ofstream hf(t.path("hosts"));
    for (int i = 0; i < 200000; ++i) hf << fmt::format("10.{}.{}.{} slots=1\n", i >> 16, (i >> 8) & 255, i & 255);
  }
  auto r = run({bin, "launch", "--config", t.config, "--hostfile", t.path("hosts"), "--output-dir", t.run, "--dry-run"},
               {}, 120s);
  INFO("output (head):\n" << r.out.substr(0, 2000));
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, t.path("hosts")));
  CHECK(contains(r.out, ":65537: more than 65536 hosts"));
  MESSAGE(fmt::format("200,000-host hostfile --dry-run: exit {} after {:.2f} s", r.rc, r.seconds));

  // At the cap, one machine listed twice (the first address again, IPv4-mapped) is still
  // found, in one pass.
  {
    std::ofstream hf(t.path("hosts-cap"));
    for (int i = 0; i < 65535; ++i) hf << fmt::format("10.{}.{}.{} slots=1\n", i >> 16, (i >> 8) & 255, i & 255);
    hf << "::ffff:10.0.0.0 slots=2\n";
  }
  auto c =
      run({bin, "launch", "--config", t.config, "--hostfile", t.path("hosts-cap"), "--output-dir", t.run, "--dry-run"},
          {}, 120s);
  INFO("output (head):\n" << c.out.substr(0, 2000));
  REQUIRE(!c.timed_out);
  CHECK(c.rc == kUsage);
  CHECK(contains(c.out, t.path("hosts-cap") + ":1 (\"10.0.0.0\") and " + t.path("hosts-cap") +
                            ":65536 (\"::ffff:10.0.0.0\") are the same machine (both resolve to 10.0.0.0)"));
  MESSAGE(fmt::format("65,536-host hostfile with a duplicate, --dry-run: exit {} after {:.2f} s", c.rc, c.seconds));
}

// ---------------------------------------------------------------------------
// Item 13 (this host; the SSH run is in hardening_b_ssh_test.cpp)

TEST_CASE("item 13: cluster.env.set is in no node command line; the ranks still see it") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string secret = "s3cr3t-value-'quoted' $HOME";
  auto d = run({bin, "launch", "--config", t.config, "--hostfile", t.unreachable_hostfile(), "--output-dir", t.run,
                "--dry-run", "--set", "cluster.env.set.MY_SECRET=" + secret},
               {}, 60s);
  INFO("dry run:\n" << d.out);
  REQUIRE(!d.timed_out);
  CHECK(d.rc == 0);
  CHECK(contains(d.out, "command: "));
  CHECK(!contains(d.out, "s3cr3t-value"));
  CHECK(contains(d.out, "MY_SECRET=<27 bytes of cluster.env.set, sent on the agent's stdin, not shown>"));

  // A local job with the secret in its config file: while it runs no process command line
  // holds the value; rank 0 has it.
  const std::string token = "s3cr3t-local-0123456789";
  std::ofstream(t.path("secret.yaml")) << tiny_cpu_job(0) << "cluster:\n  env:\n    set:\n      MY_SECRET: " << token
                                       << "\n";
  Child job({bin, "launch", "--config", t.path("secret.yaml"), "--output-dir", t.run, "--master-port", "0", "--set",
             "training.max_steps=40"},
            {{"DTRAIN_WORKER_PRINT_ENV", "MY_SECRET"}});
  REQUIRE(job.started());
  int scans = 0;
  std::string leak;
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until && !job.wait(0ms) && leak.empty()) {
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string cmd = read_text(e.path().string() + "/cmdline");
      if (contains(cmd, token)) leak = e.path().string() + ": " + cmd;
    }
    ++scans;
    std::this_thread::sleep_for(20ms);
  }
  auto rc = job.wait(120s);
  INFO("output:\n" << job.output());
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK_MESSAGE(leak.empty(), leak);
  CHECK(scans > 0);
  CHECK(contains(read_text(t.run + "/logs/rank0.log"), "env MY_SECRET=" + token));
}

// ---------------------------------------------------------------------------
// Item 15 (this host; the preflight's SSH errors are in hardening_b_ssh_test.cpp)

TEST_CASE("item 15: a resume whose model does not match the checkpoint is a config error, not restarted") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  train_tiny(bin, t);
  auto r = run({bin, "resume", t.run, "--master-port", "0", "--set", "training.max_steps=6", "--set", "model.n_layer=2",
                "--set", "fault_tolerance.max_retries=2", "--set", "fault_tolerance.retry_delay=1"},
               {}, 120s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "the config describes another model than the one this run trained"));
  CHECK(contains(r.out, "not restarting"));
  CHECK(!contains(r.out, "restarting in"));
}

// ---------------------------------------------------------------------------
// Item 16

TEST_CASE("item 16: DTRAIN_PREFLIGHT=0 works and --help-config exists where the unknown-key message points") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  for (const char* v : {"0", "1", "false"}) {
    CAPTURE(v);
    auto r =
        run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--dry-run"}, {{"DTRAIN_PREFLIGHT", v}}, 60s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
  }
  auto typo =
      run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--dry-run", "--set", "doctor.preflite=false"},
          {}, 60s);
  INFO("typo:\n" << typo.out);
  CHECK(typo.rc == kUsage);
  CHECK(contains(typo.out, "dtrain launch --help-config"));
  auto help = run({bin, "launch", "--help-config"}, {}, 60s);
  INFO("help:\n" << help.out.substr(0, 2000));
  CHECK(help.rc == 0);
  CHECK(contains(help.out, "doctor.preflight"));
  CHECK(contains(help.out, "env: DTRAIN_PREFLIGHT"));
  CHECK(contains(help.out, "train_micro_batch_size_per_gpu"));
}

// ---------------------------------------------------------------------------
// Item 21

TEST_CASE("item 21: no usable checkpoint says why on its failure line, and status does not offer resume") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  train_tiny(bin, t);
  for (const char* step : {"step2", "step4"})
    std::ofstream(t.run + "/checkpoints/" + step + "/rank0.bin", std::ios::trunc) << "x";
  auto r = run({bin, "resume", t.run, "--master-port", "0", "--set", "training.max_steps=6", "--set",
                "fault_tolerance.max_retries=0"},
               {}, 120s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 7);
  CHECK(!contains(r.out, "tried:;"));
  CHECK(contains(r.out, "no usable checkpoint under " + t.run + "/checkpoints; tried: "));
  bool why_in_event = false;
  for (const auto& line : split_lines(read_text(t.run + "/events.jsonl")))
    why_in_event = why_in_event || (contains(line, "\"failure\"") && contains(line, "rank0.bin: truncated"));
  CHECK(why_in_event);
  auto st = run({bin, "status", t.run}, {}, 30s);
  INFO("status:\n" << st.out);
  CHECK(!contains(st.out, "continue with: dtrain resume"));
  CHECK(contains(st.out, "no usable checkpoint under " + t.run + "/checkpoints"));
}

TEST_CASE("item 21: a YAML nesting bomb is 'nesting too deep' with the file and line") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  std::ofstream(t.path("bomb.yaml")) << "steps_per_print: 1\nbomb: " << std::string(100000, '[') << "\n";
  auto r = run({bin, "launch", "--config", t.path("bomb.yaml"), "--output-dir", t.run, "--dry-run"}, {}, 60s);
  expect_refused(r, {t.path("bomb.yaml") + ":2:", "nesting too deep"});
  CHECK(!contains(r.out, "bad file"));
  auto s = run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--dry-run", "--set",
                "cluster.env.set=" + std::string(5000, '{')},
               {}, 60s);
  expect_refused(s, {"cluster.env.set", "nesting too deep"});
}

TEST_CASE("item 21: eval of a plain-text run names the format; a bad cluster.workdir is named as such") {
  const std::string bin = bin_or_skip("hardening tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string text_dir = fs::path(shipped_data_dir()).parent_path().string() + "/text";
  fs::create_directories(t.run);
  std::string cfg = read_text(fs::path(shipped_data_dir()).parent_path().parent_path().string() + "/tiny-cpu.yaml");
  for (const char* name : {"train", "valid"}) {
    const std::string from = fmt::format("{}: data/text/{}.txt", name, name);
    const size_t at = cfg.find(from);
    REQUIRE(at != std::string::npos);
    cfg.replace(at, from.size(), fmt::format("{}: {}/{}.txt", name, text_dir, name));
  }
  std::ofstream(t.run + "/config.yaml") << cfg;
  auto e = run({bin, "eval", t.run, "--init"}, {}, 60s);
  INFO("eval:\n" << e.out);
  CHECK(e.rc == kUsage);
  CHECK(contains(e.out, "the run trained on data.format text"));
  CHECK(contains(e.out, "pass --data FILE.jsonl"));
  CHECK(!contains(e.out, "invalid JSON"));

  auto d = run({bin, "doctor", "--no-network", "--output-dir", t.path("drun"), "--set",
                "cluster.workdir=/nonexistent/dtrain-workdir", "--set", "doctor.timeout=10"},
               {}, 60s);
  INFO("doctor:\n" << d.out);
  REQUIRE(!d.timed_out);
  CHECK(d.rc == 10);
  CHECK(contains(d.out, "cluster.workdir /nonexistent/dtrain-workdir must be a directory that exists on every node"));
  CHECK(!contains(d.out, "dtrain build"));
}
