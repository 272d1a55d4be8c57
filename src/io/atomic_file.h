#pragma once
// Writing files so that a crash or a full disk never leaves a half-written file behind.

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mantissa::io {

/// Writes `bytes` to `path` through a temporary file in the same folder, flushed with fsync
/// and renamed over `path`. On any failure the temporary file is removed, `path` keeps its
/// old content, and a c10::Error names the path and the reason (errno text).
void write_file_atomically(const std::string& path, std::string_view bytes);

/// Receives one chunk of a file's content; see `write_file_atomically_streamed`.
using ChunkWriter = std::function<void(std::string_view chunk)>;

/// Like `write_file_atomically`, but the content is produced piece by piece: `produce` is called
/// once and calls its argument with each chunk in order, so a large file (a model's tensors)
/// never has to sit in one buffer. If `produce` throws, the temporary file is removed, `path`
/// keeps its old content and the exception propagates unchanged.
void write_file_atomically_streamed(const std::string& path,
                                    const std::function<void(const ChunkWriter& write)>& produce);

/// Reads a whole file. A missing or unreadable file raises a c10::Error naming the path.
std::vector<char> read_file(const std::string& path);

}  // namespace mantissa::io
