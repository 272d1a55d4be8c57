#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include <c10/util/Exception.h>

namespace mantissa::io {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void write_file_atomically_streamed(const std::string& path,
                                    const std::function<void(const ChunkWriter& write)>& produce) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  TORCH_CHECK(fd >= 0, "cannot create a temporary file next to '", path, "': ", errno_text());
  bool cleaned_up = false;  // closing twice could close a descriptor another thread just opened
  auto fail = [&](const char* what) {
    const std::string reason = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    cleaned_up = true;
    TORCH_CHECK(false, "cannot write '", path, "' (", what, "): ", reason);
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
    TORCH_CHECK(false, "cannot write '", path, "' (close): ", reason);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot move '", tmp, "' to '", path, "': ", reason);
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically_streamed(path, [&](const ChunkWriter& write) { write(bytes); });
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "cannot open '", path, "': ", errno_text());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TORCH_CHECK(!in.bad(), "cannot read '", path, "': ", errno_text());
  return bytes;
}

}  // namespace mantissa::io
