// Bad config, data and model inputs through the real binary (issue 12, findings 12-13): a
// tokenizer id past the vocabulary limit, a checkpoint manifest with a negative step, JSON
// configs with comments or syntax errors, a second YAML document and merge keys, a
// seq_len that leaves nothing to predict, negative eval/generate counts, duplicate keys in
// a safetensors header, and relative paths in a config resolved against its directory.
#include "cli_harness.h"
#include "tiny_job.h"
#include "skip.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kUsage = 2;  // main.cpp footer: 2 usage/config error

struct Tmp {
  std::string dir = make_temp_dir("dtrain-badin");
  ~Tmp() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::string bin_or_skip() {
  std::string b = dtrain_bin();
  if (b.empty()) ::dtrain::test::skip_test("bad input tests skipped: $DTRAIN_BIN is not set or not executable");
  return b;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// Runs argv from `cwd` ("" = the test's, the repository root).
RunResult run_in(const std::string& cwd, const std::vector<std::string>& argv, std::chrono::milliseconds t = 60s) {
  if (cwd.empty()) return run(argv, {}, t);
  std::string cmd = "cd '" + cwd + "' && exec";
  for (const auto& a : argv) cmd += " '" + a + "'";
  return run({"/bin/sh", "-c", cmd}, {}, t);
}

void expect_usage(const RunResult& r, const std::vector<std::string>& needles) {
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  for (const auto& n : needles) CHECK_MESSAGE(contains(r.out, n), "missing: " << n);
  CHECK(!contains(r.out, "internal error"));
}

// A tiny job on the shipped SFT data; data_dir holds train/valid.jsonl (relative paths
// are the point of one test), by default the shipped data named absolutely.
std::string job_yaml(const std::string& data_dir = shipped_data_dir()) {
  return tiny_job({.top = "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 1\n",
                   .n_layer = 1,
                   .data_dir = data_dir,
                   .training_more = "  keep_last: 3\n  device: cpu\n",
                   .rest = "fault_tolerance:\n  max_retries: 0\n"});
}

std::string shipped(const std::string& name) { return (fs::path(shipped_data_dir()) / name).string(); }

std::vector<std::string> launch_argv(const std::string& bin, const std::string& config, const std::string& run_dir,
                                     const std::vector<std::string>& sets = {}) {
  std::vector<std::string> a = {bin, "launch", "--nproc-per-node", "1", "--master-port", "0"};
  if (!config.empty()) a.insert(a.end(), {"--config", config});
  a.insert(a.end(), {"--output-dir", run_dir});
  for (const auto& s : sets) a.insert(a.end(), {"--set", s});
  return a;
}

// GPT-2's byte -> code point table (printable Latin-1 bytes map to themselves).
std::string byte_char(int b) {
  int cp = b;
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  if (!printable) {
    int n = 0;
    for (int c = 0; c < b; ++c)
      if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------
// Tokenizer

TEST_CASE("a tokenizer.json with token id 2^30 is a config error naming the file and the id, not bad_alloc") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["huge"] = 1 << 30;
  nlohmann::json tok = {{"version", "1.0"},
                        {"normalizer", nullptr},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  const std::string tok_path = t.dir + "/tokenizer.json";
  write(tok_path, tok.dump());
  write(t.dir + "/in.txt", "hello\n");
  auto r = run_in("", {bin, "data", "prepare", t.dir + "/in.txt", t.dir + "/out.tok", "--tokenizer", tok_path});
  expect_usage(r, {tok_path, "'huge' has id 1073741824", "from 0 to 16777215"});
  CHECK(!contains(r.out, "bad_alloc"));
  CHECK(!fs::exists(t.dir + "/out.tok"));

  // model.vocab_size has the same limit.
  r = run_in("", {bin, "launch", "--dry-run", "--set", "model.vocab_size=16777217"});
  expect_usage(r, {"model.vocab_size", "valid range: 1 to 16777216"});
}

// ---------------------------------------------------------------------------
// Config documents

TEST_CASE("a DeepSpeed JSON config with // and /* */ comments loads; its syntax errors say JSON with line") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  const std::string cfg = t.dir + "/ds.json";
  write(cfg, R"({
  // global batch
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 8, /* per rank */
  "zero_optimization": {
    /* stage 2: gradients sharded
       too */
    "stage": 2
  }
}
)");
  auto r = run_in("", {bin, "launch", "--dry-run", "--nproc-per-node", "2", "--config", cfg});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "ZeRO stage 2"));
  CHECK(contains(r.out, "train_batch_size=16 = micro 8 x accumulation 1 x world 2"));
  CHECK(!contains(r.out, "YAML"));

  // A missing comma on line 3: JSON named, with the line.
  write(cfg, "{\n  \"train_batch_size\": 16 // no comma\n  \"zero_optimization\": {\"stage\": 2}\n}\n");
  r = run_in("", {bin, "launch", "--dry-run", "--config", cfg});
  expect_usage(r, {cfg + ":3:", "JSON syntax error"});
  CHECK(!contains(r.out, "YAML"));

