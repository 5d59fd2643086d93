// A full disk through the real binary (issue 12, finding 6), on a small tmpfs mounted
// as the run directory's filesystem: a checkpoint write that hits ENOSPC fails the round
// with the path and "No space left on device", the launcher survives its own failed
// writes, retries once space is freed and the job completes from the last complete
// checkpoint; with no retries and a disk that stays full it exits non-zero and `dtrain
// status` does not say running; a partial tmp-step<k> directory left by a crash does not
// stop `dtrain resume`. Exit code 77 (ctest: SKIPPED) when not root, when mounting a
// tmpfs is not permitted, or without $DTRAIN_BIN.
#include "cli_harness.h"
#include "tiny_job.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kNoSpace = "No space left on device";

[[noreturn]] void skip(const std::string& why) {
  std::printf("disk-full tests skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

std::string bin_or_skip() {
  std::string b = dtrain_bin();
  if (b.empty()) skip("$DTRAIN_BIN is not set or not executable (run through ctest after a full build)");
  return b;
}

// A tmpfs of `kib` KiB mounted on a fresh temporary directory for the object's life:
// unmounted (lazily, so a straggling process cannot keep it) and removed in the
// destructor, however the test ends. Skips the whole binary when mounting is not allowed.
class Tmpfs {
 public:
  explicit Tmpfs(size_t kib) {
    if (::geteuid() != 0) skip("not root (mounting a tmpfs needs it)");
    dir_ = make_temp_dir("dtrain-diskfull");
    if (dir_.empty()) skip("cannot create a temporary directory");
    const std::string opts = fmt::format("size={}k,mode=0755", kib);
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::rmdir(dir_.c_str());
      skip("mount -t tmpfs -o " + opts + " is not permitted here: " + why);
    }
  }
  ~Tmpfs() {
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
  static const std::vector<char> zeros(64 * 1024, 0);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t w = ::write(fd, zeros.data(), std::min<uint64_t>(zeros.size(), bytes - done));
    if (w <= 0) break;
    done += static_cast<uint64_t>(w);
  }
  ::close(fd);
  return done;
}

// Disk space the files under dir take (allocated blocks); `skip` names top-level entries
// left out.
uint64_t used_bytes(const fs::path& dir, const std::vector<std::string>& skip = {}) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it.depth() == 0 && std::find(skip.begin(), skip.end(), it->path().filename().string()) != skip.end()) {
      it.disable_recursion_pending();
      continue;
    }
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

// A tiny Llama on the shipped task data, 2 local ranks, a checkpoint every 5 steps.
std::string config_text(int max_steps, int max_retries, int retry_delay) {
  return tiny_job({.top = "train_batch_size: 64\ntrain_micro_batch_size_per_gpu: 16\nsteps_per_print: 1\n",
                   .max_steps = max_steps,
                   .save_steps = 5,
                   .training_more = "  keep_last: 2\n  seed: 11\n",
                   // The launch preflight would refuse this tiny tmpfs (doctor.min_free_gb) before
                   // any rank runs; these cases are about a disk that fills up mid-run.
                   .rest = fmt::format("fault_tolerance:\n  max_retries: {}\n  retry_delay: {}\n"
                                       "  heartbeat_interval: 1\n  heartbeat_timeout: 10\n"
                                       "doctor:\n  preflight: false\n",
                                       max_retries, retry_delay)});
}

// The config as a file beside (not inside) the tmpfs, so a full disk cannot touch it.
struct ConfigFile {
  TempDir dir{"dtrain-diskfull-cfg"};
  std::string path;
  ConfigFile(int max_steps, int max_retries, int retry_delay) {
    path = dir.path() + "/job.yaml";
    std::ofstream(path) << config_text(max_steps, max_retries, retry_delay);
  }
};

std::vector<std::string> launch_argv(const std::string& bin, const std::string& config, const std::string& run_dir) {
  return {bin, "launch", "--config", config, "--nproc-per-node", "2", "--master-port", "0", "--output-dir", run_dir};
}

