// The one rule for inputs (issue 43, items 8-10 and 12), through the real binary: every
// path dtrain reads is fed a FIFO nothing writes to, a symbolic link to /dev/zero and a
// symbolic link loop, and each ends at once in exit 2 or 3 with a message naming that path
// and what it is. Before: a FIFO config.json, model.safetensors, index or shard blocked the
// launcher, `generate` or the rank for ever (item 8, 9), a FIFO or /dev/zero
// chat_template.jinja blocked or grew `data prepare` without bound (item 10), and a link
// loop was "internal error" exit 1 (item 12). A checkpoint's file in such a shape makes
// that checkpoint unusable: it is named and the previous complete one loads, as for any
// damaged checkpoint. The process timeout is the hang detector; no timing is asserted
// (each case prints its time).
#include "cli_harness.h"
#include "refusal_harness.h"
#include "tiny_job.h"

#include <sys/stat.h>

#include <cstdio>
#include <functional>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

enum class Shape { FIFO, ZERO, LOOP };
constexpr Shape kShapes[] = {Shape::FIFO, Shape::ZERO, Shape::LOOP};

const char* shape_name(Shape s) { return s == Shape::FIFO ? "FIFO" : s == Shape::ZERO ? "/dev/zero" : "link loop"; }

// What the message says the path is.
const char* shape_words(Shape s) {
  return s == Shape::FIFO ? "a FIFO" : s == Shape::ZERO ? "a character device" : "symbolic link loop";
}

// Puts the shape at path in place of whatever is there: a FIFO nothing writes to, a link
// to /dev/zero, or a link to itself.
void shape_at(const std::string& path, Shape s) {
  std::error_code ec;
  fs::remove_all(path, ec);
  fs::create_directories(fs::path(path).parent_path());
  switch (s) {
    case Shape::FIFO: REQUIRE(::mkfifo(path.c_str(), 0600) == 0); break;
    case Shape::ZERO: fs::create_symlink("/dev/zero", path); break;
    case Shape::LOOP: fs::create_symlink(fs::path(path).filename(), path); break;
  }
}

constexpr auto kHang = 30s;  // the hang detector: each case ends in milliseconds

// Exit 2 or 3, the path and the shape named, nothing internal; its time printed.
void expect_named(const RunResult& r, const std::string& what, Shape s, const std::string& path) {
  std::printf("  %-46s %-10s exit %d in %.3f s\n", what.c_str(), shape_name(s), r.rc, r.seconds);
  INFO(what << " as " << shape_name(s) << "; output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK((r.rc == 2 || r.rc == 3));
  CHECK_MESSAGE(contains(r.out, path), "the message does not name " << path);
  CHECK_MESSAGE(contains(r.out, shape_words(s)), "the message does not say " << shape_words(s));
  CHECK(!contains(r.out, "internal error"));
  CHECK(!contains(r.out, "bad_alloc"));
  CHECK(!contains(r.out, "round 0: starting"));
}

// GPT-2's byte -> code point table (printable Latin-1 bytes map to themselves).
std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
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

// A byte-level BPE tokenizer.json of the 256 bytes, no merges.
std::string byte_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  return nlohmann::json{{"version", "1.0"},
                        {"normalizer", nullptr},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}}
      .dump();
}

// One tiny trained run per binary (4 steps, checkpoints at 2 and 4, final/): its final/ is
// the Hugging Face model directory the model cases copy, its checkpoints the checkpoint
// cases'. "" after a failed training (the caller's REQUIRE says so).
const TinyTmp& trained() {
  static TinyTmp t;
  static const bool ok = [] {
    auto r =
        run({dtrain_bin(), "launch", "--config", t.config, "--output-dir", t.path("trained"), "--master-port", "0"}, {},
            120s);
    INFO(r.out);
    return !r.timed_out && r.rc == 0 && fs::exists(t.path("trained/final/model.safetensors")) &&
           fs::exists(t.path("trained/checkpoints/step2/manifest.json"));
  }();
  REQUIRE(ok);
  return t;
}

