#pragma once
// Writing files so that a crash or a full disk never leaves a half-written file behind.

#include <string>
#include <string_view>
#include <vector>

namespace mantissa::io {

/// Writes `bytes` to `path` through a temporary file in the same folder, flushed with fsync
/// and renamed over `path`. On any failure the temporary file is removed, `path` keeps its
/// old content, and a c10::Error names the path and the reason (errno text).
void write_file_atomically(const std::string& path, std::string_view bytes);

/// Reads a whole file. A missing or unreadable file raises a c10::Error naming the path.
std::vector<char> read_file(const std::string& path);

}  // namespace mantissa::io