// What one checkpoint of this job takes on disk, and everything else its run directory
// holds after 5 steps (logs, metrics, events, status files, config), from a run on a
// tmpfs of its own.
struct Sizes {
  uint64_t checkpoint = 0, other = 0;
};
const Sizes& job_sizes(const std::string& bin) {
  static const Sizes sizes = [&] {
    Tmpfs t(64 * 1024);
    ConfigFile cfg(5, 0, 1);
    const std::string run_dir = t.dir() + "/run";
    auto r = run(launch_argv(bin, cfg.path, run_dir), {}, 120s);
    INFO("calibration run output:\n" << r.out);
    REQUIRE(!r.timed_out);
    REQUIRE(r.rc == 0);
    Sizes s;
    s.checkpoint = used_bytes(fs::path(run_dir) / "checkpoints" / "step5");
    s.other = used_bytes(run_dir, {"checkpoints", "final"});
    return s;
  }();
  return sizes;
}

std::vector<nlohmann::json> events_of(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  for (const auto& line : split_lines(read_text(run_dir + "/events.jsonl"))) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

// Lines of text holding every one of parts.
bool some_line_has(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& line : split_lines(text)) {
    bool all = true;
    for (const auto& p : parts) all = all && contains(line, p);
    if (all) return true;
  }
  return false;
}

std::vector<std::string> partial_dirs(const std::string& run_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec))
    if (e.path().filename().string().rfind("tmp-step", 0) == 0) out.push_back(e.path().string());
  return out;
}

// The `state` row of `dtrain status RUN_DIR`, and every node row.
struct StatusRows {
  std::string state;
  std::vector<std::string> nodes;
  std::string text;
};
StatusRows status_of(const std::string& bin, const std::string& run_dir) {
  auto r = run({bin, "status", run_dir}, {}, 30s);
  StatusRows s;
  s.text = r.out;
  for (const auto& line : split_lines(r.out)) {
    if (line.rfind("state ", 0) == 0) s.state = line.substr(line.find_first_not_of(' ', 5));
    if (line.rfind("  node", 0) == 0) s.nodes.push_back(line);
  }
  return s;
}

}  // namespace

TEST_CASE(
    "a checkpoint write that hits ENOSPC fails the round; once space is freed the retry continues from the "
    "last complete checkpoint") {
  const std::string bin = bin_or_skip();
  const Sizes& sizes = job_sizes(bin);
  MESSAGE(fmt::format("one checkpoint takes {} KiB, the rest of the run directory {} KiB", sizes.checkpoint / 1024,
                      sizes.other / 1024));
  // Room for the step-5 checkpoint and half of the step-10 one: the rest of the run
  // directory must fit in the other half for the failure to come from the checkpoint.
  REQUIRE(sizes.checkpoint > 0);
  REQUIRE_MESSAGE(3 * sizes.other < sizes.checkpoint / 2, "the run directory's other files are too large here");

  Tmpfs t(64 * 1024);
  ConfigFile cfg(20, 3, 4);
  const std::string run_dir = t.dir() + "/run", filler = t.dir() + "/filler";
  const uint64_t room = sizes.checkpoint + sizes.checkpoint / 2;
  REQUIRE(t.free_bytes() > room);
  const uint64_t want = t.free_bytes() - room;
  REQUIRE(fill(filler, want) == want);

  Child c(launch_argv(bin, cfg.path, run_dir));
  REQUIRE(c.started());
  // The failed round: the launcher says it restarts, and waits retry_delay (4 s) first.
  const bool restarting = c.wait_output("restarting in", 120s);
  INFO("output:\n" << c.output());
  REQUIRE(restarting);
  REQUIRE(c.running());  // the launcher itself survived the full disk
  fs::remove(filler);
  const auto rc = c.wait(180s);
  const std::string out = c.output();
  INFO("output:\n" << out);
  REQUIRE(rc.has_value());
  CHECK(*rc == 0);

  // The failure names the file and the reason.
  CHECK(some_line_has(out, {"cannot write checkpoint file " + run_dir + "/checkpoints/tmp-step10/", kNoSpace}));
  CHECK(some_line_has(out, {"round 0 failed", kNoSpace}));
  // The next round removed the partial checkpoint and resumed from the complete one.
  CHECK(
      contains(out, "removed " + run_dir + "/checkpoints/tmp-step10, left by a checkpoint save that did not complete"));
  CHECK(contains(out, "resumed from step 5 "));
  // (Round 1 unless this test was too slow to free the space within retry_delay.)
  CHECK(contains(out, "job finished: all 2 rank(s) succeeded in round "));
  CHECK(partial_dirs(run_dir).empty());
  CHECK(read_text(run_dir + "/checkpoints/latest") == "step20");

  // events.jsonl: round 0 failed (with the reason), a later round finished.
  const auto events = events_of(run_dir);
  bool failure = false, finished = false;
  for (const auto& e : events) {
    if (e.value("event", "") == "failure" && e.value("round", -1) == 0) {
      failure = true;
      CHECK(contains(e.value("why", ""), kNoSpace));
    }
    if (e.value("event", "") == "finished" && e.value("round", -1) >= 1) finished = true;
  }
  CHECK(failure);
  CHECK(finished);
  CHECK(status_of(bin, run_dir).state.rfind("finished", 0) == 0);
}

