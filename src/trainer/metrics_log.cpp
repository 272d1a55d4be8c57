#include "trainer/metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "io/filesystem.h"

#include "io/json_number.h"

namespace mantissa::detail {
namespace {

// Appends `line` to `path` with one write(2) per chunk; the errno text of the first failure.
std::string append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  std::string failure;
  const char* data = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failure = n < 0 ? std::strerror(errno) : "nothing was written";
      break;
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 && failure.empty()) failure = std::strerror(errno);
  return failure;
}

}  // namespace

MetricsLog::MetricsLog(std::string output_dir) : output_dir_(std::move(output_dir)) {}

void MetricsLog::append(const LogEntry& entry) {
  nlohmann::json line = nlohmann::json::object();
  for (const auto& [key, value] : entry) line[key] = io::json_number(value);
  const auto path = io::join_path(output_dir_, "trainer_log.jsonl");
  std::string failure;
  try {
    io::create_directories(output_dir_);
    wrote_ = true;
    failure = append_line(path, line.dump() + "\n");
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  }
  if (failure.empty() || failure_reported_) return;
  failure_reported_ = true;
  TORCH_WARN(
      "cannot write the training log '", path, "': ", failure,
      ". Training goes on; later log lines may be missing from this file, but every entry stays in "
      "trainer_state.json's log_history, saved with each checkpoint. (Reported once.)");
}

}  // namespace mantissa::detail
