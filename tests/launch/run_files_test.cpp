// The launcher's run directory writes on a "full disk" (/dev/full: every write fails with
// ENOSPC, no root needed): RunFiles reports and survives, keeps events that did not fit
// and writes them in order once the file takes them; run_dir_remove_partial_checkpoints
// removes only tmp-step<digits>/ and latest.tmp.
#include "temp_dir.h"
#include "launch/run_dir.h"
#include "launch/run_files.h"

#include "core/error.h"
#include "skip.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::launch;

namespace {

using dtrain::test::TempDir;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "event round," per line of events.jsonl: every line must be a whole JSON record.
std::string event_lines(const fs::path& p) {
  std::istringstream in(read_text(p));
  std::string out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out += j.at("event").get<std::string>() + " " + std::to_string(j.at("round").get<int>()) + ",";
  }
  return out;
}

bool have_dev_full() { return ::access("/dev/full", W_OK) == 0; }

}  // namespace

TEST_CASE("RunFiles: events that cannot be written are kept and written in order once the file takes them") {
  if (!have_dev_full()) {
    ::dtrain::test::skip_test("skipped: no writable /dev/full");
    return;
  }
  TempDir d;
  const fs::path events = d.path / "events.jsonl";
  fs::create_symlink("/dev/full", events);  // every write: ENOSPC
  RunFiles files(d.path.string());
  CHECK_FALSE(files.event({.kind = report::EventKind::ROUND_START, .round = 0}));
  CHECK_FALSE(files.event({.kind = report::EventKind::FAILURE, .round = 0}));
  CHECK(files.events_pending() == 2);
  const std::string failing = files.failing();
  CHECK(failing.find(events.string()) != std::string::npos);
  CHECK(failing.find("No space left on device") != std::string::npos);
  CHECK_FALSE(files.flush_events());

  fs::remove(events);  // space again: the next write creates a regular file
  CHECK(files.event({.kind = report::EventKind::ROUND_START, .round = 1}));
  CHECK(files.events_pending() == 0);
  CHECK(files.failing().empty());
  CHECK(event_lines(events) == "round_start 0,failure 0,round_start 1,");
}

TEST_CASE("RunFiles: a failing append or replace is reported, not thrown; the file works again later") {
  if (!have_dev_full()) {
    ::dtrain::test::skip_test("skipped: no writable /dev/full");
    return;
  }
  TempDir d;
  RunFiles files(d.path.string());
  const fs::path log = d.path / "rank0.log";
  fs::create_symlink("/dev/full", log);
  CHECK_FALSE(files.append(log.string(), "line 1\n"));
  CHECK_FALSE(files.append(log.string(), "line 2\n"));
  CHECK(files.failing().find(log.string() + ": No space left on device") != std::string::npos);
  fs::remove(log);
  CHECK(files.append(log.string(), "line 3\n"));
  CHECK(read_text(log) == "line 3\n");
  CHECK(files.failing().empty());

  const std::string nodes = (d.path / "nodes.json").string();
  CHECK_FALSE(files.attempt(nodes, [] { throw IoError("cannot write nodes.json.tmp: No space left on device"); }));
  CHECK(files.failing().find("No space left on device") != std::string::npos);
  CHECK(files.attempt(nodes, [] {}));
  CHECK(files.failing().empty());
}

TEST_CASE("run_dir_remove_partial_checkpoints: only dtrain's tmp-step<k>/ directories and latest.tmp") {
  TempDir d;
  const fs::path ck = d.path / "checkpoints";
  for (const char* dir : {"tmp-step10", "tmp-step0", "tmp-step", "tmp-stepx", "tmp-step5.bak", "tmp-mine", "step5"})
    fs::create_directories(ck / dir);
  std::ofstream(ck / "tmp-step10" / "rank0.bin") << "partial";
  std::ofstream(ck / "tmp-step7") << "a user's file, named like ours";
  std::ofstream(ck / "latest.tmp") << "step10";
  std::ofstream(ck / "latest") << "step5";
  TempDir elsewhere;
  fs::create_directories(elsewhere.path / "data");
  fs::create_directory_symlink(elsewhere.path / "data", ck / "tmp-step11");

  auto removed = run_dir_remove_partial_checkpoints(d.path.string());
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{(ck / "latest.tmp").string(), (ck / "tmp-step0").string(),
                                            (ck / "tmp-step10").string()});
  for (const char* kept :
       {"tmp-step", "tmp-stepx", "tmp-step5.bak", "tmp-mine", "step5", "tmp-step7", "latest", "tmp-step11"})
    CHECK_MESSAGE(fs::exists(fs::symlink_status(ck / kept)), kept);
  CHECK(fs::is_directory(elsewhere.path / "data"));
  CHECK(run_dir_remove_partial_checkpoints((d.path / "missing").string()).empty());
}

TEST_CASE("run_dir_partial_checkpoint_name") {
  CHECK(run_dir_partial_checkpoint_name("tmp-step0"));
  CHECK(run_dir_partial_checkpoint_name("tmp-step120"));
  CHECK_FALSE(run_dir_partial_checkpoint_name("tmp-step"));
  CHECK_FALSE(run_dir_partial_checkpoint_name("tmp-step12a"));
  CHECK_FALSE(run_dir_partial_checkpoint_name("step12"));
  CHECK_FALSE(run_dir_partial_checkpoint_name("tmp-mine"));
}

TEST_CASE("RunFiles: an event record a killed launcher left without its newline is cut before the next one") {
  TempDir d;
  const fs::path events = d.path / "events.jsonl";
  std::ofstream(events, std::ios::binary) << "{\"event\":\"round_start\",\"round\":0}\n{\"event\":\"fail";
  RunFiles files(d.path.string());
  CHECK(files.event({.kind = report::EventKind::ROUND_START, .round = 1}));
  CHECK(event_lines(events) == "round_start 0,round_start 1,");
  // A file that ends with its newline is left as it is.
  RunFiles again(d.path.string());
  CHECK(again.event({.kind = report::EventKind::FINISHED, .round = 1}));
  CHECK(event_lines(events) == "round_start 0,round_start 1,finished 1,");
}
