// Issue 44's "no silent misconfiguration" and "habits" items through the real binary, all
// dry runs (no training): an unknown key is an error naming dtrain's spelling (lora.rank,
// learning_rate); data.format is told from the records when not given, and refused when it
// cannot be; a dry run of a job that would fail here exits 2 naming each reason; the
// torchrun / DeepSpeed flag spellings are the same options.
#include "refusal_harness.h"

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

RunResult run60(const std::vector<std::string>& argv) { return run(argv, {}, 60s); }

// The tiny CPU job with `replace` (a line of it) replaced by `with`.
std::string job_with(const std::string& replace, const std::string& with) {
  std::string y = tiny_cpu_job(2);
  const size_t at = y.find(replace);
  REQUIRE(at != std::string::npos);
  return y.replace(at, replace.size(), with);
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST_CASE("unknown keys are errors naming dtrain's spelling: lora.rank is lora.r, learning_rate optimizer.params.lr") {
  const std::string bin = bin_or_skip("habits");
  if (bin.empty()) return;
  TinyTmp t;
  // More than two edits from lora.r: it used to be a warning, and the model was fully tuned.
  write(t.config, tiny_cpu_job(2) + "lora:\n  rank: 16\n");
  RunResult r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  expect_refused(r, {t.config + ":", "lora.rank: unknown key; dtrain spells this lora.r"});
  // The source location that raised it only with --verbose.
  CHECK(!contains(r.out, "[lib/"));
  r = run60({bin, "launch", "--verbose", "--dry-run", "--config", t.config, "--output-dir", t.run});
  expect_refused(r, {"lora.rank: unknown key", "[lib/config/loader.cpp:"});
  // A top-level learning_rate was ignored and lr 3e-3 applied.
  write(t.config, tiny_cpu_job(2) + "learning_rate: 1.0e-4\n");
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  expect_refused(r, {t.config + ":", "learning_rate: unknown key; dtrain spells this optimizer.params.lr"});
  write(t.config, job_with("train_micro_batch_size_per_gpu: 4", "per_device_train_batch_size: 4"));
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  expect_refused(r, {"per_device_train_batch_size: unknown key; dtrain spells this train_micro_batch_size_per_gpu"});
  // --set gives the same answer.
  write(t.config, tiny_cpu_job(2));
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run, "--set", "lora_rank=8"});
  expect_refused(r, {"--set lora_rank=8: lora_rank: unknown key; dtrain spells this lora.r"});
  // Nothing near: the section's keys are listed.
  write(t.config, tiny_cpu_job(2) + "lora:\n  favourite_colour: red\n");
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  expect_refused(r, {"lora.favourite_colour: unknown key; lora has r, alpha, dropout, target_modules"});
}

TEST_CASE("data.format not given: told from the records, said by the dry run; JSON of neither kind is refused") {
  const std::string bin = bin_or_skip("habits");
  if (bin.empty()) return;
  TinyTmp t;
  write(t.config, job_with("  format: alpaca\n", ""));
  RunResult r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "data.train read as data.format alpaca (its records have instruction/input/output"));
  // Packed SFT records are kept whole and apart by default, and the dry run says so (the tiny
  // job turns it off: its records outrun its sequences); --set turns it off again.
  std::string neat = job_with("  format: alpaca\n", "");
  neat.erase(neat.find("  neat_packing: false\n"), std::string("  neat_packing: false\n").size());
  write(t.config, neat);
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  CHECK(contains(r.out, "whole examples packed into sequences, each attending only within itself (data.neat_packing)"));
  r = run60(
      {bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run, "--set", "data.neat_packing=false"});
  CHECK(contains(
      r.out, "the examples' token stream cut into sequences, attention across examples (data.neat_packing: false)"));
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run, "--set", "data.pack=false"});
  CHECK(contains(r.out, "one example per sequence, padded (data.pack: false)"));

  // Records with neither instruction/output nor messages: it cannot tell, and says so.
  const std::string odd = t.path("odd.jsonl");
  write(odd, "{\"question\": \"2+2?\", \"answer\": \"4\"}\n{\"question\": \"3+3?\", \"answer\": \"6\"}\n");
  std::string y = job_with("  format: alpaca\n", "");
  const size_t at = y.find("  train: ");
  y.replace(at, y.find('\n', at) - at, "  train: " + odd);
  write(t.config, y);
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  expect_refused(r, {"data.train: data file '" + odd + "' holds JSON, but not records dtrain can tell",
                     "a record with keys answer, question", "set data.format"});
  // A real launch refuses it before any rank starts, as the dry run said.
  r = run60({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0"});
  expect_refused(r, {"holds JSON, but not records dtrain can tell"});
  CHECK(!fs::exists(t.run + "/checkpoints"));
}

TEST_CASE("--dry-run of a job whose inputs are missing here exits 2, naming each") {
  const std::string bin = bin_or_skip("habits");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string gone = t.path("gone/train.jsonl"), gone_valid = t.path("gone/valid.jsonl");
  std::string y = tiny_cpu_job(2);
  const size_t at = y.find("  train: ");
  y.replace(at, y.find('\n', at) - at, "  train: " + gone + "\n  valid: " + gone_valid);
  write(t.config, y);
  RunResult r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run});
  expect_refused(r, {"--dry-run: a launch of this job would fail on this machine (2 reasons)",
                     "1. " + t.config + ": data.train '" + gone + "' does not exist",
                     "2. " + t.config + ": data.valid '" + gone_valid + "' does not exist",
                     "world size 1"});  // the report is still printed
}

