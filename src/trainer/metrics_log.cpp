#include "trainer/metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "io/filesystem.h"

#include "io/atomic_file.h"
#include "io/json_number.h"
#include "io/json_reader.h"

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

MetricsLog::MetricsLog(std::string output_dir)
    : output_dir_(std::move(output_dir)), path_(io::join_path(output_dir_, "trainer_log.jsonl")) {}

void MetricsLog::on_log(const TrainingArguments& /*args*/, TrainerState& state,
                        TrainerControl& /*control*/, const LogEntry& logs) {
  LogEntry with_step = logs;
  with_step["step"] = static_cast<double>(state.global_step);
  append(with_step);
}

void MetricsLog::append(const LogEntry& entry) {
  nlohmann::json line = nlohmann::json::object();
  for (const auto& [key, value] : entry) line[key] = io::json_log_value(value);
  std::string failure;
  try {
    io::create_directories(output_dir_);
    wrote_ = true;
    failure = append_line(path_, line.dump() + "\n");
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  }
  report_failure(failure);
}

void MetricsLog::drop_after(std::int64_t global_step) {
  if (!io::path_exists(path_)) return;
  std::string failure;
  try {
    const auto bytes = io::read_file(path_);
    const std::string text(bytes.begin(), bytes.end());
    std::string kept;
    bool dropped = false;
    std::size_t begin = 0;
    while (begin < text.size()) {
      auto end = text.find('\n', begin);
      end = end == std::string::npos ? text.size() : end + 1;
      const auto line = text.substr(begin, end - begin);
      begin = end;
      // A line that is not an entry with a numeric "step" (hand-edited, cut short) is kept.
      nlohmann::json entry;  // stays null for a line that is not JSON
      try {
        entry = io::parse_json_text<nlohmann::json>(line);
      } catch (const io::JsonTextError&) {
      }
      const bool later = entry.is_object() && entry.contains("step") && entry["step"].is_number() &&
                         entry["step"].get<double>() > static_cast<double>(global_step);
      if (later) {
        dropped = true;
      } else {
        kept += line;
      }
    }
    if (dropped) io::write_file_atomically(path_, kept);
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  }
  report_failure(failure);
}

void MetricsLog::start_fresh() {
  if (wrote_ || !io::path_exists(path_)) return;
  // unlink(2), not a recursive removal: a folder of that name is reported, never emptied.
  report_failure(::unlink(path_.c_str()) == 0 ? std::string() : std::strerror(errno));
}

void MetricsLog::report_failure(const std::string& failure) {
  if (failure.empty() || failure_reported_) return;
  failure_reported_ = true;
  TORCH_WARN(
      "cannot write the training log '", path_, "': ", failure,
      ". Training goes on; later log lines may be missing from this file, but every entry stays in "
      "trainer_state.json's log_history, saved with each checkpoint. (Reported once.)");
}

}  // namespace mantissa::detail
