// Nothing lost, round three (issue 43, items 1-7 and 20's --json file): the one rule for
// outputs (core/output_path.h) through the real binary. Every writing command (export,
// plot, data prepare, bench --json, launch) is pointed at its own input, the run's
// init_from, a user's non-empty directory, a symlink to one and a user's file (the commands
// that write a file also at empty 0700 and 1777 directories and a file of the init_from):
// each is refused (exit 2, naming the path) with every byte, mode and inode there
// unchanged. Export and launch write into an empty 0700 or 1777 directory or through a
// symlink to an empty directory, the directory keeping its inode and mode and the link
// staying a link; an export directory
// is its own kind (marker) and is re-exported in place; --force replaces a user's file,
// never an input.
#include "cli_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <fmt/format.h>

#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <set>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kUsage = 2;

// What a path holds, not following links: per entry its type, mode, inode and bytes (a
// link: its target). Two equal snapshots mean nothing there was written, replaced,
// re-created or chmodded.
std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> out;
  auto one = [&](const fs::path& p, const std::string& rel) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      out[rel] = "missing";
      return;
    }
    std::string v = fmt::format("mode {:o} ino {}", st.st_mode, st.st_ino);
    if (S_ISLNK(st.st_mode)) v += " -> " + fs::read_symlink(p).string();
    if (S_ISREG(st.st_mode)) v += " " + read_text(p.string());
    out[rel] = v;
  };
  one(root, ".");
  std::error_code ec;
  if (fs::is_symlink(root, ec) || !fs::is_directory(root, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    one(it->path(), fs::relative(it->path(), root).string());
  return out;
}

std::set<std::string> names(const std::string& dir) {
  std::set<std::string> s;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) s.insert(e.path().filename().string());
  return s;
}

struct Stat {
  unsigned mode = 0;
  ino_t ino = 0;
};
Stat stat_of(const std::string& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return {};
  return {static_cast<unsigned>(st.st_mode & 07777), st.st_ino};
}

// Two tiny runs shared by the cases: run0, exported into base/ (a dtrain export), and run1
// fine-tuned from hfbase/ (base/ without the export marker: a downloaded HF model).
struct Runs {
  TempDir tmp{"dtrain-outputs"};
  std::string bin = dtrain_bin();
  std::string dir = tmp.path();
  std::string config = dir + "/tiny.yaml";
  std::string run0 = dir + "/run0", run1 = dir + "/run1", base = dir + "/base", hfbase = dir + "/hfbase";
  bool ok = false;
  std::string log;

  Runs() {
    if (bin.empty()) return;
    std::ofstream(config) << tiny_cpu_job(2);
    RunResult r = dtrain({"launch", "--config", config, "--output-dir", run0, "--master-port", "0"});
    log += r.out;
    if (r.rc != 0) return;
    r = dtrain({"export", run0, "-o", base});
    log += r.out;
    if (r.rc != 0) return;
    std::error_code ec;
    fs::copy(base, hfbase, ec);
    fs::remove(hfbase + "/.dtrain-export.json", ec);
    r = dtrain({"launch", "--config", config, "--output-dir", run1, "--master-port", "0", "--set",
                "model.init_from=" + hfbase});
    log += r.out;
    ok = r.rc == 0;
  }
  RunResult dtrain(std::vector<std::string> args) const {
    args.insert(args.begin(), bin);
    return run(args, {}, 120s);
  }
};

Runs& runs() {
  static Runs r;
  return r;
}