  // A config that starts with '{' is JSON whatever its name (unless YAML reads it).
  write(t.dir + "/ds.conf", "{\n  \"train_batch_size\": 16\n  \"fp16\": {}\n}\n");
  r = run_in("", {bin, "launch", "--dry-run", "--config", t.dir + "/ds.conf"});
  expect_usage(r, {t.dir + "/ds.conf:3:", "JSON syntax error"});

  write(cfg, "{\n  \"train_batch_size\": 16 /* never closed\n}\n");
  r = run_in("", {bin, "launch", "--dry-run", "--config", cfg});
  expect_usage(r, {cfg + ":2:", "not closed"});
}

TEST_CASE("a second YAML document and merge keys are config errors with file and line") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  const std::string cfg = t.dir + "/two.yaml";
  write(cfg, "# job\nzero_optimization:\n  stage: 1\n---\nzero_optimization:\n  stage: 3\n");
  auto r = run_in("", {bin, "launch", "--dry-run", "--config", cfg});
  expect_usage(r, {cfg + ":4:", "second YAML document"});
  CHECK(!contains(r.out, "ZeRO stage"));

  // A leading '---' opens the first document: that is one document.
  write(cfg, "---\nzero_optimization:\n  stage: 1\n");
  r = run_in("", {bin, "launch", "--dry-run", "--config", cfg});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "ZeRO stage 1"));

  const std::string merge = t.dir + "/merge.yaml";
  // The anchor sits on a key dtrain has: an unknown top-level key is an error of its own (issue 44).
  write(merge, "fp16: &base\n  enabled: false\nbf16:\n  <<: *base\n");
  r = run_in("", {bin, "launch", "--dry-run", "--config", merge});
  expect_usage(r, {merge + ":4:3", "bf16", "merge keys"});
}

// ---------------------------------------------------------------------------
// Data

TEST_CASE("data.seq_len below 2 is a config error naming the key") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  auto r = run_in("", launch_argv(bin, "", t.dir + "/run", {"data.seq_len=1", "training.max_steps=2"}));
  expect_usage(r, {"data.seq_len", "'1'", "valid range: 2 to"});
  CHECK(!contains(r.out, "job finished"));
  // Derived from model.max_seq_len.
  const std::string cfg = t.dir + "/job.yaml";
  std::string job = job_yaml();
  job.replace(job.find("  seq_len: 32\n"), 14, "");
  job.replace(job.find("max_seq_len: 32"), 15, "max_seq_len: 1");
  write(cfg, job);
  r = run_in("", launch_argv(bin, cfg, t.dir + "/run"));
  expect_usage(r, {cfg + ":", "data.seq_len: 1 (taken from model.max_seq_len)"});
  CHECK(!contains(r.out, "job finished"));
}

// ---------------------------------------------------------------------------
// CLI counts

TEST_CASE("eval --max-records -1 and generate --max-new-tokens -5 are refused in words") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  auto r = run_in("", {bin, "eval", "runs/none", "--max-records", "-1"});
  expect_usage(r, {"--max-records must be at least 0 (got -1)"});
  r = run_in("", {bin, "generate", "runs/none", "hi", "--max-new-tokens", "-5"});
  expect_usage(r, {"--max-new-tokens must be at least 0 (got -5)"});
}

// ---------------------------------------------------------------------------
// Runs: relative paths, checkpoint manifests, safetensors

TEST_CASE("relative paths in a config resolve against its directory, --set paths against the working directory") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  // The config and its data in one directory, the job started from another one.
  const fs::path conf_dir = fs::path(t.dir) / "conf";
  fs::create_directories(conf_dir / "data");
  fs::copy_file(shipped("train.jsonl"), conf_dir / "data/train.jsonl");
  const fs::path elsewhere = fs::path(t.dir) / "elsewhere";
  fs::create_directories(elsewhere);
  fs::copy_file(shipped("valid.jsonl"), elsewhere / "valid.jsonl");
  write((conf_dir / "job.yaml").string(), job_yaml("data"));

  const std::string run_dir = t.dir + "/run";
  auto r =
      run_in(elsewhere.string(),
             launch_argv(bin, "../conf/job.yaml", run_dir, {"data.valid=valid.jsonl", "training.max_steps=2"}), 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "job finished"));
  CHECK(contains(r.out, "eval step 2"));  // data.valid was found
  // The run's saved config holds absolute paths, so every rank and a later resume read the
  // same files wherever they start.
  const std::string saved = read_text(run_dir + "/config.yaml");
  CHECK(contains(saved, "train: \"" + (fs::path(t.dir) / "elsewhere/../conf/data/train.jsonl").string() + "\""));
  CHECK(contains(saved, "valid: \"" + (elsewhere / "valid.jsonl").string() + "\""));

  // A relative path the config's directory does not hold is named as resolved there.
  write((conf_dir / "bad.yaml").string(), job_yaml("missing"));
  r = run_in(elsewhere.string(), launch_argv(bin, "../conf/bad.yaml", t.dir + "/run2"));
  expect_usage(r, {(fs::path(t.dir) / "elsewhere/../conf/missing/train.jsonl").string(), "does not exist"});
}

