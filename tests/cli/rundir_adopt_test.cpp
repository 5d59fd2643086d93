// Which directories dtrain writes into (issue 33, items 1 and 3), through the real binary:
// system paths (/, /proc, /etc, $HOME, a kernel file system) are refused before anything
// is touched, a non-empty directory that is not a dtrain run keeps its mode and contents,
// an empty directory dtrain did not create keeps its mode (1777 stays 1777), a run of an
// older dtrain (no marker) still resumes, and `dtrain run` takes the launcher's lock.
// The system-path cases run only inside a throwaway mount and pid namespace whose / is
// remounted read-only first, so a binary that failed to refuse could not write into the
// real / (and its /proc is the namespace's own). Skipped without root or unshare(1).
#include "cli_harness.h"
#include "rundir_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <fmt/format.h>

#include <sys/stat.h>

#include <algorithm>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

// The names in dir, sorted, and each regular file's contents: what must not change.
std::string dir_snapshot(const std::string& dir) {
  std::vector<std::string> lines;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string line = e.path().filename().string();
    if (e.is_regular_file(ec)) line += " = " + read_text(e.path().string());
    lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace

TEST_CASE("system paths are refused before anything is touched (inside a throwaway namespace with / read-only)") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  if (::geteuid() != 0) return ::dtrain::test::skip_test("not root (the namespace needs it): skipping");
  int rc = -1;
  shell("unshare --mount --pid --fork --mount-proc true 2>/dev/null", &rc);
  if (rc != 0) return ::dtrain::test::skip_test("unshare --mount --pid --mount-proc is not permitted here: skipping");

  RunDirScratch s("dtrain-adopt");
  const std::string scratch = s.tmp.path() + "/scratch";  // a tmpfs inside the namespace
  fs::create_directories(scratch);
  // Each case: the mode and listing before and after, and the launch's exit code and output.
  const std::string script = s.tmp.path() + "/cases.sh";
  std::ofstream(script) << fmt::format(
      R"SH(set -u
# Every mount read-only in this namespace (the bind remount changes only this
# namespace's view): a binary that failed to refuse could write nowhere real.
mount --make-rprivate / || exit 90
for m in $(awk '{{print $5}}' /proc/self/mountinfo | sort -r); do mount -o remount,bind,ro "$m" 2>/dev/null; done
mount -o remount,bind,ro / || exit 91
for d in / /proc /sys /dev /dev/shm /etc /usr /var /tmp /root; do
  [ -w "$d" ] && {{ echo "NOT READ-ONLY $d"; exit 92; }}
done
# The namespace's own: a tmpfs, a proc instance of this pid namespace, a $HOME.
mount -t tmpfs -o size=4m,mode=0755 tmpfs {scratch} || exit 93
mkdir {scratch}/kproc {scratch}/home && mount -t proc proc {scratch}/kproc || exit 94
chmod 0755 {scratch}/home
for d in / /proc /proc/self /sys /dev /etc /usr /var /tmp /root {scratch}/kproc {scratch}/home; do
  # The mode, and which of the names a run directory holds are there (other processes
  # on the machine may come and go in /tmp or /proc meanwhile).
  names='^(\.dtrain-run|\.dtrain-run\.tmp|config\.yaml|config\.yaml\.tmp|events\.jsonl|launcher\.lock|hostfile|logs|checkpoints)$'
  before="$(stat -c %a "$d") $(ls -A "$d" 2>/dev/null | grep -E "$names" | md5sum)"
  HOME={scratch}/home {bin} launch --config {config} --output-dir "$d" --master-port 0 > {scratch}/out 2>&1
  rc=$?
  after="$(stat -c %a "$d") $(ls -A "$d" 2>/dev/null | grep -E "$names" | md5sum)"
  echo "CASE $d rc=$rc same=$([ "$before" = "$after" ] && echo yes || echo no) mode=$(stat -c %a "$d")"
  sed 's/^/  | /' {scratch}/out
done
echo DONE
)SH",
      fmt::arg("scratch", scratch), fmt::arg("bin", bin), fmt::arg("config", s.config));
  const std::string mode_root_before = fmt::format("{:o}", mode_of("/"));
  RunResult r = run({"/usr/bin/unshare", "--mount", "--pid", "--fork", "--mount-proc", "/bin/sh", script}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);
  REQUIRE(contains(r.out, "DONE"));
  const std::vector<std::string> cases{
      "/",    "/proc", "/proc/self",       "/sys",           "/dev", "/etc", "/usr", "/var",
      "/tmp", "/root", scratch + "/kproc", scratch + "/home"};
  for (const std::string& d : cases) {
    CAPTURE(d);
    const size_t at = r.out.find("CASE " + d + " ");
    REQUIRE(at != std::string::npos);
    const size_t next = r.out.find("\nCASE ", at + 1);
    const std::string c = r.out.substr(at, next == std::string::npos ? std::string::npos : next - at);
    CHECK(contains(c, " rc=2 "));      // a usage error, at once
    CHECK(contains(c, " same=yes "));  // mode and listing unchanged
    CHECK(contains(c, "refused"));
  }
  // Which rule refused: the list, a kernel file system, $HOME.
  CHECK(contains(r.out, "/ is a system directory"));
  CHECK(contains(r.out, "/proc/self is inside the system directory /proc"));
  CHECK(contains(r.out, scratch + "/kproc is on a proc file system"));
  CHECK(contains(r.out, scratch + "/home is your home directory ($HOME) itself"));
  // The real / was never in reach; checked anyway.
  CHECK(fmt::format("{:o}", mode_of("/")) == mode_root_before);
  CHECK(!fs::exists("/config.yaml.tmp"));
  CHECK(!fs::exists("/.dtrain-run"));
}

