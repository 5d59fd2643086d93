// Reading the run directory's JSON-lines files (metrics.jsonl, events.jsonl) for plots
// and status, tolerant of a last line that is being written or was cut by a crash.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace dtrain::report {

/// Every line of path that parses as a JSON object; partial or broken lines are
/// skipped; a missing file gives an empty list.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path);

/// Every line of path as a JSON object, for files whose writer appends whole lines
/// (events.jsonl): a complete line that is not a JSON object is corruption, an IoError
/// naming path:line and showing the line. Only a last line without its newline (being
/// written, or cut by a crash) is skipped, unless it holds a NUL byte or runs past 1 MiB
/// (damage, not a line being written). Each of string_keys must be present in every line
/// and be a string, else the same IoError; each of integer_keys, where present and not
/// null, must be an integer (a "round" of "x" is damage, not round 0). A missing file gives
/// an empty list.
std::vector<nlohmann::json> read_jsonl_strict(const std::filesystem::path& path,
                                              const std::vector<std::string>& string_keys = {},
                                              const std::vector<std::string>& integer_keys = {});

}  // namespace dtrain::report