std::string copy_of(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::remove_all(to, ec);
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

}  // namespace

// ---------------------------------------------------------------------------
// Configs and hostfiles (the launcher, before anything starts)

TEST_CASE("config YAML and hostfile: a FIFO, /dev/zero or a link loop is exit 2 naming it") {
  const std::string bin = bin_or_skip("input shape tests");
  if (bin.empty()) return;
  TinyTmp t;
  for (Shape s : kShapes) {
    const std::string cfg = t.path("shaped.yaml");
    shape_at(cfg, s);
    expect_named(run({bin, "launch", "--dry-run", "--config", cfg, "--output-dir", t.path("run")}, {}, kHang),
                 "launch --config", s, cfg);
    const std::string hosts = t.path("hosts.shaped");
    shape_at(hosts, s);
    expect_named(
        run({bin, "launch", "--dry-run", "--config", t.config, "--hostfile", hosts, "--output-dir", t.path("run")}, {},
            kHang),
        "launch --hostfile", s, hosts);
  }
}

// ---------------------------------------------------------------------------
// A Hugging Face model directory (items 8, 9): generate on it, and a launch whose
// model.init_from names it (the launcher reads config.json and checks the weight files
// before any rank starts).

TEST_CASE("model dir: config.json, model.safetensors, its index and an indexed shard in each shape are exit 2") {
  const std::string bin = bin_or_skip("input shape tests");
  if (bin.empty()) return;
  const TinyTmp& t = trained();
  const std::string final_dir = t.path("trained/final");
  TinyTmp w;
  for (Shape s : kShapes) {
    {  // config.json: `generate` and the launcher
      const std::string hf = copy_of(final_dir, w.path("hf"));
      shape_at(hf + "/config.json", s);
      expect_named(run({bin, "generate", hf, "add 1 and 2"}, {}, kHang), "generate: config.json", s,
                   hf + "/config.json");
      expect_named(run({bin, "launch", "--config", t.config, "--output-dir", w.path("run-cfg"), "--master-port", "0",
                        "--set", "model.init_from=" + hf},
                       {}, kHang),
                   "launch, init_from's config.json", s, hf + "/config.json");
    }
    {  // model.safetensors: `generate` and the launcher (before: every rank blocked in open())
      const std::string hf = copy_of(final_dir, w.path("hf"));
      shape_at(hf + "/model.safetensors", s);
      expect_named(run({bin, "generate", hf, "add 1 and 2"}, {}, kHang), "generate: model.safetensors", s,
                   hf + "/model.safetensors");
      expect_named(run({bin, "launch", "--config", t.config, "--output-dir", w.path("run-st"), "--master-port", "0",
                        "--set", "model.init_from=" + hf},
                       {}, kHang),
                   "launch, init_from's model.safetensors", s, hf + "/model.safetensors");
    }
    {  // model.safetensors.index.json in place of model.safetensors
      const std::string hf = copy_of(final_dir, w.path("hf"));
      fs::remove(hf + "/model.safetensors");
      shape_at(hf + "/model.safetensors.index.json", s);
      expect_named(run({bin, "generate", hf, "add 1 and 2"}, {}, kHang), "generate: model.safetensors.index.json", s,
                   hf + "/model.safetensors.index.json");
    }
    {  // a shard the index names
      const std::string hf = copy_of(final_dir, w.path("hf"));
      fs::remove(hf + "/model.safetensors");
      std::ofstream(hf + "/model.safetensors.index.json")
          << R"({"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}})";
      const std::string shard = hf + "/model-00001-of-00001.safetensors";
      shape_at(shard, s);
      expect_named(run({bin, "generate", hf, "add 1 and 2"}, {}, kHang), "generate: a shard the index names", s, shard);
      expect_named(run({bin, "launch", "--config", t.config, "--output-dir", w.path("run-shard"), "--master-port", "0",
                        "--set", "model.init_from=" + hf},
                       {}, kHang),
                   "launch, a shard init_from's index names", s, shard);
    }
  }
}

