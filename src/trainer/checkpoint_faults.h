#pragma once
// Faults a test injects into the checkpoint writer and the rotation, passed as a parameter
// instead of through process-wide hooks.

#include <functional>
#include <string>

namespace mantissa::detail {

/// Called before the checkpoint code touches a file or folder, so that a test can throw and
/// play a full disk or a process killed half-way. Both empty (the default): nothing happens.
/// Python has no equivalent; HF's tests patch `os` functions instead.
struct FileFaults {
  /// Called with each checkpoint file's path just before it is written.
  std::function<void(const std::string& path)> before_write;
  /// Called with a rotated-out checkpoint's renamed folder just before it is deleted.
  std::function<void(const std::string& path)> before_remove;

  /// Runs `before_write` when set.
  void writing(const std::string& path) const {
    if (before_write) before_write(path);
  }
  /// Runs `before_remove` when set.
  void removing(const std::string& path) const {
    if (before_remove) before_remove(path);
  }
};

}  // namespace mantissa::detail
