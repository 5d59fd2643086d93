// `dtrain data prepare` through the real binary, streaming: a JSONL of many chunks
// (--chunk-mb) on 1 and 2 threads gives the same shard; LLaMA-Factory datasets
// (--dataset, --template) prepare into a shard with a mask; a malformed record deep in the
// file is exit 2 naming the file and line, with no OUTPUT.tmp and an earlier OUTPUT kept;
// an output disk that fills up midway is an error saying so, with every block given back.
#include "cli_harness.h"
#include "skip.h"

#include <cerrno>
#include <cstring>

#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kUsage = 2;

// n alpaca records, one per line.
std::string alpaca_lines(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s += "{\"instruction\": \"add " + std::to_string(i) + " and " + std::to_string(i * 7 % 13) +
         "\", \"input\": \"\", \"output\": \"" + std::to_string(i + i * 7 % 13) + "\"}\n";
  return s;
}

}  // namespace

TEST_CASE("data prepare: --threads 1 and 2 in many chunks write the same shard; LLaMA-Factory --dataset works") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp{"dtrain-prepare-stream"};
  const std::string in = tmp.path() + "/in.jsonl";
  std::ofstream(in) << alpaca_lines(3000);
  std::string first;
  for (const char* threads : {"1", "2"}) {
    CAPTURE(threads);
    const std::string out = tmp.path() + "/out" + threads + ".bin";
    RunResult r = run({bin, "data", "prepare", in, out, "--format", "alpaca", "--threads", threads, "--chunk-mb",
                       "0.004", "--template", "chatml"},
                      {}, 60s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(contains(r.out, "3000 documents"));
    CHECK(contains(r.out, std::string(threads) + " threads)"));
    if (first.empty()) first = read_text(out);
    else CHECK(read_text(out) == first);
  }
  REQUIRE(first.size() > 64);

  // LLaMA-Factory: a dataset_dir with an alpaca .jsonl and a sharegpt .json.
  const std::string dir = tmp.path() + "/lf";
  fs::create_directories(dir);
  std::ofstream(dir + "/dataset_info.json")
      << R"({"a": {"file_name": "a.jsonl"}, "s": {"file_name": "s.json", "formatting": "sharegpt"}})";
  std::ofstream(dir + "/a.jsonl") << alpaca_lines(50);
  std::ofstream(dir + "/s.json")
      << R"([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}])";
  RunResult r = run({bin, "data", "prepare", dir, tmp.path() + "/lf.bin", "--dataset", "a,s", "--template", "chatml",
                     "--threads", "2"},
                    {}, 60s);
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "51 documents"));
  CHECK(contains(r.out, "[a,s]"));
  CHECK(fs::exists(tmp.path() + "/lf.bin"));
}

TEST_CASE("data prepare: a malformed record deep in a many-chunk JSONL is exit 2 with its line; OUTPUT kept") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp{"dtrain-prepare-stream-bad"};
  const std::string in = tmp.path() + "/bad.jsonl";
  std::ofstream(in) << alpaca_lines(1999) << "{\"instruction\": \"no output\", \"outptu\": \"x\"}\n"
                    << alpaca_lines(500);
  const std::string out = tmp.path() + "/out.bin";
  std::ofstream(out) << "DTRAINTK (an earlier shard)";  // its magic: a shard the prepare may replace
  RunResult r =
      run({bin, "data", "prepare", in, out, "--format", "alpaca", "--threads", "2", "--chunk-mb", "0.004"}, {}, 60s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, in + ":2000: missing \"output\""));
  CHECK(read_text(out) == "DTRAINTK (an earlier shard)");
  CHECK(!fs::exists(out + ".tmp"));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 2);  // bad.jsonl and out.bin: no temporary file left
}

TEST_CASE("data prepare onto a disk that fills up midway: an error saying so, no OUTPUT.tmp, the space given back") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  if (::geteuid() != 0) return ::dtrain::test::skip_test("not root (mounting a tmpfs needs it): skipping");
  TempDir tmp{"dtrain-prepare-stream-full"};
  const std::string in = tmp.path() + "/in.jsonl";
  std::ofstream(in) << alpaca_lines(20000);  // ~1.3 MB: a shard of ~3 MB with the mask
  const std::string disk = tmp.path() + "/disk";
  fs::create_directories(disk);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=512k,mode=0755") != 0)
    return ::dtrain::test::skip_test(std::string("cannot mount a tmpfs here: ") + std::strerror(errno));
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{disk};
  auto free_bytes = [&] {
    struct statvfs st {};
    REQUIRE(::statvfs(disk.c_str(), &st) == 0);
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  };
  const uint64_t before = free_bytes();
  RunResult r =
      run({bin, "data", "prepare", in, disk + "/out.bin", "--format", "alpaca", "--threads", "2", "--chunk-mb", "0.1"},
          {}, 60s);
  INFO("exit code " << r.rc << " after " << r.seconds << " s; output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc != 0);
  CHECK(contains(r.out, "disk full"));
  CHECK(fs::is_empty(disk));
  CHECK(free_bytes() == before);
}
