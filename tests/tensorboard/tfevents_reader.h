// Runs the independent event-file reader (tests/tensorboard/tfevents_read.py: its own
// TFRecord parser, CRC32C and protobuf decoding, no code shared with the writer) on a log
// directory and returns its verdict, for the TensorBoard tests.
#pragma once

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace dtrain::test {

struct TfeventsVerdict {
  int code = -1;          ///< 0 = ok, 1 = a format, checksum or metrics mismatch error
  nlohmann::json result;  ///< the reader's JSON object ({"ok": ..., "error": ... | "scalars": ...})
  std::string output;     ///< everything it printed
};

/// The reader script, absolute: under $DTRAIN_SOURCE_DIR (set by ctest), else under the
/// current directory (ctest runs tests from the repository root).
inline std::string tfevents_reader_path() {
  const char* src = std::getenv("DTRAIN_SOURCE_DIR");
  const std::filesystem::path root = src && *src ? std::filesystem::path(src) : std::filesystem::current_path();
  return std::filesystem::absolute(root / "tests" / "tensorboard" / "tfevents_read.py").string();
}

inline std::string quoted(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

/// python3 tfevents_read.py logdir [--metrics metrics_jsonl] [--allow-torn-tail]; the
/// last line of its output is its JSON verdict.
inline TfeventsVerdict tfevents_read(const std::string& logdir, const std::string& metrics_jsonl = "",
                                     bool allow_torn_tail = false) {
  TfeventsVerdict v;
  std::string cmd = "timeout 60 python3 " + quoted(tfevents_reader_path()) + " " + quoted(logdir);
  if (!metrics_jsonl.empty()) cmd += " --metrics " + quoted(metrics_jsonl);
  if (allow_torn_tail) cmd += " --allow-torn-tail";
  cmd += " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE_MESSAGE(p != nullptr, "cannot run " << cmd);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) v.output.append(buf, n);
  const int st = ::pclose(p);
  v.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::string last = v.output;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  v.result = nlohmann::json::parse(last, nullptr, false);
  REQUIRE_MESSAGE(v.result.is_object(), "the reader printed no JSON verdict (exit " << v.code << "):\n" << v.output);
  return v;
}

/// The steps of one tag's points in a verdict.
inline std::vector<int64_t> tfevents_steps(const TfeventsVerdict& v, const std::string& tag) {
  std::vector<int64_t> out;
  if (v.result.contains("scalars") && v.result["scalars"].contains(tag))
    for (const auto& p : v.result["scalars"][tag]) out.push_back(p[0].get<int64_t>());
  return out;
}

}  // namespace dtrain::test
