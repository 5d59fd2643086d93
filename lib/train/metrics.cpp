// metrics.jsonl writer/reader on a raw fd (O_APPEND, one write per record) and the
// section timers.
#include "train/metrics.h"

#include "core/append_record.h"
#include "core/check.h"
#include "core/log.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

namespace dtrain::train {

namespace {

[[noreturn]] void throw_io(const std::string& what, const std::string& path) {
  DT_THROW(IoError, "{} {}: {}", what, path, std::strerror(errno));
}

// Cuts a trailing partial line (no final '\n') so appended records start on a fresh line.
void drop_partial_last_line(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw_io("cannot stat metrics file", path);
  off_t size = st.st_size;
  if (size == 0) return;
  char c;
  if (::pread(fd, &c, 1, size - 1) != 1) throw_io("cannot read metrics file", path);
  if (c == '\n') return;
  // Scan backwards in blocks for the last newline.
  off_t keep = 0;
  char buf[4096];
  for (off_t end = size; end > 0 && keep == 0;) {
    const off_t begin = end > static_cast<off_t>(sizeof buf) ? end - static_cast<off_t>(sizeof buf) : 0;
    const ssize_t got = ::pread(fd, buf, static_cast<size_t>(end - begin), begin);
    if (got != end - begin) throw_io("cannot read metrics file", path);
    for (off_t i = end - begin; i > 0; --i) {
      if (buf[i - 1] == '\n') {
        keep = begin + i;
        break;
      }
    }
    end = begin;
  }
  log_warn("{}: dropping a partial last record ({} bytes) left by an interrupted run", path, size - keep);
  if (::ftruncate(fd, keep) != 0) throw_io("cannot truncate metrics file", path);
}

}  // namespace

// ----------------------------------------------------------------------------
MetricsWriter::MetricsWriter(const std::string& path, bool append, bool fsync_each)
    : path_(path), fsync_each_(fsync_each), report_("its metrics records") {
  // Append mode reads the tail back (partial-line repair), hence O_RDWR.
  const int mode = append ? (O_RDWR | O_APPEND) : (O_WRONLY | O_TRUNC);
  fd_ = ::open(path.c_str(), mode | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io("cannot open metrics file", path);
  if (append) {
    try {
      drop_partial_last_line(fd_, path);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

bool MetricsWriter::write(const nlohmann::json& record) {
  DT_ENFORCE(record.is_object(), InternalError, "metrics record must be a JSON object, got {}", record.type_name());
  // Invalid UTF-8 in a string value is replaced rather than aborting the run.
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line.push_back('\n');
  // An observability file: a full disk costs records, never the run, and never leaves
  // half a record (append_record cuts it back).
  int err = append_record(fd_, line);
  if (err == 0 && fsync_each_ && ::fsync(fd_) != 0) err = errno;
  return report_.update(path_, err);
}

std::vector<nlohmann::json> metrics_read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_io("cannot open metrics file", path);
  std::vector<nlohmann::json> out;
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    DT_ENFORCE(!j.is_discarded() && j.is_object(), IoError, "{}:{}: not a JSON object record", path, lineno);
    out.push_back(std::move(j));
  }
  return out;
}

// ----------------------------------------------------------------------------
double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* section_name(Section s) {
  static constexpr const char* kNames[kSectionCount] = {"forward",   "backward", "comm",
                                                        "optimizer", "data",     "checkpoint"};
  return kNames[static_cast<size_t>(s)];
}

StepTimer::StepTimer(Clock clock) : clock_(clock ? std::move(clock) : Clock(monotonic_seconds)) {}

void StepTimer::start(Section s) {
  const size_t i = static_cast<size_t>(s);
  DT_ENFORCE(!running_[i], InternalError, "timer section '{}' started twice", section_name(s));
  if (observer_) observer_(s, true);
  running_[i] = true;
  started_at_[i] = clock_();
}

void StepTimer::stop(Section s) {
  const double now = clock_();
  const size_t i = static_cast<size_t>(s);
  DT_ENFORCE(running_[i], InternalError, "timer section '{}' stopped without a start", section_name(s));
  running_[i] = false;
  total_s_[i] += now - started_at_[i];
  ++count_[i];
  if (observer_) observer_(s, false);
}

double StepTimer::elapsed_ms(Section s) const { return total_s_[static_cast<size_t>(s)] * 1e3; }
int64_t StepTimer::count(Section s) const { return count_[static_cast<size_t>(s)]; }

void StepTimer::reset() {
  total_s_.fill(0.0);
  running_.fill(false);
  count_.fill(0);
}

nlohmann::json StepTimer::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < kSectionCount; ++i)
    j[std::string(section_name(static_cast<Section>(i))) + "_ms"] = total_s_[i] * 1e3;
  return j;
}

}  // namespace dtrain::train
