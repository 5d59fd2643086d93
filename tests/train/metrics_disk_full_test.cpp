// metrics.jsonl on a full disk (issue 33, item 14), at the module: the binary cannot
// fill the run directory's disk for metrics.jsonl alone without failing its checkpoints
// first. On a tmpfs with one page left, MetricsWriter::write returns false instead of
// throwing, the file keeps only whole lines (a record cut at the page's end is cut
// back), and once space is freed the records are written again. Skipped when a tmpfs
// cannot be mounted (not root).
#include "train/metrics.h"

#include "skip.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace dtrain::train;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

uint64_t free_bytes(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

}  // namespace

TEST_CASE("metrics.jsonl on a full disk: no throw, only whole lines, written again once space is back") {
  if (::geteuid() != 0) return dtrain::test::skip_test("not root (mounting a tmpfs needs it): skipping");
  std::string dir = (fs::temp_directory_path() / "dtrain-metrics-full-XXXXXX").string();
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=64k") != 0) {
    ::rmdir(dir.c_str());
    return dtrain::test::skip_test("mount -t tmpfs is not permitted here: skipping");
  }
  struct Unmount {
    std::string d;
    ~Unmount() {
      ::umount2(d.c_str(), MNT_DETACH);
      ::rmdir(d.c_str());
    }
  } unmount{dir};

  // Everything but one page taken.
  const std::string filler = dir + "/filler";
  {
    const uint64_t n = free_bytes(dir) - 4096;
    std::ofstream(filler, std::ios::binary) << std::string(n, 'x');
  }
  REQUIRE(free_bytes(dir) == 4096);

  const std::string path = dir + "/metrics.jsonl";
  MetricsWriter w(path, false);
  int written = 0, failed = 0;
  for (int step = 1; step <= 200; ++step) {
    const bool ok = w.write({{"step", step}, {"loss", 1.0 / step}, {"note", std::string(50, 'n')}});
    if (ok) ++written;
    else ++failed;
  }
  CHECK(written > 10);
  CHECK(failed > 0);
  const std::string text = slurp(path);
  REQUIRE(!text.empty());
  CHECK(text.back() == '\n');  // no torn last record
  CHECK(metrics_read(path).size() == static_cast<size_t>(written));

  // Space comes back: the next record is written whole after the others.
  fs::remove(filler);
  CHECK(w.write({{"step", 201}}));
  const auto records = metrics_read(path);
  REQUIRE(records.size() == static_cast<size_t>(written) + 1);
  CHECK(records.back().at("step") == 201);
}