TEST_CASE("the default job runs from any directory (its data paths are relative to configs/)") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  auto r = run_in(t.dir, {bin, "launch", "--dry-run"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(!contains(r.out, "not a complete dtrain job"));
  r = run_in(t.dir,
             launch_argv(bin, "", t.dir + "/run",
                         {"training.max_steps=2", "training.eval_steps=0", "scheduler.params.total_num_steps=2",
                          "scheduler.params.warmup_num_steps=1"}),
             120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "step 2/2"));
}

TEST_CASE("a checkpoint manifest with step -5 is set aside as corrupt; the run resumes from the previous one") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  const std::string cfg = t.dir + "/job.yaml";
  write(cfg, job_yaml());
  const std::string run_dir = t.dir + "/run";
  auto r = run_in("", launch_argv(bin, cfg, run_dir), 120s);
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const fs::path step4 = fs::path(run_dir) / "checkpoints/step4";
  REQUIRE(fs::exists(step4 / "manifest.json"));
  REQUIRE(fs::exists(fs::path(run_dir) / "checkpoints/step2/manifest.json"));

  nlohmann::json man = nlohmann::json::parse(read_text((step4 / "manifest.json").string()));
  man["step"] = -5;
  write((step4 / "manifest.json").string(), man.dump(1));
  r = run_in("", {bin, "resume", run_dir, "--master-port", "0", "--set", "training.max_steps=6"}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "\"step\" is -5, not an integer from 0 to 2147483647"));
  CHECK(contains(r.out, "resumed from step 2"));
  CHECK(!contains(r.out, "step -5"));
  CHECK(contains(r.out, "step 6/6"));
  bool set_aside = false;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints"))
    set_aside = set_aside || e.path().filename().string().rfind("step4.corrupt-", 0) == 0;
  CHECK(set_aside);

  // A step that is not the directory's is as unusable (here the only candidate left: exit 7).
  const fs::path step6 = fs::path(run_dir) / "checkpoints/step6";
  REQUIRE(fs::exists(step6 / "manifest.json"));
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints"))
    if (e.path().filename() != "step6" && e.is_directory()) fs::remove_all(e.path());
  man = nlohmann::json::parse(read_text((step6 / "manifest.json").string()));
  man["step"] = 4;
  write((step6 / "manifest.json").string(), man.dump(1));
  r = run_in("", {bin, "resume", run_dir, "--master-port", "0", "--set", "training.max_steps=8"}, 120s);
  INFO(r.out);
  CHECK(r.rc == 7);
  CHECK(contains(r.out, "\"step\" is 4 but the directory is step6"));
}

TEST_CASE("a safetensors header with a duplicate key is refused naming the file and the key") {
  std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  REQUIRE(!t.dir.empty());
  const std::string cfg = t.dir + "/job.yaml";
  std::string job = job_yaml();
  job.replace(job.find("max_steps: 4"), 12, "max_steps: 1");
  write(cfg, job);
  const std::string run_dir = t.dir + "/run";
  auto r = run_in("", launch_argv(bin, cfg, run_dir), 120s);
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const fs::path final_dir = fs::path(run_dir) / "final";
  REQUIRE(fs::exists(final_dir / "model.safetensors"));
  r = run_in("", {bin, "generate", final_dir.string(), "hi", "--max-new-tokens", "2"});
  INFO(r.out);
  REQUIRE(r.rc == 0);  // the exported model itself loads

  // The same tensor named twice in the header: a JSON parser would keep the second.
  const std::string st = (final_dir / "model.safetensors").string();
  std::string file = read_text(st);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  nlohmann::json head = nlohmann::json::parse(file.substr(8, n));
  const std::string first =
      head.items().begin().key() == "__metadata__" ? std::next(head.items().begin()).key() : head.items().begin().key();
  std::string text = file.substr(8, n);
  while (!text.empty() && text.back() == ' ') text.pop_back();
  text.pop_back();  // the closing brace
  text += ",\"" + first + "\":" + head[first].dump() + "}";
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string forged(8, '\0');
  for (int i = 0; i < 8; ++i) forged[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  write(st, forged + text + file.substr(8 + n));
  r = run_in("", {bin, "generate", final_dir.string(), "hi", "--max-new-tokens", "2"});
  INFO(r.out);
  CHECK(r.rc == 3);
  CHECK(contains(r.out, st));
  CHECK(contains(r.out, "the header has the key '" + first + "' twice"));
  CHECK(!contains(r.out, "internal error"));
}
