// The dtrain version string (the CMake project version) and the build id: the SHA-256 of
// the running executable file, so two binaries that differ in any byte differ in id even
// when they carry the same version.
#pragma once

#include <string>

namespace dtrain {
const char* version();

/// Hex SHA-256 of /proc/self/exe (64 characters), computed on first use and cached.
/// "unknown" when the executable cannot be read (the reason goes to the log once).
const std::string& build_id();

/// Hex SHA-256 of the file at `path`; empty string and `error` set when it cannot be read.
std::string file_sha256(const std::string& path, std::string* error = nullptr);
}  // namespace dtrain