TEST_CASE(
    "a disk that stays full with max_retries 0: the launcher reports its own failed writes, exits non-zero and "
    "status does not say running") {
  const std::string bin = bin_or_skip();
  Tmpfs t(4 * 1024);  // small: filling it takes a moment, well before the ranks write
  ConfigFile cfg(20, 0, 1);
  const std::string run_dir = t.dir() + "/run";
  Child c(launch_argv(bin, cfg.path, run_dir));
  REQUIRE(c.started());
  // Once the launcher has written its files and started the round, nothing more fits.
  const bool started = c.wait_output("round 0: starting", 60s);
  INFO("output:\n" << c.output());
  REQUIRE(started);
  fill(t.dir() + "/filler", UINT64_MAX);
  CHECK(t.free_bytes() == 0);
  const auto rc = c.wait(120s);
  const std::string out = c.output();
  INFO("output:\n" << out);
  REQUIRE(rc.has_value());
  CHECK(*rc != 0);
  // A rank's write failed with the reason; the launcher went on to its normal ending.
  CHECK(some_line_has(out, {run_dir + "/", kNoSpace}));
  CHECK(some_line_has(out, {"round 0 failed", kNoSpace}));
  CHECK(contains(out, "giving up after 0 restart(s)"));
  // nodes.json is rewritten through a new file when the round ends: that cannot fit. It
  // is reported with the path and the reason, once, and supervision went on.
  CHECK(some_line_has(out, {"cannot write " + run_dir + "/nodes.json", kNoSpace, "goes on supervising"}));
  size_t reports = 0;
  for (const auto& line : split_lines(out))
    if (contains(line, "cannot write " + run_dir + "/nodes.json") && contains(line, "goes on supervising")) ++reports;
  CHECK(reports == 1);

  const StatusRows st = status_of(bin, run_dir);
  INFO("status:\n" << st.text);
  CHECK(!st.state.empty());
  CHECK(st.state.rfind("running", 0) != 0);
  for (const auto& n : st.nodes) CHECK(!contains(n, " running"));
}

TEST_CASE("a partial tmp-step checkpoint left by a crash on a full disk does not stop dtrain resume") {
  const std::string bin = bin_or_skip();
  Tmpfs t(64 * 1024);
  const std::string run_dir = t.dir() + "/run";
  {
    ConfigFile cfg(5, 0, 1);
    auto r = run(launch_argv(bin, cfg.path, run_dir), {}, 120s);
    INFO("first run output:\n" << r.out);
    REQUIRE(!r.timed_out);
    REQUIRE(r.rc == 0);
  }
  REQUIRE(read_text(run_dir + "/checkpoints/latest") == "step5");
  // A user's own files whose names start like dtrain's temporaries: never removed.
  const std::string mine = run_dir + "/checkpoints/tmp-mine";
  fs::create_directories(mine);
  std::ofstream(mine + "/notes.txt") << "keep me\n";
  std::ofstream(run_dir + "/checkpoints/tmp-step7.txt") << "keep me too\n";
  // What a rank killed while saving step 10 on a disk that then was full leaves behind.
  const std::string partial = run_dir + "/checkpoints/tmp-step10";
  fs::create_directories(partial);
  fill(partial + "/rank0.bin", UINT64_MAX);
  REQUIRE(t.free_bytes() == 0);

  auto r = run({bin, "resume", run_dir, "--set", "training.max_steps=10", "--master-port", "0"}, {}, 180s);
  INFO("resume output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "removed " + partial + ", left by a checkpoint save that did not complete"));
  CHECK(contains(r.out, "resumed from step 5 "));
  CHECK(read_text(run_dir + "/checkpoints/latest") == "step10");
  CHECK(partial_dirs(run_dir) == std::vector<std::string>{run_dir + "/checkpoints/tmp-step7.txt"});
  CHECK(read_text(mine + "/notes.txt") == "keep me\n");
  CHECK(read_text(run_dir + "/checkpoints/tmp-step7.txt") == "keep me too\n");
}
