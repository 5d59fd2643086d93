// The one rule for every file dtrain reads (configs, hostfiles, model and tokenizer files,
// templates, data, checkpoints, token and key files): opened non-blocking and checked on the
// descriptor before a byte is read, so a FIFO, a device such as /dev/zero, a directory, a
// symbolic link loop or a file past the size bound of its kind is one ConfigError (exit 2)
// naming the path and saying what to do, never a hang, exhausted memory or a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace dtrain {

// ----------------------------------------------------------------------------
// Size bounds by kind of input (the secrets and the config keep their own, smaller ones)

/// JSON and text metadata: a model's config.json, generation_config.json,
/// adapter_config.json, model.safetensors.index.json, tokenizer_config.json,
/// chat_template.jinja, dataset_info.json, a checkpoint's manifest.json. The largest
/// published ones (an index of a 100k-tensor model, a tokenizer_config.json with every
/// added token) are a few MB.
inline constexpr uint64_t kInputMetaMaxBytes = uint64_t{64} << 20;
/// Tokenizers (tokenizer.json): the largest published vocabularies are ~35 MB of JSON.
inline constexpr uint64_t kInputTokenizerMaxBytes = uint64_t{256} << 20;
/// Data, safetensors weights, token shards, checkpoint shards: no byte bound (they are
/// streamed or mapped), but they must still be regular files.
inline constexpr uint64_t kInputAnySize = UINT64_MAX;

/// What an input may be besides a regular file.
enum class InputAccept {
  REGULAR,         ///< a regular file only
  REGULAR_OR_FIFO  ///< also a FIFO or pipe (bash's `--hostfile <(...)`), which the caller reads with a bound
};

// ----------------------------------------------------------------------------
// Files

/// An input file open for reading (O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY), checked
/// on its descriptor. Closes it when destroyed; move-only.
class InputFile {
 public:
  InputFile() = default;
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  ///< at the check (fstat); 0 for a FIFO
  bool is_fifo() const { return fifo_; }
  /// The descriptor, which the caller now closes.
  int release();
  /// The rest of a regular file, at most max_bytes however it grows while being read
  /// (ConfigError "<what> '<path>' grew past ..."); IoError naming it when a read fails.
  std::string read_all(const std::string& what, uint64_t max_bytes);

 private:
  friend InputFile input_file_try_open(const std::string&, uint64_t, std::string*, InputAccept);
  void close();
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
  bool fifo_ = false;
};

/// Opens path if it is a readable regular file of at most max_bytes (or a FIFO, when
/// accept says so). Otherwise returns a closed InputFile and sets *problem to what is
/// wrong, for "<what> <path> <problem>" messages: "does not exist", "is a broken symbolic
/// link (to X)", "is, or passes through, a symbolic link loop (too many levels of symbolic
/// links)", "is a directory, not a file", "is not a regular file (a FIFO)", "is not a
/// regular file (a character device)", "is 5000 bytes, more than the 4096 allowed for it",
/// "is not readable: Permission denied", "cannot be opened: ...". Never blocks.
InputFile input_file_try_open(const std::string& path, uint64_t max_bytes, std::string* problem,
                              InputAccept accept = InputAccept::REGULAR);

/// "" when input_file_try_open(path, max_bytes) would succeed, else its problem.
std::string input_file_problem(const std::string& path, uint64_t max_bytes = kInputAnySize);

/// input_file_try_open, or ConfigError "<what> '<path>' <problem>: <what to do>" (a
/// relative path is also given as resolved against the working directory).
InputFile input_file_open(const std::string& path, const std::string& what, uint64_t max_bytes = kInputAnySize);

/// input_file_open without keeping the file: throws as it does.
void input_file_check(const std::string& path, const std::string& what, uint64_t max_bytes = kInputAnySize);

/// The whole file through input_file_open and InputFile::read_all: for inputs that are one
/// value (a JSON document, a template, a config), not streams.
std::string input_file_read(const std::string& path, const std::string& what, uint64_t max_bytes);

/// The message input_file_open throws for problem: "<what> '<path>'[ (relative to the
/// working directory D)] <problem>: <what to do>".
std::string input_file_message(const std::string& path, const std::string& what, const std::string& problem);

// ----------------------------------------------------------------------------
// Paths: is something there, is it a directory (no call here throws std::filesystem_error)

/// Whether path names an entry (not following a last symbolic link: a broken or looping
/// link is present, and input_file_open then says what is wrong with it). False when it
/// or a directory on the way does not exist; ConfigError naming path when that cannot be
/// told (a symbolic link loop on the way, no permission to look).
bool input_present(const std::string& path, const std::string& what);

/// "" when path is a directory (following links) this process may list, else what is
/// wrong: "does not exist", "is not a directory", "is, or passes through, a symbolic link
/// loop (...)", "cannot be examined: ...".
std::string input_dir_problem(const std::string& path);

/// ConfigError input_file_message(path, what, problem) unless input_dir_problem is "".
void input_dir_check(const std::string& path, const std::string& what);

/// "" unless resolving path (which may not exist yet: a directory to create) runs into a
/// symbolic link loop or a permission problem on the way; then the problem, as above.
std::string path_resolve_problem(const std::string& path);

/// The ConfigError for a std::filesystem error about an input (a symbolic link loop, no
/// permission on the way): names the path it was about and what to do.
[[noreturn]] void input_fs_error(const std::filesystem::filesystem_error& e, const std::string& what);

/// What a file of type `mode` (st_mode) is when a regular file was wanted: "is a directory,
/// not a file", "is not a regular file (a FIFO)", ...; "is not a regular file" for others.
std::string file_type_problem(unsigned mode);

}  // namespace dtrain
