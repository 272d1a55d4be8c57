#include "io/archive_file.h"

#include <exception>
#include <sstream>
#include <string_view>

#include "io/atomic_file.h"

namespace mantissa::io {

void save_torch_archive(const std::string& path, torch::serialize::OutputArchive& archive) {
  write_file_atomically_streamed(path, [&](const ChunkWriter& write) {
    // The zip writer calls back from C code (miniz), which an exception must not cross, and
    // LibTorch's writer aborts the process (an exception from its destructor) once a write
    // comes back short. So a failed write is kept here, the rest of the archive is produced and
    // dropped, and the failure, naming the file and errno, is rethrown at the end.
    std::exception_ptr failure;
    archive.save_to([&](const void* data, size_t size) -> size_t {
      if (failure) return size;
      try {
        write(std::string_view(static_cast<const char*>(data), size));
      } catch (...) {
        failure = std::current_exception();
      }
      return size;
    });
    if (failure) std::rethrow_exception(failure);
  });
}

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace mantissa::io
