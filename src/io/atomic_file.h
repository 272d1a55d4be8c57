#pragma once
// Whole files in and out: writes that a crash or a full disk never leave half done, and reads
// that accept only regular files of a bounded size (a FIFO, a device or a symbolic link to
// /dev/zero in a checkpoint folder is an error, not a hang or an endless read).

#include <cstdint>
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

/// The largest file `read_file` reads by default: 1 GiB. The files read whole (JSON, small
/// torch.save pickles) are far smaller; anything larger is taken for a wrong or hostile file.
inline constexpr std::uint64_t kMaxReadFileBytes = std::uint64_t{1} << 30;

/// Throws a c10::Error naming `path` unless it is a regular file (symbolic links followed):
/// missing, a directory, a FIFO, a socket or a device. Never blocks. Call it before handing a
/// path to a reader that opens it itself (LibTorch's archives).
void check_regular_file(const std::string& path);

/// Reads a whole regular file of at most `max_bytes` bytes. Missing, unreadable, non-regular
/// (checked without blocking on a FIFO) or larger files raise a c10::Error naming the path and
/// the reason.
std::vector<char> read_file(const std::string& path, std::uint64_t max_bytes = kMaxReadFileBytes);

}  // namespace mantissa::io
