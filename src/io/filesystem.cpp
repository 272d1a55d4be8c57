#include "io/filesystem.h"
#include <c10/util/Exception.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "shorten.h"

namespace mantissa::io {
namespace {

std::string errno_text(int error) { return std::strerror(error); }

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};
using DirHandle = std::unique_ptr<DIR, DirCloser>;

DirHandle open_directory(const std::string& path) {
  DirHandle dir(::opendir(path.c_str()));
  TORCH_CHECK(dir != nullptr, "cannot list directory '", mantissa::detail::shorten_path(path),
              "': ", errno_text(errno));
  return dir;
}

// The names in `dir` (an open handle of `path`), without "." and "..".
std::vector<std::string> read_names(DIR* dir, const std::string& path) {
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      TORCH_CHECK(errno == 0, "cannot list directory '", mantissa::detail::shorten_path(path),
                  "': ", errno_text(errno));
      break;
    }
    const char* name = entry->d_name;
    if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
    names.emplace_back(name);
  }
  return names;
}

std::size_t remove_recursively(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return 0;
    TORCH_CHECK(false, "cannot remove '", mantissa::detail::shorten_path(path),
                "': ", errno_text(errno));
  }
  std::size_t removed = 0;
  if (S_ISDIR(info.st_mode)) {
    std::vector<std::string> names;
    {
      DirHandle dir = open_directory(path);
      names = read_names(dir.get(), path);
    }
    for (const auto& name : names) removed += remove_recursively(join_path(path, name));
    TORCH_CHECK(::rmdir(path.c_str()) == 0 || errno == ENOENT, "cannot remove directory '",
                mantissa::detail::shorten_path(path), "': ", errno_text(errno));
  } else {
    TORCH_CHECK(::unlink(path.c_str()) == 0 || errno == ENOENT, "cannot remove '",
                mantissa::detail::shorten_path(path), "': ", errno_text(errno));
  }
  return removed + 1;
}

}  // namespace

bool path_exists(const std::string& path) {
  struct stat info {};
  return !path.empty() && ::stat(path.c_str(), &info) == 0;
}

bool entry_exists(const std::string& path) {
  struct stat info {};
  return !path.empty() && ::lstat(path.c_str(), &info) == 0;
}

bool is_directory(const std::string& path) {
  struct stat info {};
  return !path.empty() && ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

void create_directories(const std::string& path) {
  TORCH_CHECK_VALUE(!path.empty(), "create_directories: the path is empty");
  // Walk the components from the root down: "a/b/c" creates "a", "a/b", "a/b/c".
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (prefix.empty() || prefix.back() == '/') continue;  // "//" or the root
    if (::mkdir(prefix.c_str(), 0777) == 0) continue;
    const int error = errno;
    struct stat info {};
    if (::stat(prefix.c_str(), &info) == 0) {
      TORCH_CHECK(S_ISDIR(info.st_mode), "cannot create directory '",
                  mantissa::detail::shorten_path(path), "': '",
                  mantissa::detail::shorten_path(prefix), "' exists and is not a directory");
      continue;
    }
    TORCH_CHECK(false, "cannot create directory '", mantissa::detail::shorten_path(prefix),
                "': ", errno_text(error));
  }
}

std::size_t remove_all(const std::string& path) {
  TORCH_CHECK_VALUE(!path.empty(), "remove_all: the path is empty");
  return remove_recursively(path);
}

std::vector<std::string> list_directory(const std::string& path) {
  DirHandle dir = open_directory(path);
  std::vector<std::string> names = read_names(dir.get(), path);
  std::sort(names.begin(), names.end());
  return names;
}

void rename_path(const std::string& from, const std::string& to) {
  TORCH_CHECK(std::rename(from.c_str(), to.c_str()) == 0, "cannot rename '",
              mantissa::detail::shorten_path(from), "' to '", mantissa::detail::shorten_path(to),
              "': ", errno_text(errno));
}

std::string make_temp_directory(const std::string& parent, const std::string& prefix) {
  std::string base = parent;
  if (base.empty()) {
    const char* tmpdir = std::getenv("TMPDIR");
    base = (tmpdir != nullptr && *tmpdir != '\0') ? tmpdir : "/tmp";
  }
  std::string templ = join_path(base, prefix + "XXXXXX");
  TORCH_CHECK(::mkdtemp(templ.data()) != nullptr, "cannot create a temporary directory '",
              mantissa::detail::shorten_path(templ), "': ", errno_text(errno));
  return templ;
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b.front() == '/')) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

}  // namespace mantissa::io
