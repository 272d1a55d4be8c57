#pragma once

#include <utility>

/// Declares an option field with a chained setter and a getter, exactly like LibTorch's
/// `TORCH_ARG` (torch/arg.h):
///
///     struct Options { MANTISSA_ARG(double, lr) = 1e-3; };
///     Options().lr(3e-4).lr();   // setter returns *this, getter returns the value
///
/// The field itself is `lr_`, private; a default is given in-class after the macro.
#define MANTISSA_ARG(T, name)                                            \
 public:                                                                 \
  inline auto name(const T& new_##name)->decltype(*this) { /* NOLINT */ \
    this->name##_ = new_##name;                                          \
    return *this;                                                        \
  }                                                                      \
  inline auto name(T&& new_##name)->decltype(*this) { /* NOLINT */      \
    this->name##_ = std::move(new_##name);                               \
    return *this;                                                        \
  }                                                                      \
  inline const T& name() const noexcept { /* NOLINT */                  \
    return this->name##_;                                                \
  }                                                                      \
  inline T& name() noexcept { /* NOLINT */                              \
    return this->name##_;                                                \
  }                                                                      \
                                                                         \
 private:                                                                \
  T name##_ /* NOLINT */
