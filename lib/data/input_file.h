// input_file_check(): an input file (text data, SFT JSONL, token shard, tokenizer.json)
// that is missing, a directory or unreadable is a configuration error (exit 2, which the
// supervisor does not restart), not an IoError that a new round would retry in vain.
#pragma once

#include <string>

namespace dtrain::data {

/// "" when `path` is an existing regular file this process may read, else why not
/// ("does not exist", "is a directory, not a file", "is not readable: Permission denied").
std::string input_file_problem(const std::string& path);

/// Throws ConfigError "<what> '<path>' <problem>" unless input_file_problem(path) is "";
/// a relative path is also given as resolved against the working directory.
void input_file_check(const std::string& path, const std::string& what);

/// The whole file after input_file_check(path, what); IoError naming it when it cannot be
/// read. For inputs that are one value (a JSON array, dataset_info.json), not streams.
std::string input_file_read(const std::string& path, const std::string& what);

}  // namespace dtrain::data
