// C-style escaping of text shown on one line (dry-run environments, YAML strings,
// hostfile lines quoted in errors): a value holding a newline or a control byte cannot
// fake another line or move the terminal's cursor.
#pragma once

#include <string>
#include <string_view>

namespace dtrain {

struct CEscape {
  bool quotes = false;     // also \" (the text goes between double quotes)
  bool non_ascii = false;  // also bytes >= 0x80 as \xHH (the text is quoted back from a file of any encoding)
};

/// `s` with \\ \n \t \r named, other control bytes and DEL (and what `how` adds) as \xHH.
std::string c_escape(std::string_view s, CEscape how = {});

}  // namespace dtrain
