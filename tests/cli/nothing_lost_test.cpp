// Nothing lost, round two (issue 33, items 2, 4, 14, 20, 22, 23) through the real binary:
// eval / generate / export of a run without final/ use its latest complete checkpoint
// (said on stderr) and fail without one, --init being the only way to initial weights,
// and a resume that trains on drops its old final/ (an interruption then evaluates its
// newer checkpoint, not the stale final/);
// `data prepare` never replaces its input and leaves no stray .tmp; a full disk under the
// TensorBoard output costs events, not the run, and leaves only whole records; `bench
// --json /dev/full` fails; `dtrain status` on a damaged events.jsonl is exit 3 naming
// file and line; and the small ones (an unknown data.template, a prompt over
// max_seq_len said, a checkpoints/latest pointing outside the run, the tmp-step<k>/ a
// disk-full round's last retry left). The tmpfs cases skip without root.
#include "cli_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include "tensorboard/tfevents_reader.h"

#include <fmt/format.h>

#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kUsage = 2, kIo = 3;

// A trained tiny run (4 steps, checkpoints at 2 and 4, final/), shared by the cases.
struct TrainedRun {
  TempDir tmp{"dtrain-lost"};
  std::string config = tmp.path() + "/tiny.yaml";
  std::string run = tmp.path() + "/run";
  std::string valid = shipped_data_dir() + "/valid.jsonl";
  RunResult launched;
  explicit TrainedRun(const std::string& bin) {
    // seq_len 128: room for the held-out records and a templated prompt.
    std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 4\nsteps_per_print: 1\n",
                                       .n_layer = 1,
                                       .seq_len = 128,
                                       .save_steps = 2,
                                       .training_more = "  device: cpu\n",
                                       .rest = "fault_tolerance:\n  max_retries: 0\n"});
    launched = run_cmd({bin, "launch", "--config", config, "--output-dir", run, "--master-port", "0"});
  }
  static RunResult run_cmd(const std::vector<std::string>& argv) { return ::dtrain::cli_test::run(argv, {}, 120s); }
};

// A tmpfs of `kib` KiB on a fresh directory for the object's life ("" dir: not allowed).
class Tmpfs {
 public:
  explicit Tmpfs(size_t kib) {
    if (::geteuid() != 0) return;
    dir_ = make_temp_dir("dtrain-lost-tmpfs");
    if (dir_.empty()) return;
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, fmt::format("size={}k", kib).c_str()) != 0) {
      ::rmdir(dir_.c_str());
      dir_.clear();
    }
  }
  ~Tmpfs() {
    if (dir_.empty()) return;
    ::umount2(dir_.c_str(), MNT_DETACH);
    ::rmdir(dir_.c_str());
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  const std::string& dir() const { return dir_; }
  uint64_t free_bytes() const {
    struct statvfs st {};
    if (::statvfs(dir_.c_str(), &st) != 0) return 0;
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

 private:
  std::string dir_;
};

// Writes zeros to path until `bytes` are written or the disk is full; bytes written.
uint64_t fill(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  static const std::vector<char> zeros(4096, 0);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t w = ::write(fd, zeros.data(), std::min<uint64_t>(zeros.size(), bytes - done));
    if (w <= 0) break;
    done += static_cast<uint64_t>(w);
  }
  ::close(fd);
  return done;
}

// The length of the whole TFRecord frames at the start of bytes (8-byte length, 4-byte
// CRC, data, 4-byte CRC each).
size_t whole_frames(const std::string& bytes) {
  size_t off = 0;
  while (off + 12 <= bytes.size()) {
    uint64_t len = 0;
    std::memcpy(&len, bytes.data() + off, 8);
    if (off + 12 + len + 4 > bytes.size()) break;
    off += 12 + len + 4;
  }
  return off;
}

}  // namespace

