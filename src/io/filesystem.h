#pragma once
// Small POSIX file-system helpers for checkpoint folders. Internal: not installed.
//
// Why not std::filesystem: the libtorch.so of the PyPI wheel exports std::filesystem symbols of
// its own (built with another libstdc++ ABI); a program that links it and calls
// std::filesystem can end up in LibTorch's copies and crash. These helpers use POSIX calls
// only. Every error is a c10::Error that names the path and the system's reason (strerror).
// None of them touches a device.

#include <cstddef>
#include <string>
#include <vector>

namespace mantissa::io {

/// Whether something exists at `path` (symbolic links are followed; a dangling link does not
/// exist). Python: `os.path.exists(path)`. Never throws.
bool path_exists(const std::string& path);

/// Whether a directory entry named `path` exists, without following a symbolic link there: a
/// dangling link or a link loop exists. Python: `os.path.lexists(path)`. Never throws.
bool entry_exists(const std::string& path);

/// Whether `path` is a directory (symbolic links are followed). Python: `os.path.isdir(path)`.
/// Never throws.
bool is_directory(const std::string& path);

/// Creates `path` and every missing parent folder (mode 0777 minus the umask). Nothing happens
/// when `path` already is a directory. Python: `os.makedirs(path, exist_ok=True)`. Throws when
/// `path` or one of its parents exists and is not a directory, or a folder cannot be created.
void create_directories(const std::string& path);

/// Removes `path`: a file, a symbolic link (not what it points to) or a directory with
/// everything in it. A path that does not exist is not an error; returns the number of entries
/// removed (0 then). Python: `shutil.rmtree(path)` for folders, `os.remove` for files.
std::size_t remove_all(const std::string& path);

/// The names of the entries of directory `path`, without "." and "..", sorted by byte value.
/// Python: `sorted(os.listdir(path))`. Throws when `path` is not a readable directory.
std::vector<std::string> list_directory(const std::string& path);

/// Renames `from` to `to` with rename(2): atomic within one file system, and it replaces an
/// existing file or an empty folder at `to`. Python: `os.replace(from, to)`. Errors name both.
void rename_path(const std::string& from, const std::string& to);

/// Creates a new, empty directory with a unique name `<parent>/<prefix>XXXXXX` (mkdtemp, mode
/// 0700) and returns its path. Python: `tempfile.mkdtemp(prefix=prefix, dir=parent)`. An empty
/// `parent` means $TMPDIR, else /tmp.
std::string make_temp_directory(const std::string& parent, const std::string& prefix);

/// Joins two path components with one "/": `join_path("out", "checkpoint-10")` is
/// "out/checkpoint-10". An absolute `b` replaces `a`, and an empty `a` gives `b`, as in
/// Python's `os.path.join(a, b)`.
std::string join_path(const std::string& a, const std::string& b);

}  // namespace mantissa::io
