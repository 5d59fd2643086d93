// What `dtrain data prepare INPUT OUTPUT` may replace, through the real binary (issue 33,
// items 4 and 23): an OUTPUT that is a directory is refused with no OUTPUT.tmp left
// beside it (checked on an intact input of its own), and an OUTPUT that exists but is not
// a regular file (a FIFO; a device node, made in the test's own directory, under root) is
// refused and stays what it was: the shard's rename would otherwise replace it, which for
// `data prepare X.jsonl /dev/null` is the system's /dev/null.
#include "cli_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kUsage = 2;

struct Input {
  TempDir tmp{"dtrain-prepare-out"};
  std::string x = tmp.path() + "/X.jsonl";
  std::string before;
  Input() {
    fs::copy_file(shipped_data_dir() + "/valid.jsonl", x);
    before = read_text(x);
  }
};

}  // namespace

TEST_CASE("data prepare into a directory is refused and leaves no OUTPUT.tmp") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  Input in;
  REQUIRE(!in.before.empty());
  const std::string dir = in.tmp.path() + "/shards";
  fs::create_directories(dir);
  RunResult r = run({bin, "data", "prepare", in.x, dir, "--format", "alpaca"}, {}, 60s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "is a directory"));
  CHECK(!fs::exists(dir + ".tmp"));
  CHECK(fs::is_directory(dir));
  CHECK(fs::is_empty(dir));
  CHECK(read_text(in.x) == in.before);
}

TEST_CASE("data prepare onto an existing FIFO or device node is refused; the node stays") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  Input in;
  std::vector<std::pair<std::string, mode_t>> nodes;
  const std::string fifo = in.tmp.path() + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  nodes.emplace_back(fifo, S_IFIFO);
  // A character device like /dev/null (1, 3), in the test's own directory: root only.
  const std::string null_dev = in.tmp.path() + "/null";
  if (::mknod(null_dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) nodes.emplace_back(null_dev, S_IFCHR);
  else MESSAGE("cannot mknod (not root?): the device node case is skipped");
  // A symlink to the device node is the node too.
  if (nodes.size() == 2) {
    fs::create_symlink(null_dev, in.tmp.path() + "/null-link");
    nodes.emplace_back(in.tmp.path() + "/null-link", S_IFCHR);
  }
  for (const auto& [path, type] : nodes) {
    CAPTURE(path);
    RunResult r = run({bin, "data", "prepare", in.x, path, "--format", "alpaca"}, {}, 60s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kUsage);
    CHECK(contains(r.out, "is not a regular file"));
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & S_IFMT) == type);
    CHECK(!fs::exists(path + ".tmp"));
  }
  CHECK(read_text(in.x) == in.before);
  // A regular file that is not a shard is replaced only with --force (issue 43's output
  // rule; tests/cli/outputs_test.cpp has the refusals).
  const std::string out = in.tmp.path() + "/x.bin";
  std::ofstream(out) << "old shard\n";
  RunResult r = run({bin, "data", "prepare", in.x, out, "--format", "alpaca", "--force"}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(read_text(out) != "old shard\n");
  CHECK(!fs::exists(out + ".tmp"));
}