#define REQUIRE_RUNS(R)                                                                \
  Runs& R = runs();                                                                    \
  if (R.bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping"); \
  INFO(R.log);                                                                         \
  REQUIRE(R.ok)

// The targets every writing command is tried against, created fresh under `dir`: name ->
// path. A user's non-empty directory, a symlink to it, a user's regular file.
std::map<std::string, std::string> user_targets(const std::string& dir) {
  fs::create_directories(dir + "/mine");
  std::ofstream(dir + "/mine/model.safetensors") << "precious\n";
  std::ofstream(dir + "/mine/config.json") << "{\"mine\": 1}\n";
  fs::create_directories(dir + "/real");
  std::ofstream(dir + "/real/own.txt") << "mine\n";
  fs::create_directory_symlink(dir + "/real", dir + "/link");
  std::ofstream(dir + "/notes.txt") << "my notes\n";
  return {{"a non-empty directory", dir + "/mine"},
          {"a symlink to a non-empty directory", dir + "/link"},
          {"a regular file", dir + "/notes.txt"}};
}

// user_targets plus, for the commands that write a file: empty 0700 and 1777 directories
// (a directory is never replaced by a file) and a file of the run's init_from.
std::map<std::string, std::string> file_targets(const Runs& R, const std::string& dir) {
  auto t = user_targets(dir);
  for (unsigned mode : {0700u, 01777u}) {
    const std::string d = dir + fmt::format("/empty{:o}", mode);
    fs::create_directories(d);
    ::chmod(d.c_str(), mode);
    t[fmt::format("an empty {:o} directory", mode)] = d;
  }
  t["a file of the run's init_from"] = R.hfbase + "/config.json";
  return t;
}

// Runs the command with `target` as its output and checks it is refused naming the
// target, with nothing under `watch` changed.
void refused(const Runs& R, const std::vector<std::string>& args, const std::string& target,
             const std::vector<std::string>& watch) {
  std::vector<std::map<std::string, std::string>> before;
  for (const auto& w : watch) before.push_back(snapshot(w));
  const RunResult r = R.dtrain(args);
  INFO(fmt::format("dtrain {}\n{}", fmt::join(args, " "), r.out));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, target));
  for (size_t i = 0; i < watch.size(); ++i) {
    INFO("watched: " << watch[i]);
    CHECK(snapshot(watch[i]) == before[i]);
  }
}

}  // namespace

TEST_CASE("export never writes what it reads, a user's directory or file (items 1-4)") {
  REQUIRE_RUNS(R);
  TempDir t("dtrain-outputs-export");
  auto targets = user_targets(t.path());
  fs::create_directory_symlink(R.hfbase, t.path() + "/baselink");
  targets["the run's init_from"] = R.hfbase;
  targets["a symlink to the run's init_from"] = t.path() + "/baselink";
  targets["the run directory"] = R.run1;
  targets["the run's checkpoints"] = R.run1 + "/checkpoints";
  targets["the run's final/"] = R.run1 + "/final";
  for (const auto& [what, target] : targets) {
    CAPTURE(what);
    refused(R, {"export", R.run1, "-o", target}, target, {t.path(), R.hfbase, R.run1});
  }
  // An init_from that is itself a dtrain export is refused too: the marker is no licence.
  fs::copy_file(R.base + "/.dtrain-export.json", R.hfbase + "/.dtrain-export.json");
  refused(R, {"export", R.run1, "-o", R.hfbase}, R.hfbase, {R.hfbase});
  fs::remove(R.hfbase + "/.dtrain-export.json");
}

TEST_CASE("export into an empty 0700 or 1777 directory or through a symlink: the directory stays, the link stays") {
  REQUIRE_RUNS(R);
  TempDir t("dtrain-outputs-into");
  for (unsigned mode : {0700u, 01777u}) {
    CAPTURE(mode);
    const std::string d = t.path() + fmt::format("/d{:o}", mode);
    REQUIRE(::mkdir(d.c_str(), 0755) == 0);
    REQUIRE(::chmod(d.c_str(), mode) == 0);
    const Stat before = stat_of(d);
    const RunResult r = R.dtrain({"export", R.run1, "-o", d});
    INFO(r.out);
    REQUIRE(r.rc == 0);
    const Stat after = stat_of(d);
    CHECK(after.mode == mode);
    CHECK(after.ino == before.ino);
    CHECK(names(d) == std::set<std::string>{".dtrain-export.json", "config.json", "model.safetensors"});
  }
  const std::string real = t.path() + "/empty", link = t.path() + "/to-empty";
  fs::create_directory(real);
  fs::create_directory_symlink(real, link);
  const RunResult r = R.dtrain({"export", R.run1, "-o", link});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(fs::is_symlink(link));
  CHECK(fs::exists(real + "/model.safetensors"));
}

