// Event files: choosing a new file name, the Event protos (generated from tf_event.proto,
// lite runtime) and the one-write-per-record appends.
#include "tensorboard/event_writer.h"

#include "core/append_record.h"
#include "core/check.h"
#include "core/net_address.h"
#include "tensorboard/record.h"
#include "tf_event.pb.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

namespace dtrain::tensorboard {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "events.out.tfevents.";

// The unix time in an event file's name ("events.out.tfevents.<digits>.<anything>"),
// or -1 for any other name.
int64_t name_time(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  name.remove_prefix(kPrefix.size());
  int64_t t = -1;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), t);
  if (ec != std::errc() || end == name.data() || end == name.data() + name.size() || *end != '.') return -1;
  return t;
}

// The latest time named by an event file already in dir (-1 = none).
int64_t newest_time(const fs::path& dir) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    newest = std::max(newest, name_time(e.path().filename().native()));
  DT_ENFORCE(!ec, IoError, "cannot list the TensorBoard directory {}: {}", dir.string(), ec.message());
  return newest;
}

}  // namespace

// ----------------------------------------------------------------------------
double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string event_file_name(int64_t unix_seconds, std::string_view host) {
  return fmt::format("{}{:010d}.{}", kPrefix, unix_seconds, host);
}

std::string log_dir(const std::string& run_dir, const std::string& output_path, const std::string& job_name) {
  // An absolute output_path replaces run_dir ("" would leave a trailing separator).
  fs::path d = output_path.empty() ? fs::path(run_dir) : fs::path(run_dir) / output_path;
  if (!job_name.empty()) d /= job_name;
  return d.lexically_normal().string();
}

// ----------------------------------------------------------------------------
EventWriter::EventWriter(const std::string& dir, double wall_time, const std::string& host) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DT_ENFORCE(!ec, IoError,
             "cannot create the TensorBoard directory {}: {}; set tensorboard.output_path to a "
             "writable directory",
             dir, ec.message());
  const std::string h = host.empty() ? host_name() : host;
  int64_t t = std::max(static_cast<int64_t>(wall_time), newest_time(dir) + 1);
  // O_EXCL: another writer (a second job logging into the same directory) may take a
  // name between the listing and the open; the next second's name is then tried.
  for (int attempt = 0; fd_ < 0; ++attempt, ++t) {
    path_ = (fs::path(dir) / event_file_name(t, h)).string();
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt == 100))
      DT_THROW(IoError, "cannot create the TensorBoard event file {}: {}", path_, std::strerror(errno));
  }
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_file_version("brain.Event:2");
  header_ = e.SerializeAsString();
  // On a full disk the file stays empty (readers accept that) and the header goes first
  // with the next record that fits.
  record_write({});
}

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::session_start(int64_t step, double wall_time) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  e.mutable_session_log()->set_status(pb::SessionLog::START);
  record_write(e.SerializeAsString());
}

void EventWriter::scalars(int64_t step, const std::vector<Scalar>& values, double wall_time) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary* s = e.mutable_summary();
  for (const Scalar& v : values) {
    pb::Summary::Value* pv = s->add_value();
    pv->set_tag(v.tag);
    pv->set_simple_value(static_cast<float>(v.value));
  }
  record_write(e.SerializeAsString());
}

bool EventWriter::record_write(std::string_view data) {
  // The file_version record first, once: no event file without it.
  std::string rec = header_.empty() ? std::string() : record_frame(header_);
  if (!data.empty()) rec += record_frame(data);
  if (rec.empty()) return true;
  // Observability only: a full disk costs events, never the run, and the file keeps only
  // whole records (a torn one would end TensorBoard's reading of the whole file).
  if (!report_.update(path_, append_record(fd_, rec))) return false;
  header_.clear();
  return true;
}

}  // namespace dtrain::tensorboard
