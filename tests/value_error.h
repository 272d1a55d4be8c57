#pragma once
// The message of a c10::ValueError, for tests of error paths.

#include <functional>
#include <string>

#include <c10/util/Exception.h>

namespace mantissa_test {

/// The message of the c10::ValueError that `f` throws, or a marker when it throws none (so that a
/// HasSubstr on the result fails).
inline std::string value_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "<no c10::ValueError>";
}

}  // namespace mantissa_test
