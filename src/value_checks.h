#pragma once
// Where a tensor read from a file holds values no run can have (NaN, inf, a negative second
// moment, a zero scale): how many, and the first one with its position, for an error message.
// Internal: the readers of optimizer.pt, master_weights.pt and fp8_state.pt run it once per
// tensor on resume.

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

namespace mantissa::detail {

/// The elements of a tensor that a check refused.
struct BadValues {
  std::int64_t count = 0;  ///< how many
  std::int64_t numel = 0;  ///< of how many
  std::int64_t first = 0;  ///< the flat index of the first
  double value = 0;        ///< its value

  /// "2 of its 12 values (the first, nan, at flat index 5)".
  std::string text() const {
    return c10::str(count, " of its ", numel, " values (the first, ", value, ", at flat index ",
                    first, ")");
  }
};

/// The elements of `values` where `bad` (a bool tensor of the same shape) is true, or nullopt
/// when there are none. Syncs (reads the count).
inline std::optional<BadValues> find_bad_values(const at::Tensor& values, const at::Tensor& bad) {
  const auto flat = bad.reshape({-1});
  const auto count = flat.sum().item<std::int64_t>();
  if (count == 0) return std::nullopt;
  BadValues found;
  found.count = count;
  found.numel = values.numel();
  found.first = flat.to(at::kByte).argmax().item<std::int64_t>();  // the first true
  found.value = values.reshape({-1})[found.first].item<double>();
  return found;
}

/// NaN and infinite elements of a floating-point `values`. Syncs.
inline std::optional<BadValues> find_nonfinite(const at::Tensor& values) {
  return find_bad_values(values, values.isfinite().logical_not());
}

/// NaN, infinite and negative elements of a floating-point `values`. Syncs.
inline std::optional<BadValues> find_nonfinite_or_negative(const at::Tensor& values) {
  return find_bad_values(values, values.isfinite().logical_not().logical_or_(values.lt(0)));
}

}  // namespace mantissa::detail
