// Writing a run directory's per-rank resource files (RUN_DIR/resources/rank<R>.jsonl) the
// way lib/monitor does, for the report tests that read them back.
#pragma once

#include "temp_dir.h"

#include <filesystem>
#include <fstream>
#include <string>

namespace dtrain::test {

inline void append_line(const std::filesystem::path& p, const std::string& line) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::app) << line << "\n";
}

inline std::filesystem::path rank_file(const TempDir& d, int rank) {
  return d.path / "resources" / ("rank" + std::to_string(rank) + ".jsonl");
}

}  // namespace dtrain::test
