// C-style escaping: one byte at a time, printable ASCII kept as it is.
#include "core/c_escape.h"

#include <fmt/format.h>

namespace dtrain {

std::string c_escape(std::string_view s, CEscape how) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      case '"': out += how.quotes ? "\\\"" : "\""; break;
      default:
        if (c < 0x20 || c == 0x7f || (how.non_ascii && c >= 0x80)) out += fmt::format("\\x{:02x}", c);
        else out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace dtrain