TEST_CASE("eval, generate and export: final/, else the latest complete checkpoint (said), else an error; --init") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TrainedRun t(bin);
  INFO(t.launched.out);
  REQUIRE(t.launched.rc == 0);
  // The job was interrupted after saving step 4, before final/: as if.
  fs::remove_all(t.run + "/final");
  const std::string ckpt = t.run + "/checkpoints/step4";

  RunResult r = TrainedRun::run_cmd({bin, "eval", t.run, "--data", t.valid, "--max-records", "2"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "has no final/ model (the run did not finish): using its latest complete checkpoint " + ckpt +
                            " (step 4)"));
  CHECK(contains(r.out, "eval: " + ckpt + " (step 4) on "));
  CHECK(!contains(r.out, "initial weights"));

  r = TrainedRun::run_cmd({bin, "generate", t.run, "add 1 and 2", "--max-new-tokens", "4"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "using its latest complete checkpoint " + ckpt + " (step 4)"));

  r = TrainedRun::run_cmd({bin, "export", t.run, "-o", t.tmp.path() + "/hf"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "has no final/ model: exporting its latest complete checkpoint"));
  CHECK(contains(r.out, "export: " + ckpt + " (step 4"));
  CHECK(fs::exists(t.tmp.path() + "/hf/model.safetensors"));

  // --init is the one way to the initial weights.
  r = TrainedRun::run_cmd({bin, "eval", t.run, "--data", t.valid, "--max-records", "2", "--init"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "eval: initial weights (seed "));
  r = TrainedRun::run_cmd({bin, "generate", t.run, "add 1 and 2", "--max-new-tokens", "2", "--init"});
  CHECK(r.rc == 0);
  r = TrainedRun::run_cmd({bin, "export", t.run, "-o", t.tmp.path() + "/hf-init", "--init"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "export: initial weights (seed "));

  // No checkpoint either: an error naming --init, never the initial weights.
  fs::remove_all(t.run + "/checkpoints");
  for (const std::string cmd : {"eval", "generate", "export"}) {
    CAPTURE(cmd);
    std::vector<std::string> argv{bin, cmd, t.run};
    if (cmd == "eval") argv.insert(argv.end(), {"--data", t.valid, "--max-records", "2"});
    if (cmd == "generate") argv.push_back("add 1 and 2");
    if (cmd == "export") argv.insert(argv.end(), {"-o", t.tmp.path() + "/hf2"});
    r = TrainedRun::run_cmd(argv);
    INFO(r.out);
    CHECK(r.rc != 0);
    CHECK(r.rc < 128);  // an error, not a crash
    CHECK(contains(r.out, "--init"));
    CHECK(!contains(r.out, "initial weights (seed"));
  }
  CHECK(!fs::exists(t.tmp.path() + "/hf2"));
}

TEST_CASE("a checkpoints/latest pointing outside the run is never opened; a prompt over max_seq_len is said") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TrainedRun t(bin);
  INFO(t.launched.out);
  REQUIRE(t.launched.rc == 0);

  // max_seq_len is 128: a raw prompt of 200 bytes is cut, and that is said.
  RunResult r = TrainedRun::run_cmd({bin, "generate", t.run, std::string(200, 'a'), "--raw"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out,
                 "the prompt is 200 tokens, and the model's max_seq_len is 128: only its last 127 tokens are "
                 "used, leaving room for 1 new token"));

  fs::remove_all(t.run + "/final");
  const std::string outside = t.tmp.path() + "/outside";
  fs::create_directories(outside);
  std::ofstream(outside + "/manifest.json") << R"({"config_yaml": "model: [never parsed"})";
  std::ofstream(t.run + "/checkpoints/latest", std::ios::trunc) << "../../outside";
  r = TrainedRun::run_cmd({bin, "export", t.run, "-o", t.tmp.path() + "/hf"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(!contains(r.out, "never parsed"));
  CHECK(!contains(r.out, outside));
  CHECK(contains(r.out, "names '../../outside', not a checkpoint"));
  CHECK(contains(r.out, "export: " + t.run + "/checkpoints/step4 (step 4"));
}

TEST_CASE("data prepare never replaces its input, and leaves no stray .tmp") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-lost-prep");
  const std::string x = tmp.path() + "/X.jsonl";
  fs::copy_file(shipped_data_dir() + "/valid.jsonl", x);
  const std::string before = read_text(x);
  REQUIRE(!before.empty());
  fs::create_hard_link(x, tmp.path() + "/hard.jsonl");
  fs::create_symlink(x, tmp.path() + "/link.jsonl");
  for (const std::string& out :
       std::vector<std::string>{x, tmp.path() + "/./X.jsonl", tmp.path() + "/hard.jsonl", tmp.path() + "/link.jsonl"}) {
    CAPTURE(out);
    RunResult r = run({bin, "data", "prepare", x, out, "--format", "alpaca"}, {}, 60s);
    INFO(r.out);
    CHECK(r.rc == kUsage);
    CHECK(contains(r.out, "one of this command's inputs"));
    CHECK(read_text(x) == before);
  }
  // An output that is a directory: refused, and nothing left beside it.
  const std::string dir = tmp.path() + "/shards";
  fs::create_directories(dir);
  RunResult r = run({bin, "data", "prepare", x, dir, "--format", "alpaca"}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "is a directory"));
  CHECK(!fs::exists(dir + ".tmp"));
  CHECK(fs::is_empty(dir));
  // A normal output still works.
  r = run({bin, "data", "prepare", x, dir + "/x.bin", "--format", "alpaca"}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(fs::exists(dir + "/x.bin"));
  CHECK(!fs::exists(dir + "/x.bin.tmp"));
}

TEST_CASE("an unknown data.template fails launch validation naming the key") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-lost-tmpl");
  const std::string config = tmp.path() + "/tiny.yaml";
  std::ofstream(config) << tiny_cpu_job(2);
  RunResult r = run({bin, "launch", "--config", config, "--output-dir", tmp.path() + "/run", "--master-port", "0",
                     "--set", "data.template=jinja", "--dry-run"},
                    {}, 60s);
  INFO(r.out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "data.template"));
  CHECK(contains(r.out, "jinja"));
  CHECK(!fs::exists(tmp.path() + "/run"));
}

