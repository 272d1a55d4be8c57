#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <c10/util/Exception.h>

#include "shorten.h"

namespace mantissa::io {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void write_file_atomically_streamed(const std::string& path,
                                    const std::function<void(const ChunkWriter& write)>& produce) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  TORCH_CHECK(fd >= 0, "cannot create a temporary file next to '",
              mantissa::detail::shorten_path(path), "': ", errno_text());
  bool cleaned_up = false;  // closing twice could close a descriptor another thread just opened
  auto fail = [&](const char* what) {
    const std::string reason = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    cleaned_up = true;
    TORCH_CHECK(false, "cannot write '", mantissa::detail::shorten_path(path), "' (", what,
                "): ", reason);
  };
  const ChunkWriter write = [&](std::string_view chunk) {
    const char* data = chunk.data();
    std::size_t left = chunk.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, data, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write");
      data += n;
      left -= static_cast<std::size_t>(n);
    }
  };
  try {
    produce(write);
  } catch (...) {
    if (!cleaned_up) {
      ::close(fd);
      ::unlink(tmp.c_str());
    }
    throw;
  }
  if (::fchmod(fd, 0644) != 0) fail("fchmod");
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const std::string reason = errno_text();
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot write '", mantissa::detail::shorten_path(path),
                "' (close): ", reason);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot move '", mantissa::detail::shorten_path(tmp), "' to '",
                mantissa::detail::shorten_path(path), "': ", reason);
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically_streamed(path, [&](const ChunkWriter& write) { write(bytes); });
}

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// An open descriptor of a regular file; O_NONBLOCK so that opening a FIFO cannot wait for a
// writer (it is refused right after by fstat).
class RegularFile {
 public:
  explicit RegularFile(const std::string& path) {
    do {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } while (fd_ < 0 && errno == EINTR);
    TORCH_CHECK(fd_ >= 0, "cannot open '", mantissa::detail::shorten_path(path),
                "': ", errno_text());
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      const std::string reason = errno_text();
      ::close(fd_);
      TORCH_CHECK(false, "cannot read '", mantissa::detail::shorten_path(path), "': ", reason);
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd_);
      TORCH_CHECK(false, "cannot read '", mantissa::detail::shorten_path(path), "': it is ",
                  file_kind(info.st_mode), ", not a regular file");
    }
    size_ = static_cast<std::uint64_t>(info.st_size);
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile() { ::close(fd_); }

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace

void check_regular_file(const std::string& path) { RegularFile file(path); }

std::vector<char> read_file(const std::string& path, std::uint64_t max_bytes) {
  RegularFile file(path);
  TORCH_CHECK(file.size() <= max_bytes, "cannot read '", mantissa::detail::shorten_path(path),
              "': it has ", file.size(), " bytes, more than the ", max_bytes,
              " this reader accepts");
  std::vector<char> bytes(static_cast<std::size_t>(file.size()));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(file.fd(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    TORCH_CHECK(n >= 0, "cannot read '", mantissa::detail::shorten_path(path), "': ", errno_text());
    if (n == 0) break;  // the file shrank while we read it: return what is there
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace mantissa::io
