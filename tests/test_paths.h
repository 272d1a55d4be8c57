#pragma once
// Where the tests find the files of the source tree and the Python interpreter: the paths CMake
// compiled in, unless the environment names others (scripts/gpu-pack-run runs the tests of a
// pack built on another machine, where the tree and the interpreter live elsewhere).

#include <cstdlib>
#include <string>

namespace mantissa_test {

/// `$name` when it is set and not empty, else `compiled`.
inline std::string path_from_env(const char* name, const char* compiled) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : std::string(compiled);
}

/// tests/golden: MANTISSA_TEST_DATA_DIR from the environment, else from the build.
inline std::string test_data_dir() {
  return path_from_env("MANTISSA_TEST_DATA_DIR", MANTISSA_TEST_DATA_DIR);
}

/// docs/: MANTISSA_DOCS_DIR from the environment, else from the build.
inline std::string docs_dir() { return path_from_env("MANTISSA_DOCS_DIR", MANTISSA_DOCS_DIR); }

}  // namespace mantissa_test