TEST_CASE("torchrun and DeepSpeed flag spellings are dtrain's options; --nnodes N is N hosts, not elastic") {
  const std::string bin = bin_or_skip("habits");
  if (bin.empty()) return;
  TinyTmp t;
  RunResult r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run, "--nproc_per_node", "2",
                       "--master_addr", "127.0.0.1", "--master_port", "29571"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "world size 2"));
  CHECK(contains(r.out, "MASTER_PORT=29571"));
  const std::string hosts = t.path("hosts");
  write(hosts, "localhost slots=2\n");
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run, "--hostfile", hosts, "--num_gpus",
             "1", "--num_nodes", "1"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "world size 1"));
  // One number: the first N hosts, as torchrun's fixed --nnodes (no elastic membership).
  r = run60({bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run, "--nnodes", "1"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "world size 1"));
  r = run60(
      {bin, "launch", "--dry-run", "--config", t.config, "--output-dir", t.run, "--hostfile", hosts, "--nnodes", "2"});
  expect_refused(r, {"--num-nodes 2 asks for more nodes than"});  // was: elastic.min_nodes (--nnodes MIN) is 2
}

// The one training run of this file: 4 steps of the tiny job on a WarmupDecayLR schedule
// whose end was derived from max_steps, then resumed to 6 steps.
TEST_CASE("resume --set training.max_steps says what changed and moves the schedule's end with it") {
  const std::string bin = bin_or_skip("habits");
  if (bin.empty()) return;
  TinyTmp t;
  write(t.config, job_with("    lr: 3.0e-3\n",
                           "    lr: 3.0e-3\nscheduler:\n  type: WarmupDecayLR\n  params:\n"
                           "    warmup_num_steps: 1\n"));
  RunResult r = run({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0"}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);
  r = run({bin, "resume", t.run, "--master-port", "0", "--set", "training.max_steps=6"}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "resume: training.max_steps: 4 -> 6"));
  CHECK(contains(r.out, "resume: scheduler.params.total_num_steps: 4 -> 6"));
  // Step 5 of 6 is still on the decay (the old end, step 4, would give lr 0 here).
  const size_t at = r.out.find("step 5/6 |");
  REQUIRE(at != std::string::npos);
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  CHECK(contains(line, "| lr "));
  CHECK(!contains(line, "| lr 0.0e+00"));
  // Without a terminal (this pipe, an sbatch log) each progress line has its share and ETA.
  CHECK(contains(line, "| 83% | ETA "));
  CHECK(contains(r.out, "| 100% | ETA 0s"));
}

TEST_CASE("data.neat_packing: a launch records the resolved value; a run from before the key keeps the stream") {
  const std::string bin = bin_or_skip("habits");
  if (bin.empty()) return;
  TinyTmp t;
  // Text data, the key left out: resolved to false (a pre-training stream) and written down.
  const std::string text = fs::path(shipped_data_dir()).parent_path().string() + "/text";
  std::string y = job_with("  neat_packing: false\n", "");
  const size_t at = y.find("  train: ");
  y.replace(at, y.find('\n', at) - at, "  train: " + text + "/train.txt");
  y.replace(y.find("  format: alpaca\n"), std::string("  format: alpaca\n").size(), "  format: text\n");
  write(t.config, y);
  RunResult r = run60({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0"});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const std::string saved = read_text(t.run + "/config.yaml");
  CHECK(contains(saved, "neat_packing: false"));
  // A run directory from before the key (its config.yaml without it) resumes packing the
  // stream as it did, and says so: the tiny SFT job's records outrun its sequences, so
  // today's default for them (whole records) would find no trained token at all.
  TinyTmp u;
  r = run60({bin, "launch", "--config", u.config, "--output-dir", u.run, "--master-port", "0"});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  std::string old = read_text(u.run + "/config.yaml");
  old.erase(old.find("  neat_packing: false\n"), std::string("  neat_packing: false\n").size());
  write(u.run + "/config.yaml", old);
  r = run60({bin, "resume", u.run, "--master-port", "0", "--set", "training.max_steps=6"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "the run was launched before data.neat_packing existed: it keeps packing its data as then"));
  CHECK(contains(read_text(u.run + "/config.yaml"), "neat_packing: false"));
}

TEST_CASE("a run that left data.format to detection: eval tells a text run from an SFT one") {
  const std::string bin = bin_or_skip("habits");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string text = fs::path(shipped_data_dir()).parent_path().string() + "/text";
  std::string y = job_with("  format: alpaca\n", "");
  const size_t at = y.find("  train: ");
  y.replace(at, y.find('\n', at) - at, "  train: " + text + "/train.txt\n  valid: " + text + "/valid.txt");
  write(t.config, y);
  RunResult r = run60({bin, "launch", "--config", t.config, "--output-dir", t.run, "--master-port", "0"});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  // It saved format auto; eval measures SFT records, which a text file is not.
  r = run60({bin, "eval", t.run});
  expect_refused(r, {"the run trained on data.format text", "pass --data FILE.jsonl"});
}