TEST_CASE("an export directory is re-exported in place: its stale shards go, a user's file stays") {
  REQUIRE_RUNS(R);
  TempDir t("dtrain-outputs-again");
  const std::string d = t.path() + "/out";
  RunResult r = R.dtrain({"export", R.run1, "-o", d, "--max-shard-size", "20000", "--dtype", "fp32"});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  std::set<std::string> first = names(d);
  REQUIRE(first.count("model.safetensors.index.json") == 1);
  REQUIRE(first.count("model.safetensors") == 0);
  std::ofstream(d + "/README.md") << "my model card\n";
  const Stat before = stat_of(d);
  r = R.dtrain({"export", R.run1, "-o", d});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(names(d) == std::set<std::string>{".dtrain-export.json", "README.md", "config.json", "model.safetensors"});
  CHECK(read_text(d + "/README.md") == "my model card\n");
  CHECK(stat_of(d).ino == before.ino);
  // The marker lists what this export wrote.
  const std::string marker = read_text(d + "/.dtrain-export.json");
  CHECK(contains(marker, "\"model.safetensors\""));
  CHECK_FALSE(contains(marker, "index"));
  CHECK_FALSE(contains(marker, "README"));
}

TEST_CASE("plot never replaces the run's files or a user's file without --force (item 7)") {
  REQUIRE_RUNS(R);
  TempDir t("dtrain-outputs-plot");
  auto targets = file_targets(R, t.path());
  targets["the run's metrics"] = R.run1 + "/metrics.jsonl";
  targets["the run's config"] = R.run1 + "/config.yaml";
  targets["the run directory"] = R.run1;
  for (const auto& [what, target] : targets) {
    CAPTURE(what);
    refused(R, {"plot", R.run1, "-o", target}, target, {t.path(), R.run1, R.hfbase});
  }
  // --force: a user's file is replaced, the run's own files never are.
  refused(R, {"plot", R.run1, "-o", R.run1 + "/metrics.jsonl", "--force"}, R.run1 + "/metrics.jsonl", {R.run1});
  RunResult r = R.dtrain({"plot", R.run1, "-o", targets["a regular file"], "--force"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(read_text(targets["a regular file"]).rfind("\x89PNG", 0) == 0);
  // A plot replaces its own earlier plot; a symlink to a file is written through.
  const std::string png = t.path() + "/loss.png", link = t.path() + "/loss-link.png";
  REQUIRE(R.dtrain({"plot", R.run1, "-o", png}).rc == 0);
  fs::create_symlink(png, link);
  const Stat before = stat_of(png);
  ::chmod(png.c_str(), 0600);
  r = R.dtrain({"plot", R.run1, "-o", link, "--width", "500"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(fs::is_symlink(link));
  CHECK(stat_of(png).ino != before.ino);  // replaced by a rename: never half-written
  CHECK(stat_of(png).mode == 0600u);      // with the old file's mode
}

TEST_CASE("data prepare never replaces dataset_info.json, the tokenizer's files or a user's file (items 5, 6)") {
  REQUIRE_RUNS(R);
  TempDir t("dtrain-outputs-prepare");
  const std::string ds = t.path() + "/ds", tok = t.path() + "/tok";
  fs::create_directories(ds);
  fs::create_directories(tok);
  fs::copy_file(shipped_data_dir() + "/train.jsonl", ds + "/a.jsonl");
  std::ofstream(ds + "/dataset_info.json") << R"({"a": {"file_name": "a.jsonl", "formatting": "alpaca"}})"
                                           << "\n";
  std::ofstream(tok + "/tokenizer.json") << "{}\n";
  std::ofstream(tok + "/tokenizer_config.json") << "{}\n";
  std::ofstream(tok + "/chat_template.jinja") << "{{ messages }}\n";
  const std::string input = ds + "/a.jsonl";
  refused(R, {"data", "prepare", ds, ds + "/dataset_info.json", "--dataset", "a"}, ds + "/dataset_info.json", {ds});
  refused(R, {"data", "prepare", ds, ds + "/dataset_info.json", "--dataset", "a", "--force"}, ds + "/dataset_info.json",
          {ds});
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    CAPTURE(f);
    refused(R,
            {"data", "prepare", input, tok + "/" + f, "--format", "alpaca", "--tokenizer", tok + "/tokenizer.json",
             "--template", "auto", "--force"},
            tok + "/" + f, {tok, ds});
  }
  for (const auto& [what, target] : file_targets(R, t.path() + "/user")) {
    CAPTURE(what);
    refused(R, {"data", "prepare", input, target, "--format", "alpaca"}, target, {t.path() + "/user", ds, R.hfbase});
  }
  // A shard replaces an earlier shard; --force a user's file; a symlink is written through.
  const std::string shard = t.path() + "/a.bin", link = t.path() + "/a-link.bin";
  REQUIRE(R.dtrain({"data", "prepare", input, shard, "--format", "alpaca"}).rc == 0);
  fs::create_symlink(shard, link);
  RunResult r = R.dtrain({"data", "prepare", input, link, "--format", "alpaca"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(fs::is_symlink(link));
  CHECK(read_text(shard).rfind("DTRAINTK", 0) == 0);
  r = R.dtrain({"data", "prepare", input, t.path() + "/user/notes.txt", "--format", "alpaca", "--force"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(read_text(t.path() + "/user/notes.txt").rfind("DTRAINTK", 0) == 0);
}

namespace {
std::vector<std::string> bench_args(const std::string& run_dir, const std::string& json) {
  return {"bench",
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
          run_dir,
          "-b",
          "1K",
          "-e",
          "1K",
          "--json",
          json};
}
}  // namespace

TEST_CASE("bench --json: a user's file or a directory refused before the bench runs; /dev/full is not retried") {
  REQUIRE_RUNS(R);
  TempDir t("dtrain-outputs-bench");
  int k = 0;
  for (const auto& [what, target] : file_targets(R, t.path() + "/user")) {
    CAPTURE(what);
    auto args = bench_args(t.path() + fmt::format("/run{}", k++), target);
    refused(R, args, target, {t.path() + "/user", R.hfbase});
  }
  // The default max_retries (3): a --json file that cannot take the results ends the job
  // after its one round, exit 2, the results printed above.
  const RunResult r = R.dtrain(bench_args(t.path() + "/full", "/dev/full"));
  INFO(r.out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "cannot write --json file /dev/full: No space left on device"));
  CHECK(contains(r.out, "not restarting"));
  CHECK_FALSE(contains(r.out, "round 1"));
  // A report replaces an earlier report; --force a user's file.
  const std::string report = t.path() + "/report.json";
  REQUIRE(R.dtrain(bench_args(t.path() + "/r1", report)).rc == 0);
  CHECK(R.dtrain(bench_args(t.path() + "/r2", report)).rc == 0);
  auto forced = bench_args(t.path() + "/r3", t.path() + "/user/notes.txt");
  forced.push_back("--force");
  CHECK(R.dtrain(forced).rc == 0);
  CHECK(contains(read_text(t.path() + "/user/notes.txt"), "\"rows\""));
}

TEST_CASE("bench --json on a full file system leaves no empty file (item 20)") {
  REQUIRE_RUNS(R);
  if (::geteuid() != 0) return ::dtrain::test::skip_test("cannot mount a tmpfs (not root): skipping");
  TempDir t("dtrain-outputs-tmpfs");
  const std::string mnt = t.path() + "/mnt";
  fs::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=64k") != 0)
    return ::dtrain::test::skip_test("cannot mount a tmpfs: skipping");
  struct Unmount {
    std::string d;
    ~Unmount() { ::umount2(d.c_str(), MNT_DETACH); }
  } unmount{mnt};
  {  // fill it
    std::ofstream f(mnt + "/filler", std::ios::binary);
    const std::string block(4096, '\0');
    for (int i = 0; i < 64 && f; ++i) f << block;
  }
  const RunResult r = R.dtrain(bench_args(t.path() + "/run", mnt + "/out.json"));
  INFO(r.out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "cannot write --json file " + mnt + "/out.json"));
  CHECK_FALSE(fs::exists(mnt + "/out.json"));
  CHECK(names(mnt) == std::set<std::string>{"filler"});
}

TEST_CASE(
    "launch --output-dir: the run's init_from, a user's directory or file refused; an empty 1777 directory kept") {
  REQUIRE_RUNS(R);
  TempDir t("dtrain-outputs-launch");
  auto targets = user_targets(t.path());
  targets["a model directory (init_from)"] = R.hfbase;
  targets["the config file"] = R.config;
  for (const auto& [what, target] : targets) {
    CAPTURE(what);
    refused(R,
            {"launch", "--config", R.config, "--output-dir", target, "--master-port", "0", "--set",
             "model.init_from=" + R.hfbase},
            target, {t.path(), R.hfbase, R.config});
  }
  const std::string d = t.path() + "/shared";
  REQUIRE(::mkdir(d.c_str(), 0755) == 0);
  REQUIRE(::chmod(d.c_str(), 01777) == 0);
  const Stat before = stat_of(d);
  const RunResult r = R.dtrain({"launch", "--config", R.config, "--output-dir", d, "--master-port", "0"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(stat_of(d).mode == before.mode);
  CHECK(stat_of(d).ino == before.ino);
}
