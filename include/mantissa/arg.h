#pragma once

#include <utility>

/// Declares an option field with a chained setter and getters, in the style of LibTorch's
/// `TORCH_ARG` (torch/arg.h):
///
///     struct Options { MANTISSA_ARG(double, lr) = 1e-3; };
///     Options().lr(3e-4).lr();   // setter returns *this, getter returns the value
///
/// The field itself is `lr_`, private; a default is given in-class after the macro. Unlike
/// `TORCH_ARG`, a non-const object also has a mutable getter (`T& lr()`), so a field can be
/// changed in place (`args.tf32().reset()`, `options.betas() = {0.9, 0.95}`).
#define MANTISSA_ARG(T, name)                                           \
 public:                                                                \
  inline auto name(const T& new_##name)->decltype(*this) { /* NOLINT */ \
    this->name##_ = new_##name;                                         \
    return *this;                                                       \
  }                                                                     \
  inline auto name(T&& new_##name)->decltype(*this) { /* NOLINT */      \
    this->name##_ = std::move(new_##name);                              \
    return *this;                                                       \
  }                                                                     \
  inline const T& name() const noexcept { /* NOLINT */                  \
    return this->name##_;                                               \
  }                                                                     \
  inline T& name() noexcept { /* NOLINT */                              \
    return this->name##_;                                               \
  }                                                                     \
                                                                        \
 private:                                                               \
  T name##_ /* NOLINT */