// ---------------------------------------------------------------------------
// Tokenizer files and the chat template (item 10): data prepare

TEST_CASE("tokenizer.json, tokenizer_config.json and chat_template.jinja in each shape are exit 2 naming them") {
  const std::string bin = bin_or_skip("input shape tests");
  if (bin.empty()) return;
  TinyTmp t;
  const std::string tasks = shipped_data_dir() + "/train.jsonl";
  const std::string tok_dir = t.path("tok");
  const std::string tok = tok_dir + "/tokenizer.json";
  for (Shape s : kShapes) {
    fs::remove_all(tok_dir);
    shape_at(tok, s);
    expect_named(
        run({bin, "data", "prepare", tasks, t.path("out.bin"), "--format", "alpaca", "--tokenizer", tok}, {}, kHang),
        "data prepare --tokenizer", s, tok);

    fs::remove_all(tok_dir);
    fs::create_directories(tok_dir);
    std::ofstream(tok) << byte_tokenizer_json();
    const std::string tcfg = tok_dir + "/tokenizer_config.json";
    shape_at(tcfg, s);
    expect_named(
        run({bin, "data", "prepare", tasks, t.path("out.bin"), "--format", "alpaca", "--tokenizer", tok}, {}, kHang),
        "data prepare: tokenizer_config.json", s, tcfg);

    // chat_template.jinja, read for --template auto when tokenizer_config.json has none
    // (before: a FIFO blocked, /dev/zero grew past 538 MB in 4 s).
    fs::remove(tcfg);
    const std::string jinja = tok_dir + "/chat_template.jinja";
    shape_at(jinja, s);
    expect_named(run({bin, "data", "prepare", tasks, t.path("out.bin"), "--format", "alpaca", "--template", "auto",
                      "--tokenizer", tok},
                     {}, kHang),
                 "data prepare --template auto: chat_template.jinja", s, jinja);
    CHECK(!fs::exists(t.path("out.bin")));
  }
}

// ---------------------------------------------------------------------------
// Data files: data prepare, the launcher's check of data.train, eval --data

TEST_CASE("a data file in each shape is exit 2 naming it, in data prepare, launch and eval") {
  const std::string bin = bin_or_skip("input shape tests");
  if (bin.empty()) return;
  const TinyTmp& t = trained();
  TinyTmp w;
  const std::string data = w.path("data.jsonl");
  for (Shape s : kShapes) {
    shape_at(data, s);
    expect_named(run({bin, "data", "prepare", data, w.path("out.bin"), "--format", "alpaca"}, {}, kHang),
                 "data prepare INPUT", s, data);
    expect_named(run({bin, "launch", "--config", w.config, "--output-dir", w.path("run"), "--master-port", "0", "--set",
                      "data.train=" + data},
                     {}, kHang),
                 "launch, data.train", s, data);
    expect_named(run({bin, "eval", t.path("trained"), "--data", data}, {}, kHang), "eval --data", s, data);
  }
}

// ---------------------------------------------------------------------------
// Checkpoints: a file of one in such a shape makes it unusable, named; the previous
// complete checkpoint loads (the fallback every damaged checkpoint gets)

