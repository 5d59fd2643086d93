// metrics.jsonl: records parse back, append continues a file (and repairs a partial
// last line), bad input errors; StepTimer sums per section on an injected clock.
#include "temp_dir.h"
#include "train/metrics.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace dtrain;
using namespace dtrain::train;
namespace fs = std::filesystem;

namespace {

using dtrain::test::file_bytes;
using dtrain::test::TempDir;

}  // namespace

TEST_CASE("records are one JSON object per line and parse back") {
  TempDir dir;
  const std::string path = (dir.path / "metrics.jsonl").string();
  {
    MetricsWriter w(path, false);
    w.write({{"step", 1}, {"loss", 2.5}, {"lr", 1e-4}});
    w.write({{"step", 2}, {"loss", 2.25}, {"note", "line\nbreak \"quoted\""}});
    // Flushed per record: visible before the writer closes.
    const auto recs = metrics_read(path);
    REQUIRE(recs.size() == 2);
    CHECK(recs[0]["step"] == 1);
    CHECK(recs[1]["note"] == "line\nbreak \"quoted\"");
  }
  const std::string text = file_bytes(path);
  CHECK(std::count(text.begin(), text.end(), '\n') == 2);
  CHECK(text.back() == '\n');
  CHECK_THROWS_AS(MetricsWriter(path, false).write(nlohmann::json::array({1, 2})), InternalError);
}

TEST_CASE("append mode continues a file; truncate mode starts over") {
  TempDir dir;
  const std::string path = (dir.path / "metrics.jsonl").string();
  {
    MetricsWriter w(path, false, true);
    w.write({{"step", 1}});
  }
  {
    MetricsWriter w(path, true);
    w.write({{"step", 2}});
  }
  auto recs = metrics_read(path);
  REQUIRE(recs.size() == 2);
  CHECK(recs[1]["step"] == 2);
  { MetricsWriter w(path, false); }
  CHECK(metrics_read(path).empty());
}

TEST_CASE("append drops a partial last record left by a crash") {
  TempDir dir;
  const fs::path path = dir.path / "metrics.jsonl";
  {
    std::ofstream out(path, std::ios::binary);
    out << "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"lo";
  }
  {
    MetricsWriter w(path.string(), true);
    w.write({{"step", 3}});
  }
  const auto recs = metrics_read(path.string());
  REQUIRE(recs.size() == 3);
  CHECK(recs[2]["step"] == 3);
  // A file that is only a partial line is emptied.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << std::string(10000, 'x');
  }
  { MetricsWriter w(path.string(), true); }
  CHECK(fs::file_size(path) == 0);
}

TEST_CASE("metrics errors name the file and line") {
  TempDir dir;
  CHECK_THROWS_AS(MetricsWriter((dir.path / "missing" / "m.jsonl").string(), false), IoError);
  CHECK_THROWS_AS(metrics_read((dir.path / "nope.jsonl").string()), IoError);
  const fs::path path = dir.path / "bad.jsonl";
  {
    std::ofstream out(path);
    out << "{\"a\":1}\n\n[1,2]\n";
  }
  try {
    metrics_read(path.string());
    FAIL("expected IoError");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("bad.jsonl:3") != std::string::npos);
  }
}

TEST_CASE("StepTimer sums sections on an injected clock") {
  double now = 100.0;
  StepTimer t([&] { return now; });
  t.start(Section::FORWARD);
  now += 0.25;
  t.stop(Section::FORWARD);
  {
    auto s = t.scope(Section::BACKWARD);
    now += 0.5;
  }
  t.start(Section::FORWARD);
  now += 0.125;
  t.stop(Section::FORWARD);
  CHECK(t.elapsed_ms(Section::FORWARD) == doctest::Approx(375.0));
  CHECK(t.count(Section::FORWARD) == 2);
  CHECK(t.elapsed_ms(Section::BACKWARD) == doctest::Approx(500.0));
  CHECK(t.elapsed_ms(Section::COMM) == 0.0);
  const nlohmann::json j = t.to_json();
  CHECK(j.size() == kSectionCount);
  CHECK(j["forward_ms"].get<double>() == doctest::Approx(375.0));
  CHECK(j.contains("checkpoint_ms"));
  CHECK_THROWS_AS(t.stop(Section::DATA), InternalError);
  t.start(Section::DATA);
  CHECK_THROWS_AS(t.start(Section::DATA), InternalError);
  t.reset();
  CHECK(t.elapsed_ms(Section::FORWARD) == 0.0);
  CHECK_FALSE(t.running(Section::DATA));
  {
    auto s = t.scope(Section::OPTIMIZER);
    t.reset();  // the scope's destructor must not throw
  }
  CHECK(std::string(section_name(Section::CHECKPOINT)) == "checkpoint");
  Stopwatch sw;
  CHECK(sw.elapsed_s() >= 0.0);
}
