// Splits a byte stream (pipe or SSH channel reads) into lines for a LineCallback:
// complete lines as they arrive, the partial last line at finish(), and lines longer
// than a limit in limit-sized pieces so a runaway writer cannot exhaust memory.
#pragma once

#include "launch/spawner.h"

#include <cstddef>
#include <string>
#include <string_view>

namespace dtrain::launch {

class LineSplitter {
 public:
  /// Lines are cut at '\n' (removed); a line reaching max_line bytes without a '\n'
  /// is delivered as one piece and the rest continues as a new line.
  LineSplitter(Stream stream, const LineCallback& callback, std::size_t max_line = 1 << 20);

  /// Appends bytes; calls the callback for each completed line.
  void feed(std::string_view bytes);
  /// End of stream: delivers a pending partial line (if any). Idempotent.
  void finish();

 private:
  Stream stream_;
  const LineCallback& callback_;
  std::size_t max_line_;
  std::string pending_;
};

}  // namespace dtrain::launch
