// Reading the run directory's JSON-lines files (metrics.jsonl, events.jsonl) for plots
// and status, tolerant of a last line that is being written or was cut by a crash.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <vector>

namespace dtrain::report {

/// Every line of path that parses as a JSON object; partial or broken lines are
/// skipped; a missing file gives an empty list.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path);

}  // namespace dtrain::report
