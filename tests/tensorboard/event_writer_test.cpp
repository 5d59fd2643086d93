// Event files: the exact bytes of the records (protobuf wire format written out by hand
// from TensorFlow's field numbers), file names that never reuse or sort before an
// existing file, the log directory rule, and the files read back by the independent
// reader (tfevents_read.py): scalars, SessionLog START purging, and a flipped byte or a
// torn last record caught.
#include "temp_dir.h"
#include "tensorboard/event_writer.h"
#include "tensorboard/record.h"

#include "core/error.h"
#include "tfevents_reader.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace dtrain::tensorboard;
using dtrain::test::tfevents_read;
using dtrain::test::tfevents_steps;
namespace fs = std::filesystem;

namespace {

using dtrain::test::file_bytes;
using dtrain::test::TempDir;

void spit(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Hand-encoded wire format: key = field << 3 | wire type.
std::string f64(double v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}
std::string f32(float v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}
std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

}  // namespace

TEST_CASE("event_file_name and log_dir") {
  CHECK(event_file_name(1700000000, "node7") == "events.out.tfevents.1700000000.node7");
  CHECK(event_file_name(42, "h") == "events.out.tfevents.0000000042.h");  // TensorFlow's %010lld
  CHECK(log_dir("/runs/a", "tensorboard", "") == "/runs/a/tensorboard");
  CHECK(log_dir("/runs/a", "tb/", "job1") == "/runs/a/tb/job1");
  CHECK(log_dir("/runs/a", "/scratch/tb", "job1") == "/scratch/tb/job1");  // absolute: the run dir is not used
  CHECK(log_dir("/runs/a", "", "") == "/runs/a");
  CHECK(log_dir("/runs/a", "", "j") == "/runs/a/j");
  CHECK(log_dir("runs/a", "../tb", "") == "runs/tb");
}

TEST_CASE("the records' exact bytes") {
  TempDir tmp;
  const fs::path dir = tmp.path / "logs" / "deeper";  // created with its parents
  std::string path;
  {
    EventWriter w(dir.string(), 1.5, "testhost");
    path = w.path();
    CHECK(fs::path(path).filename() == "events.out.tfevents.0000000001.testhost");
    w.scalars(3, {{"train/loss", 0.5}}, 2.0);
    w.session_start(5, 2.0);
  }
  // Event{wall_time(1) = 1.5, file_version(3) = "brain.Event:2"}
  const std::string first = "\x09" + f64(1.5) + "\x1a\x0d" + "brain.Event:2";
  // Event{wall_time = 2, step(2) = 3, summary(5) = Summary{value(1) = Value{tag(1) = "train/loss",
  // simple_value(2) = 0.5f}}}: Value is 2 + 10 + 5 = 17 bytes, Summary 2 + 17 = 19.
  const std::string value = "\x0a\x0a" + std::string("train/loss") + "\x15" + f32(0.5f);
  const std::string summary = "\x0a" + bytes({17}) + value;
  const std::string scalar = "\x09" + f64(2.0) + "\x10\x03" + "\x2a" + bytes({19}) + summary;
  // Event{wall_time = 2, step = 5, session_log(7) = SessionLog{status(1) = START (1)}}
  const std::string start = "\x09" + f64(2.0) + "\x10\x05" + "\x3a\x02\x08\x01";
  CHECK(file_bytes(path) == record_frame(first) + record_frame(scalar) + record_frame(start));
}

TEST_CASE("file names never reuse an existing file and sort after every file already there") {
  TempDir tmp;
  const fs::path dir = tmp.path;
  // Another writer's file (a later clock, another host): left exactly as it is.
  spit(dir / "events.out.tfevents.0000000300.other", "foreign bytes");
  std::string a, b, c;
  {
    EventWriter w1(dir.string(), 250.0, "h");  // behind the newest file: moves past it
    a = fs::path(w1.path()).filename().string();
    EventWriter w2(dir.string(), 250.0, "h");  // the same second again
    b = fs::path(w2.path()).filename().string();
  }
  EventWriter w3(dir.string(), 1000.0, "h");  // ahead of everything: its own time
  c = fs::path(w3.path()).filename().string();
  CHECK(a == "events.out.tfevents.0000000301.h");
  CHECK(b == "events.out.tfevents.0000000302.h");
  CHECK(c == "events.out.tfevents.0000001000.h");
  CHECK(file_bytes(dir / "events.out.tfevents.0000000300.other") == "foreign bytes");
  CHECK(names_in(dir) == std::vector<std::string>{"events.out.tfevents.0000000300.other", a, b, c});
}

TEST_CASE("a log directory that cannot be created is an IoError naming it") {
  TempDir tmp;
  spit(tmp.path / "file", "x");
  const std::string dir = (tmp.path / "file" / "tb").string();
  try {
    EventWriter w(dir);
    FAIL("no error for " << dir);
  } catch (const dtrain::IoError& e) {
    CHECK(std::string(e.what()).find(dir) != std::string::npos);
    CHECK(std::string(e.what()).find("tensorboard.output_path") != std::string::npos);
  }
}

TEST_CASE("the independent reader: scalars, restarts, and damaged files") {
  TempDir tmp;
  const fs::path dir = tmp.path / "tb";
  std::string first, second;
  {
    // A first round logs steps 1-4 but its last checkpoint was at step 2 ...
    EventWriter w(dir.string(), 1000.0, "h");
    first = w.path();
    w.session_start(1, 1000.0);
    for (int s = 1; s <= 4; ++s)
      w.scalars(s, {{"train/loss", 4.0 - 0.25 * s}, {"train/grad_norm", s == 2 ? INFINITY : 1.0 / s}}, 1000.0 + s);
    w.scalars(2, {{"eval/loss", 3.3}}, 1002.5);
  }
  {
    // ... so the next round starts at step 3 in a new file and runs to step 5.
    EventWriter w(dir.string(), 1010.0, "h");
    second = w.path();
    w.session_start(3, 1010.0);
    for (int s = 3; s <= 5; ++s) w.scalars(s, {{"train/loss", 10.0 + s}, {"train/grad_norm", 0.125}}, 1010.0 + s);
  }

  SUBCASE("every record checks out; the START at step 3 drops the first round's steps 3 and 4") {
    const auto v = tfevents_read(dir.string());
    INFO(v.output);
    REQUIRE(v.code == 0);
    CHECK(v.result["ok"] == true);
    CHECK(v.result["files"].size() == 2);
    CHECK(v.result["records"] == 2 + 5 + 2 + 3);  // file_version + START + scalars per file
    CHECK(v.result["sessions"] == nlohmann::json::array({1, 3}));
    CHECK(v.result["purged"] == 4);  // steps 3 and 4 of two tags
    CHECK(tfevents_steps(v, "train/loss") == std::vector<int64_t>{1, 2, 3, 4, 5});
    CHECK(tfevents_steps(v, "eval/loss") == std::vector<int64_t>{2});
    const auto& loss = v.result["scalars"]["train/loss"];
    CHECK(loss[0][1].get<double>() == 3.75);
    CHECK(loss[2][1].get<double>() == 13.0);    // the second round's step 3
    CHECK(loss[2][2].get<double>() == 1013.0);  // its wall_time
    CHECK(v.result["scalars"]["train/grad_norm"][1][1] == "inf");
    CHECK(v.result["scalars"]["eval/loss"][0][1].get<double>() == static_cast<double>(3.3f));  // float32
  }

  SUBCASE("a flipped data byte is a data checksum error naming the file") {
    std::string b = file_bytes(second);
    b[b.size() - 10] ^= 0x01;  // inside the last record's Event
    spit(second, b);
    const auto v = tfevents_read(dir.string());
    CHECK(v.code == 1);
    CHECK(v.result["ok"] == false);
    const std::string err = v.result["error"].get<std::string>();
    CHECK(err.find("data checksum mismatch") != std::string::npos);
    CHECK(err.find(fs::path(second).filename().string()) != std::string::npos);
  }

  SUBCASE("a flipped length byte is a length checksum error") {
    std::string b = file_bytes(first);
    b[0] ^= 0x40;
    spit(first, b);
    const auto v = tfevents_read(dir.string());
    CHECK(v.code == 1);
    CHECK(v.result["error"].get<std::string>().find("record 0 at offset 0: length checksum mismatch") !=
          std::string::npos);
  }

  SUBCASE("a torn last record: an error, or with --allow-torn-tail every complete record") {
    std::string b = file_bytes(second);
    b.resize(b.size() - 3);  // a killed writer: the last record (step 5) cut short
    spit(second, b);
    const auto strict = tfevents_read(dir.string());
    CHECK(strict.code == 1);
    CHECK(strict.result["error"].get<std::string>().find("truncated") != std::string::npos);
    const auto lenient = tfevents_read(dir.string(), "", true);
    INFO(lenient.output);
    REQUIRE(lenient.code == 0);
    CHECK(tfevents_steps(lenient, "train/loss") == std::vector<int64_t>{1, 2, 3, 4});
    CHECK(lenient.result["torn_tail"].size() == 1);
  }
}
