// JSON-lines reading shared by plot and status.
#include "report/jsonl.h"

#include "core/check.h"
#include "core/input_file.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace dtrain::report {

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  // The input rule: a FIFO, a device or a link loop in its place reads as no records,
  // never blocking (the strict reader below names it).
  std::string why;
  InputFile f = input_file_try_open(path.string(), kInputAnySize, &why);
  if (!why.empty()) return out;
  std::istringstream in(f.read_all("run directory file", kInputAnySize));
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

namespace {

// A line as an error message can show it: printable, at most 120 characters.
std::string line_shown(const std::string& line) {
  std::string shown = line.substr(0, 120);
  for (char& c : shown)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return shown + (line.size() > 120 ? "..." : "");
}

}  // namespace

std::vector<nlohmann::json> read_jsonl_strict(const std::filesystem::path& path,
                                              const std::vector<std::string>& string_keys,
                                              const std::vector<std::string>& integer_keys) {
  std::vector<nlohmann::json> out;
  std::string why;
  InputFile f = input_file_try_open(path.string(), kInputAnySize, &why);
  if (why == "does not exist") return out;
  DT_ENFORCE(why.empty(), IoError,
             "{} {}: the run directory was changed by something else (dtrain writes a regular file there)",
             path.string(), why);
  const std::string text = f.read_all("run directory file", kInputAnySize);
  size_t pos = 0;
  for (int line_no = 1; pos < text.size(); ++line_no) {
    const size_t end = text.find('\n', pos);
    if (end == std::string::npos) {
      // The last line, still being written, is skipped; but a writer of JSON lines never
      // writes a NUL byte, nor a megabyte without a newline: that tail is damage (a file
      // of zeros after a crash, or another program's output).
      const std::string tail = text.substr(pos, std::min<size_t>(text.size() - pos, 200));
      if (text.find('\0', pos) != std::string::npos || text.size() - pos > (1u << 20))
        DT_THROW(IoError,
                 "{}:{}: corrupt line \"{}\" ({} bytes without a newline{}): the file was damaged (a crash "
                 "on some file systems leaves zeros, or something else wrote it)",
                 path.string(), line_no, line_shown(tail), text.size() - pos,
                 text.find('\0', pos) != std::string::npos ? ", with NUL bytes" : "");
      break;
    }
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      DT_THROW(IoError,
               "{}:{}: corrupt line \"{}\": not a JSON object; the file was damaged (edited, or written by "
               "something else)",
               path.string(), line_no, line_shown(line));
    for (const std::string& k : string_keys) {
      auto it = j.find(k);
      DT_ENFORCE(it != j.end() && it->is_string(), IoError,
                 "{}:{}: corrupt line \"{}\": its \"{}\" field is {}, not a string; the file was damaged (edited, or "
                 "written by something else)",
                 path.string(), line_no, line_shown(line), k, it == j.end() ? std::string("missing") : it->dump());
    }
    for (const std::string& k : integer_keys) {
      auto it = j.find(k);
      DT_ENFORCE(it == j.end() || it->is_null() || it->is_number_integer() || it->is_number_unsigned(), IoError,
                 "{}:{}: corrupt line \"{}\": its \"{}\" field is {}, not an integer; the file was damaged (edited, "
                 "or written by something else)",
                 path.string(), line_no, line_shown(line), k, it->dump());
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace dtrain::report
