// TensorBoard event files: events.out.tfevents.<unix time>.<host> in a log directory, as
// TensorFlow's EventsWriter writes them (TFRecord framing of Event protos, the first one
// with file_version "brain.Event:2"), holding scalar summaries (simple_value), so
// `tensorboard --logdir DIR` plots them.
#pragma once

#include "core/append_record.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::tensorboard {

/// One scalar of a step: its tag ("train/loss") and value (stored as float32, as
/// TensorBoard's simple_value is).
struct Scalar {
  std::string tag;
  double value = 0.0;
};

/// Unix time in seconds (system clock), as TensorFlow writes Event.wall_time.
double unix_seconds();

/// "events.out.tfevents.<unix_seconds as 10 digits>.<host>" (TensorFlow's name).
std::string event_file_name(int64_t unix_seconds, std::string_view host);

/// The log directory of a run: output_path against run_dir when relative ("" = run_dir
/// itself), then job_name below it when not "" (DeepSpeed's output_path/job_name).
std::string log_dir(const std::string& run_dir, const std::string& output_path, const std::string& job_name);

/// Writes one new event file. Every record is one write(2) on an O_APPEND descriptor,
/// handed to the kernel before the call returns: a killed job leaves every complete
/// record readable (at most a torn last one, which readers stop at).
class EventWriter {
 public:
  /// Creates dir (with its parents, mode 0777 less the umask) and a new event file in it
  /// named for wall_time and this host, then writes the file_version record. Never opens
  /// an existing file: when the name is taken, or an event file already in dir has the
  /// same or a later time (another host's clock, a restart within the second), the time
  /// in the name moves past it, so names sort in creation order, the order TensorBoard
  /// reads a directory's files in. Throws IoError naming the path when the directory or
  /// the file cannot be created; a full disk only delays the file_version record.
  explicit EventWriter(const std::string& dir, double wall_time = unix_seconds(), const std::string& host = "");
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  /// A SessionLog START at step: TensorBoard then drops the events it read earlier (from
  /// older files) whose step is >= step, the steps a failed round ran past its last
  /// checkpoint and this run repeats.
  void session_start(int64_t step, double wall_time = unix_seconds());
  /// One Event with a Summary of the scalars.
  void scalars(int64_t step, const std::vector<Scalar>& values, double wall_time = unix_seconds());

  const std::string& path() const { return path_; }

 private:
  /// Appends data's record (after the file_version record while that is not written).
  /// A failed write (a full disk) does not throw: the record is dropped whole, the first
  /// failure logged once; false then.
  bool record_write(std::string_view data);

  std::string path_;
  int fd_ = -1;
  std::string header_;  // the file_version Event, until it is written
  AppendReport report_{"its TensorBoard events"};
};

}  // namespace dtrain::tensorboard
