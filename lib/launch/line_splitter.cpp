// LineSplitter: '\n' framing with a bounded pending buffer.
#include "launch/line_splitter.h"

namespace dtrain::launch {

LineSplitter::LineSplitter(Stream stream, const LineCallback& callback, std::size_t max_line)
    : stream_(stream), callback_(callback), max_line_(max_line == 0 ? 1 : max_line) {}

void LineSplitter::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    std::size_t nl = bytes.find('\n');
    std::size_t room = max_line_ - pending_.size();
    if (nl != std::string_view::npos && nl <= room) {
      // Deliver straight from the input when nothing is pending (the common case).
      if (pending_.empty()) {
        if (callback_) callback_(stream_, bytes.substr(0, nl));
      } else {
        pending_.append(bytes.substr(0, nl));
        if (callback_) callback_(stream_, pending_);
        pending_.clear();
      }
      bytes.remove_prefix(nl + 1);
      continue;
    }
    if (bytes.size() <= room) {
      pending_.append(bytes);
      return;
    }
    pending_.append(bytes.substr(0, room));
    bytes.remove_prefix(room);
    if (callback_) callback_(stream_, pending_);
    pending_.clear();
  }
}

void LineSplitter::finish() {
  if (pending_.empty()) return;
  if (callback_) callback_(stream_, pending_);
  pending_.clear();
}

}  // namespace dtrain::launch
