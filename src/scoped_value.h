#pragma once
// One RAII guard for a value that must be put back: set for a scope, restored at its end, also
// when an exception passes.

#include <utility>

namespace mantissa::detail {

/// Sets `slot` to `value` for the guard's lifetime and puts the old value back at its end.
/// Python: `contextlib` around an attribute (`unittest.mock.patch.object`'s restore).
template <typename T>
class ScopedValue {
 public:
  ScopedValue(T& slot, T value) : slot_(slot), saved_(std::exchange(slot, std::move(value))) {}
  ~ScopedValue() { slot_ = std::move(saved_); }
  ScopedValue(const ScopedValue&) = delete;
  ScopedValue& operator=(const ScopedValue&) = delete;

 private:
  T& slot_;
  T saved_;
};

}  // namespace mantissa::detail
