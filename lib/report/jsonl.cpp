// JSON-lines reading shared by plot and status.
#include "report/jsonl.h"

#include "core/check.h"

#include <fstream>
#include <sstream>
#include <string>

namespace dtrain::report {

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

std::vector<nlohmann::json> read_jsonl_strict(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  size_t pos = 0;
  for (int line_no = 1; pos < text.size(); ++line_no) {
    const size_t end = text.find('\n', pos);
    if (end == std::string::npos) break;  // the last line, still being written
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::string shown = line.substr(0, 120);
      for (char& c : shown)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
      DT_THROW(IoError, "{}:{}: corrupt line \"{}{}\": not a JSON object; the file was damaged (edited, or written by "
               "something else)", path.string(), line_no, shown, line.size() > 120 ? "..." : "");
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace dtrain::report
