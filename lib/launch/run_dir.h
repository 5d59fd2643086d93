// A run directory's safety rules: dtrain creates it, or adopts only an empty one or its
// own (never a system path); it is private (training.run_dir_mode, 0700 by default, set
// only on a directory dtrain created; its files 0600), it has one launcher at a time (an
// flock'ed launcher.lock recording the holder's host, pid and start time), and its files
// are replaced atomically.
#pragma once

#include <cstddef>
#include <string>
#include <sys/types.h>
#include <vector>

namespace dtrain::launch {

/// "0750" -> 0750. ConfigError for anything but an octal mode that lets the owner read,
/// write and enter the directory.
mode_t run_dir_mode_parse(const std::string& text);

/// Longest path, in bytes, the job creates below its run directory (a checkpoint's
/// shard being written: checkpoints/tmp-step<N>/rank<R>.bin.tmp, with margin).
inline constexpr size_t RUN_DIR_INNER_PATH_MAX = 96;

/// Checks an absolute run directory path before anything is created: every component
/// within the file system's NAME_MAX (asked of the nearest existing parent, 255 when it
/// cannot be asked) and the whole path short enough that the files the job creates in it
/// stay within PATH_MAX. The run directory holds no unix sockets, so their shorter limit
/// (108 bytes) does not apply. ConfigError naming `what` (the key or flag it came from),
/// the offending part, its length and the limit.
void run_dir_check_path(const std::string& dir, const std::string& what);

/// The file dtrain writes into every run directory it creates or adopts. Its record says
/// whether dtrain created the directory (then dtrain may set the directory's mode).
inline constexpr const char* RUN_DIR_MARKER = ".dtrain-run";

/// Refuses a run directory that is a system location, before anything is created:
/// "/", the top-level system directories (/bin /boot /dev /etc /home /lib* /media /mnt
/// /opt /proc /root /run /sbin /snap /srv /sys /tmp /usr /var /var/tmp) and $HOME
/// itself, anything below /proc /sys /dev /etc /usr /bin /sbin /boot /lib*, and any path
/// on a kernel file system (proc, sysfs, devpts, cgroup, debugfs, ...). Checked on the
/// path as given and with its symlinks resolved; a path that runs into a symbolic link loop
/// (LOOP/sub) is refused too. ConfigError naming `what`.
void run_dir_check_safe(const std::string& dir, const std::string& what);

/// Whether dtrain may write into dir, without changing anything: it does not exist yet,
/// or it is an empty directory, or a dtrain run directory: it holds RUN_DIR_MARKER, or
/// (a run of a dtrain from before the marker) config.yaml with events.jsonl or
/// checkpoints/, or only a launcher.lock. Also run_dir_check_safe. UsageError naming the
/// directory and what to do otherwise.
void run_dir_check_adoptable(const std::string& dir, const std::string& what);

/// Creates dir (and missing parents) with the given mode, or adopts an existing one that
/// run_dir_check_adoptable accepts, and writes RUN_DIR_MARKER into it. The mode of an
/// existing directory is set only when its marker says dtrain created it: a directory
/// dtrain did not create keeps its mode (a warning says when it is looser than `mode`).
/// UsageError / ConfigError as run_dir_check_adoptable; IoError when it cannot.
void run_dir_create(const std::string& dir, mode_t mode);

class RunDirLock;

/// run_dir_create under the launcher's lock (RunDirLock::acquire, which see for *note): a
/// new directory is created, an existing one is adopted only once the lock is held, so a
/// second launcher or `dtrain run` on a live run's directory is refused naming the holder
/// before it changes anything there (its mode included).
RunDirLock run_dir_create_locked(const std::string& dir, mode_t mode, std::string* note = nullptr);

/// Writes path through path.tmp and a rename, with the given permission bits (not
/// subject to the umask), so a reader sees the old or the new file, never a torn one.
/// IoError naming the file and the system's reason ("No space left on device"); the
/// tmp file does not stay behind.
void run_dir_write_file(const std::string& path, const std::string& text, mode_t mode);

/// True for the names of dtrain's own unfinished checkpoint directories:
/// "tmp-step<digits>" (train/checkpoint.h writes a checkpoint there, then renames it).
bool run_dir_partial_checkpoint_name(const std::string& name);

/// Removes what an interrupted checkpoint save left in <dir>/checkpoints: tmp-step<k>/
/// directories and the latest.tmp file, nothing else (a user's files stay, whatever
/// their name). Only while no rank runs (the launcher, before a round). Logs each path
/// removed, and a warning for one that cannot be; returns the paths removed.
std::vector<std::string> run_dir_remove_partial_checkpoints(const std::string& dir);

/// Exclusive ownership of a run directory while the object lives: an flock on
/// <dir>/launcher.lock, which the kernel drops however the process ends (exit, signal,
/// crash), so a dead launcher never blocks the directory.
class RunDirLock {
 public:
  /// Takes the lock, or throws UsageError naming the holder's host, pid and start time.
  /// A record left behind by a launcher that died without clearing it (the lock itself
  /// is free) is taken over; a record that cannot be written (a full disk) does not stop
  /// the launch, the lock holds without it. Either is described in one line in *note
  /// (when given), for the caller to report.
  static RunDirLock acquire(const std::string& dir, std::string* note = nullptr);

  RunDirLock(RunDirLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  RunDirLock& operator=(RunDirLock&&) = delete;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  /// Clears the record, then closes the file, which releases the lock.
  ~RunDirLock();

  const std::string& path() const { return path_; }

 private:
  RunDirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace dtrain::launch
