#pragma once
// What every fuzz target shares: a scratch folder for the bytes under test, and the rule that
// a reader of outside bytes may refuse them with an exception but must not crash.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <c10/util/Exception.h>

#include "io/filesystem.h"

namespace mantissa_fuzz {

/// A folder under $TMPDIR for the whole fuzzing run, removed at exit. The path lives on the
/// heap and is never freed: the exit handler runs after static strings are destroyed.
inline const std::string& scratch_dir() {
  static const std::string* const dir = [] {
    auto* made = new std::string(mantissa::io::make_temp_directory("", "mantissa-fuzz-"));
    std::atexit([] {
      try {
        mantissa::io::remove_all(*dir);
      } catch (...) {
      }
    });
    return made;
  }();
  return *dir;
}

/// Writes `bytes` to `path`, replacing it (plain stdio: no fsync, which would cost more than
/// the read under test).
inline void write_bytes(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  if (std::fclose(f) != 0) std::abort();
}

/// Runs `fn`; a c10::Error or any other std::exception is a refusal and fine. Anything that
/// escapes (a crash, a sanitizer report, an exception of another type) is a finding.
template <class Fn>
void expect_no_crash(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception&) {
  }
}

}  // namespace mantissa_fuzz