TEST_CASE("a non-empty directory that is not a dtrain run is refused, its mode and contents unchanged") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-adopt");
  const std::string u = s.tmp.path() + "/u";
  fs::create_directories(u + "/sub");
  std::ofstream(u + "/config.yaml") << "mine\n";
  std::ofstream(u + "/notes.txt") << "keep me\n";
  ::chmod(u.c_str(), 0755);
  const std::string before = dir_snapshot(u);
  for (const std::string cmd : {"launch", "dry-run", "run"}) {
    CAPTURE(cmd);
    std::vector<std::string> argv{bin, cmd == "run" ? "run" : "launch", "--config", s.config, "--output-dir", u};
    if (cmd != "run") argv.insert(argv.end(), {"--master-port", "0"});
    if (cmd == "dry-run") argv.push_back("--dry-run");
    if (cmd == "run") argv.insert(argv.end(), {"--set", "cluster.rendezvous.token_file=" + s.token});
    RunResult r = run(argv, lone_rank_env(), 60s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 2);
    CHECK(contains(r.out, "is not a dtrain run directory"));
    CHECK(mode_of(u) == 0755);
    CHECK(dir_snapshot(u) == before);
  }
}

TEST_CASE("an empty directory dtrain did not create keeps its mode; a run of an older dtrain still resumes") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-adopt");
  // Empty, 1777 (a shared scratch directory): adopted, its mode left as it is.
  const std::string shared = s.shared_1777();
  RunResult r = run({bin, "launch", "--config", s.config, "--output-dir", shared, "--master-port", "0"}, {}, 120s);
  expect_adopted(r, shared);

  // Created by dtrain: its mode is dtrain's, and the marker says so.
  const std::string fresh = s.tmp.path() + "/fresh";
  r = run({bin, "launch", "--config", s.config, "--output-dir", fresh, "--master-port", "0"}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(mode_of(fresh) == 0700);
  CHECK(contains(read_text(fresh + "/.dtrain-run"), "\"created\":true"));

  // A run written before the marker existed (config.yaml with events.jsonl and
  // checkpoints/): resumable; its mode is not dtrain's to change any more.
  fs::remove(fresh + "/.dtrain-run");
  ::chmod(fresh.c_str(), 0750);
  r = run({bin, "resume", fresh, "--master-port", "0", "--set", "training.max_steps=6"}, {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "resumed from step 4"));
  CHECK(mode_of(fresh) == 0750);
  CHECK(contains(read_text(fresh + "/.dtrain-run"), "\"created\":false"));
}

TEST_CASE("--output-dir '' is a usage error, not the config's output_dir") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-adopt");
  const std::string cfg_dir = s.tmp.path() + "/from-config";
  for (const std::string cmd : {"launch", "run"}) {
    CAPTURE(cmd);
    RunResult r =
        run({bin, cmd, "--config", s.config, "--output-dir", "", "--set", "training.output_dir=" + cfg_dir}, {}, 60s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 2);
    CHECK(contains(r.out, "--output-dir is empty"));
    CHECK(!fs::exists(cfg_dir));
  }
}

TEST_CASE("dtrain run on the run directory of a live dtrain launch is refused; the launch's files are untouched") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  RunDirScratch s("dtrain-adopt");
  const std::string& run_dir = s.run_dir;
  LiveLaunch first(bin, s.config, run_dir);
  const std::string config_before = read_text(run_dir + "/config.yaml");
  const std::string events_before = read_text(run_dir + "/events.jsonl");
  REQUIRE(!config_before.empty());

  expect_lock_refused(run({bin, "run", "--config", s.config, "--output-dir", run_dir, "--set", "model.d_model=64",
                           "--set", "cluster.rendezvous.token_file=" + s.token},
                          lone_rank_env(), 60s),
                      first.pid());
  CHECK(read_text(run_dir + "/config.yaml") == config_before);
  CHECK(read_text(run_dir + "/events.jsonl").substr(0, events_before.size()) == events_before);
  CHECK(!contains(read_text(run_dir + "/events.jsonl"), "\"started_by\""));  // no round of dtrain run's
  CHECK(first.running());
  first.kill_group();
}
