#include "io/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "io/tensorboard_event.h"
#include "io/tfrecord.h"

namespace mantissa::io::detail {

EventFileWriter::EventFileWriter(std::string path, double wall_time) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  TORCH_CHECK(fd_ >= 0, "cannot create the event file '", path_, "': ", std::strerror(errno));
  write({encode_file_version_event(wall_time)});
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFileWriter::write(const std::vector<std::string>& events) {
  TORCH_CHECK(fd_ >= 0 && !broken_, "the event file '", path_,
              "' is closed or an earlier write to it failed");
  std::string bytes;
  for (const auto& event : events) bytes += frame_record(event);
  const char* data = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      TORCH_CHECK(false, "cannot write the event file '", path_,
                  "': ", n < 0 ? std::strerror(errno) : "nothing was written");
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
}

void EventFileWriter::close() {
  if (fd_ < 0) return;
  const int status = ::close(fd_);
  fd_ = -1;
  TORCH_CHECK(status == 0, "cannot close the event file '", path_, "': ", std::strerror(errno));
}

std::string event_file_name(double wall_time) {
  static std::atomic<long> files_named{0};
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.{}",
                     static_cast<long long>(std::floor(wall_time)), host_name(),
                     static_cast<long>(::getpid()), files_named.fetch_add(1));
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace mantissa::io::detail
