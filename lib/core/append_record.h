// Appending one whole record to a log file (metrics.jsonl, TensorBoard event files): a
// write that fails part-way is cut back, so a full disk never leaves a torn record that
// would spoil the file for its readers; the failure is reported once per file.
#pragma once

#include <string>
#include <string_view>

namespace dtrain {

/// Writes rec at fd's end (O_APPEND) or offset with as many write(2)s as it takes. On a
/// failure (ENOSPC, EDQUOT, EIO, ...) the bytes of rec that did get written are cut off
/// again (ftruncate back to where rec began, the offset put there), so the file ends
/// with a whole record.
/// Returns 0, or the errno of the failure (ENOSPC for a write that wrote nothing).
int append_record(int fd, std::string_view rec);

/// The state of a log file whose writes may fail for a while (a full disk): the first
/// failure is logged once as a warning naming the file, what is lost and that the job
/// goes on; later ones are silent until a write succeeds again (logged once as info).
class AppendReport {
 public:
  explicit AppendReport(std::string what) : what_(std::move(what)) {}
  /// err = append_record's result for `path`; returns err == 0.
  bool update(const std::string& path, int err);
  bool failing() const { return failing_; }

 private:
  std::string what_;  // what is lost, e.g. "metrics records"
  bool failing_ = false;
};

}  // namespace dtrain