TEST_CASE("dtrain status on an events.jsonl of NUL bytes or with a non-string event: exit 3 naming file and line") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-lost-status");
  const std::string run_dir = tmp.path() + "/run";
  fs::create_directories(run_dir);
  std::ofstream(run_dir + "/config.yaml") << tiny_cpu_job(2);
  const std::string events = run_dir + "/events.jsonl";
  std::ofstream(events, std::ios::binary) << std::string(2u << 20, '\0');
  RunResult r = run({bin, "status", run_dir}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc == kIo);
  CHECK(contains(r.out, events + ":1:"));
  CHECK(contains(r.out, "NUL bytes"));

  std::ofstream(events, std::ios::trunc) << R"({"time_ms":1,"event":"round_start","round":0})"
                                         << "\n"
                                         << R"({"time_ms":2,"event":5,"round":0})"
                                         << "\n";
  r = run({bin, "status", run_dir}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc == kIo);
  CHECK(contains(r.out, events + ":2:"));
  CHECK(contains(r.out, "\"event\" field is 5, not a string"));
}

TEST_CASE("bench --json /dev/full fails naming the file and the reason") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-lost-bench");
  RunResult r = run({bin,
                     "bench",
                     "allreduce",
                     "--nproc-per-node",
                     "1",
                     "--master-port",
                     "0",
                     "-n",
                     "1",
                     "-w",
                     "0",
                     "--output-dir",
                     tmp.path() + "/run",
                     "-b",
                     "1K",
                     "-e",
                     "1K",
                     "--json",
                     "/dev/full",
                     "--set",
                     "fault_tolerance.max_retries=0"},
                    {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc != 0);
  CHECK(contains(r.out, "cannot write --json file /dev/full: No space left on device"));
}

