// Outputs: the one rule for every path a command writes (export, plot, data prepare,
// bench --json). An output is never one of the command's inputs (compared by device and
// inode, through symlinks); an existing directory is written into only when it is empty
// or dtrain's own output of the same kind (its marker file), and is never replaced,
// re-created or chmodded; an existing file is replaced only when it is dtrain's own output
// of that kind or with --force; a symlink is written through, never replaced; files are
// written under a temporary name beside their target and renamed into place.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace dtrain {

/// A file output's rule.
struct OutputRule {
  std::string what;                 ///< names the output in messages: "plot -o", "data prepare OUTPUT"
  std::vector<std::string> inputs;  ///< files and directories the command reads: the output is none of them
  /// An existing regular file that is dtrain's own output of this kind (replaced without --force).
  std::function<bool(const std::string& target)> own;
  std::string own_kind;   ///< what `own` recognises, for messages: "dtrain plot (PNG)"
  bool force = false;     ///< --force given: any existing regular file that is no input may be replaced
  bool in_place = false;  ///< a character device or FIFO (/dev/null, /dev/stdout) is written in place
  std::string force_flag = "--force";
};

/// Where a file output's bytes go, as output_file_check accepted it.
struct OutputFile {
  std::string given;      ///< as named
  std::string target;     ///< through symlinks: the file written
  bool exists = false;    ///< target exists (a regular file: replaced by the rename)
  bool in_place = false;  ///< target is a device or FIFO: written directly
  unsigned mode = 0;      ///< an existing regular target's permission bits (kept)
};

/// Checks `path` against the rule; UsageError naming the path, the rule it breaks and what
/// to do (another path, or --force where that is allowed).
OutputFile output_file_check(const std::string& path, const OutputRule& rule);

/// Writes `bytes` to the output: a temporary file beside the target, fsync'd, given the
/// old file's mode and renamed onto it (a device or FIFO: written in place). IoError naming
/// the path and the reason; a failed write leaves neither a partial file nor a temporary.
void output_file_write(const OutputFile& out, const std::string& bytes);

/// A directory output's rule.
struct OutputDirRule {
  std::string what;                 ///< "export -o"
  std::vector<std::string> inputs;  ///< files and directories the command reads: the output is none of them
  std::string marker;               ///< file in a directory dtrain wrote as this kind (".dtrain-export.json")
  std::string kind;                 ///< the marker's "kind" value ("hf-export")
  /// An existing directory without the marker still taken as own (an older dtrain's output
  /// at the command's default location); may be empty.
  std::function<bool(const std::string& target)> legacy_own;
};

/// Where a directory output goes, as output_dir_check accepted it.
struct OutputDir {
  std::string given;    ///< as named
  std::string target;   ///< through symlinks: the directory written into (created when missing)
  bool exists = false;  ///< target exists (empty, or own)
  bool own = false;     ///< target holds dtrain's output of this kind
};

/// Checks `path` against the rule; UsageError naming the path, what is in the way and what
/// to do.
OutputDir output_dir_check(const std::string& path, const OutputDirRule& rule);

/// The marker's JSON for `kind` listing the entries written; output_dir_marker_files reads
/// the list back ({} when the marker is missing or another kind's).
std::string output_dir_marker_text(const std::string& kind, const std::vector<std::string>& files, bool complete);
std::vector<std::string> output_dir_marker_files(const std::string& dir, const std::string& marker,
                                                 const std::string& kind, bool* found = nullptr);

/// True when a and b name the same existing file or directory (device and inode, through
/// symlinks), or, when either does not exist, the same absolute path once resolved.
bool same_path(const std::string& a, const std::string& b);

}  // namespace dtrain
