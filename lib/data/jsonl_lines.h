// The non-blank lines of a JSON-lines text with their 1-based numbers (a trailing \r
// dropped): the one line splitter of the SFT and the preference-pair readers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dtrain::data {

template <typename F>
void jsonl_lines(const std::string& text, F&& each) {
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    each(line, line_no);
  }
}

}  // namespace dtrain::data
