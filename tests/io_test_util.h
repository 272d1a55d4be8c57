#pragma once
// Helpers for the file and Python-interop tests: a temporary folder, raw file writes, and
// running a Python script with the project venv's interpreter.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "io/filesystem.h"

namespace mantissa_test {

/// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() : path_(mantissa::io::make_temp_directory("", "mantissa-test-")) {}
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    try {
      mantissa::io::remove_all(path_);
    } catch (...) {
    }
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return mantissa::io::join_path(path_, name); }

 private:
  std::string path_;
};

/// Writes `bytes` to `path` with plain POSIX calls (no atomic rename), for hand-made files.
inline void write_raw_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << "cannot create " << path;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    ASSERT_GT(n, 0) << "cannot write " << path;
    done += static_cast<std::size_t>(n);
  }
  ASSERT_EQ(::close(fd), 0);
}

/// The Python interpreter the interop tests run: $MANTISSA_TEST_PYTHON when set (a pack's run on
/// another machine), else MANTISSA_PYTHON_EXECUTABLE (set by tests/CMakeLists.txt from
/// MANTISSA_PYTHON or the project venv); empty when there is none. `$MANTISSA_TEST_PYTHON` may
/// be a bare name (python3), looked up on PATH by the shell that runs it.
inline std::string python_executable() {
  const char* from_env = std::getenv("MANTISSA_TEST_PYTHON");
  if (from_env != nullptr && *from_env != '\0') return from_env;
#ifdef MANTISSA_PYTHON_EXECUTABLE
  const std::string python = MANTISSA_PYTHON_EXECUTABLE;
  if (!python.empty() && ::access(python.c_str(), X_OK) == 0) return python;
#endif
  return {};
}

struct PythonResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

/// Runs `script` (Python source) with `python`, passing `argument` as sys.argv[1].
inline PythonResult run_python(const std::string& python, const std::string& script,
                               const std::string& argument, const std::string& scratch_dir) {
  const std::string script_path = mantissa::io::join_path(scratch_dir, "script.py");
  write_raw_file(script_path, script);
  const std::string command = "'" + python + "' '" + script_path + "' '" + argument + "' 2>&1";
  PythonResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

/// Skips the test, with the reason, unless the interop interpreter exists and imports all of
/// `modules` (a Python import statement's list, e.g. "torch, safetensors.torch"). Sets `python`.
#define MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(python, modules, scratch_dir)                  \
  do {                                                                                      \
    python = ::mantissa_test::python_executable();                                          \
    if (python.empty()) {                                                                   \
      GTEST_SKIP() << "no Python interpreter for the interop test (configure with "         \
                      "-DMANTISSA_PYTHON=<python> or create .venv with scripts/bootstrap)"; \
    }                                                                                       \
    const auto probe =                                                                      \
        ::mantissa_test::run_python(python, "import " modules "\n", "", scratch_dir);       \
    if (probe.exit_code != 0) {                                                             \
      GTEST_SKIP() << "'" << python << "' cannot import " modules << ": " << probe.output;  \
    }                                                                                       \
  } while (0)

}  // namespace mantissa_test