TEST_CASE("a checkpoint manifest, shard or latest in each shape is named and skipped, never waited on") {
  const std::string bin = bin_or_skip("input shape tests");
  if (bin.empty()) return;
  const TinyTmp& t = trained();
  TinyTmp w;
  struct File {
    std::string rel;     // below the run directory
    std::string loaded;  // the checkpoint that loads instead
  };
  const File files[] = {{"checkpoints/step4/manifest.json", "checkpoints/step2"},
                        {"checkpoints/step4/rank0.bin", "checkpoints/step2"},
                        {"checkpoints/latest", "checkpoints/step4"}};
  for (Shape s : kShapes)
    for (const File& f : files) {
      const std::string run_dir = copy_of(t.path("trained"), w.path("run"));
      fs::remove_all(run_dir + "/final");  // as if interrupted after its last save
      const std::string path = run_dir + "/" + f.rel;
      shape_at(path, s);
      for (const std::string cmd : {"export", "generate"}) {
        std::vector<std::string> argv = {bin, cmd, run_dir};
        if (cmd == "export") argv.insert(argv.end(), {"-o", w.path("hf")});
        else argv.push_back("add 1 and 2");
        RunResult r = run(argv, {}, kHang);
        std::printf("  %-46s %-10s exit %d in %.3f s\n", (cmd + ": " + f.rel).c_str(), shape_name(s), r.rc, r.seconds);
        INFO(cmd << " with " << f.rel << " as " << shape_name(s) << "; output:\n" << r.out);
        REQUIRE(!r.timed_out);
        CHECK(r.rc == 0);
        CHECK(contains(r.out, path + ": "));
        CHECK(contains(r.out, shape_words(s)));
        CHECK(contains(r.out, run_dir + "/" + f.loaded));
        CHECK(!contains(r.out, "internal error"));
      }
    }
}

// ---------------------------------------------------------------------------
// Run directories (item 12): eval/generate/export/status/resume on a link loop or on a run
// whose config.yaml (or, for status, events.jsonl or launcher.json) has a shape; launch
// --output-dir through a loop

TEST_CASE("a run directory that is a link loop, or whose config.yaml or status files have a shape, is named") {
  const std::string bin = bin_or_skip("input shape tests");
  if (bin.empty()) return;
  const TinyTmp& t = trained();
  TinyTmp w;
  // A link to itself and two links to each other (before: "filesystem error: status: Too
  // many levels of symbolic links", exit 1 "internal error").
  const std::string self = w.path("self"), a = w.path("a"), b = w.path("b");
  fs::create_symlink("self", self);
  fs::create_symlink("b", a);
  fs::create_symlink("a", b);
  for (const std::string& dir : {self, a}) {
    expect_named(run({bin, "eval", dir}, {}, kHang), "eval on a loop", Shape::LOOP, dir);
    expect_named(run({bin, "generate", dir, "add 1 and 2"}, {}, kHang), "generate on a loop", Shape::LOOP, dir);
    expect_named(run({bin, "export", dir}, {}, kHang), "export on a loop", Shape::LOOP, dir);
    expect_named(run({bin, "status", dir}, {}, kHang), "status on a loop", Shape::LOOP, dir);
    expect_named(run({bin, "resume", dir}, {}, kHang), "resume on a loop", Shape::LOOP, dir);
    expect_named(
        run({bin, "launch", "--config", w.config, "--output-dir", dir + "/sub", "--master-port", "0"}, {}, kHang),
        "launch --output-dir LOOP/sub", Shape::LOOP, dir + "/sub");
  }
  for (Shape s : kShapes) {
    const std::string run_dir = copy_of(t.path("trained"), w.path("run"));
    const std::string cfg = run_dir + "/config.yaml";
    shape_at(cfg, s);
    expect_named(run({bin, "eval", run_dir}, {}, kHang), "eval: the run's config.yaml", s, cfg);
    expect_named(run({bin, "generate", run_dir, "add 1 and 2"}, {}, kHang), "generate: the run's config.yaml", s, cfg);
    expect_named(run({bin, "resume", run_dir, "--master-port", "0"}, {}, kHang), "resume: the run's config.yaml", s,
                 cfg);
    // What `dtrain status` reads: damage, exit 3 naming the file (before: a FIFO blocked it).
    for (const char* name : {"events.jsonl", "launcher.json"}) {
      const std::string status_dir = copy_of(t.path("trained"), w.path("run"));
      shape_at(status_dir + "/" + name, s);
      expect_named(run({bin, "status", status_dir}, {}, kHang), std::string("status: ") + name, s,
                   status_dir + "/" + name);
    }
  }
}
