#pragma once
// Arithmetic on sizes and step counts (batch sizes, steps, epochs, examples) that says when a
// result does not fit in int64, instead of wrapping around or converting a double that is out of
// range (undefined behaviour). Internal: the argument validation and the run's schedule use it
// to raise errors that name the flag.

#include <cstdint>
#include <limits>
#include <optional>

#include <c10/util/safe_numerics.h>

namespace mantissa::detail {

/// Largest value of a count: 9223372036854775807.
inline constexpr std::int64_t kMaxCount = std::numeric_limits<std::int64_t>::max();

/// `a * b`, or nullopt when the product does not fit in int64.
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (c10::mul_overflows(a, b, &out)) return std::nullopt;
  return out;
}

/// `ceil(a / b)` for `a >= 0`, `b > 0`; never overflows (unlike `(a + b - 1) / b`).
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

/// Whether `v` converts to int64 without overflow: `v` in [-2^63, 2^63). False for nan and inf.
inline bool fits_int64(double v) { return v >= -0x1p63 && v < 0x1p63; }

}  // namespace mantissa::detail