TEST_CASE("a full disk under the TensorBoard output: reported once, training goes on, only whole records") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  Tmpfs fs64(64);
  if (fs64.dir().empty()) return ::dtrain::test::skip_test("cannot mount a tmpfs (not root?): skipping");
  // One page left: the event file's records fill it and one ends up cut at its end.
  const uint64_t free_now = fs64.free_bytes();
  REQUIRE(free_now > 4096);
  fill(fs64.dir() + "/filler", free_now - 4096);
  REQUIRE(fs64.free_bytes() == 4096);
  TempDir tmp("dtrain-lost-tb");
  const std::string config = tmp.path() + "/tiny.yaml";
  const std::string logs = fs64.dir() + "/tb";
  std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 4\nsteps_per_print: 1\n",
                                     .n_layer = 1,
                                     .max_steps = 80,
                                     .save_steps = 0,
                                     .training_more = "  device: cpu\n",
                                     // The one free page is the trainer's: no resource monitor
                                     // event file (resources/rank0/) to take it first.
                                     .rest = "fault_tolerance:\n  max_retries: 0\nmonitor:\n  enabled: false\n"
                                             "tensorboard:\n  enabled: true\n  output_path: " +
                                             logs + "\n"});
  RunResult r =
      run({bin, "launch", "--config", config, "--master-port", "0", "--output-dir", tmp.path() + "/run"}, {}, 180s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "step 80/80"));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(logs)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  // Reported once, naming the file.
  const std::string said = "cannot write " + files[0].string() + ": No space left on device";
  CHECK(contains(r.out, said));
  CHECK(r.out.find(said) == r.out.rfind(said));
  const std::string bytes = read_text(files[0].string());
  CHECK(bytes.size() > 1000);                  // the page was used
  CHECK(whole_frames(bytes) == bytes.size());  // and ends with a whole record
  const auto v = dtrain::test::tfevents_read(logs);
  INFO("reader:\n" << v.output);
  CHECK(v.code == 0);
  CHECK(!dtrain::test::tfevents_steps(v, "train/loss").empty());
}

TEST_CASE("a disk-full round's last retry leaves no empty checkpoints/tmp-step<k>/") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  Tmpfs disk(2048);
  if (disk.dir().empty()) return ::dtrain::test::skip_test("cannot mount a tmpfs (not root?): skipping");
  TempDir tmp("dtrain-lost-ckpt");
  const std::string config = tmp.path() + "/tiny.yaml";
  // (The preflight would refuse the tiny disk before any rank runs: doctor.min_free_gb.)
  std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 4\nsteps_per_print: 1\n",
                                     .n_layer = 1,
                                     .save_steps = 2,
                                     .training_more = "  device: cpu\n",
                                     .rest = "fault_tolerance:\n  max_retries: 0\ndoctor:\n  preflight: false\n"});
  const std::string run_dir = disk.dir() + "/run";
  // Room for the run's small files (logs, metrics: a few KiB) but not for a checkpoint.
  fill(disk.dir() + "/filler", disk.free_bytes() - 160 * 1024);
  RunResult r = run({bin, "launch", "--config", config, "--master-port", "0", "--output-dir", run_dir}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc != 0);
  // The step-2 save failed on the full disk (one checkpoint is about 300 KiB).
  CHECK(contains(r.out, "cannot write checkpoint file " + run_dir + "/checkpoints/tmp-step2/"));
  CHECK(contains(r.out, "No space left on device"));
  std::vector<std::string> partial;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir + "/checkpoints", ec))
    if (e.path().filename().string().rfind("tmp-", 0) == 0) partial.push_back(e.path().string());
  CHECK(partial.empty());
}

TEST_CASE("a resume that trains on drops its old final/: interrupted, eval uses the newer checkpoint") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TrainedRun t(bin);
  INFO(t.launched.out);
  REQUIRE(t.launched.rc == 0);
  REQUIRE(fs::exists(t.run + "/final/model.safetensors"));  // of step 4
  // Resumed to 8 steps, the rank stalls before step 7 (test hook): step 6 is saved by then.
  Child resumed({bin, "resume", t.run, "--master-port", "0", "--set", "training.max_steps=8"},
                {{"DTRAIN_TEST_STALL_AT_STEP", "7"}});
  REQUIRE(resumed.started());
  const bool stalled = resumed.wait_output("rank 0 stalls before step 7", 120s);
  INFO(resumed.output());
  REQUIRE(stalled);
  CHECK(!fs::exists(t.run + "/final"));
  CHECK(contains(resumed.output(), "removed " + t.run + "/final: the run trains on from step 4"));
  resumed.kill_group();
  RunResult r = TrainedRun::run_cmd({bin, "eval", t.run, "--data", t.valid, "--max-records", "2"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "eval: " + t.run + "/checkpoints/step6 (step 6) on "));
}
