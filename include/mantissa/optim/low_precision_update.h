#pragma once

#include <cstdint>
#include <string>

#include <c10/util/Exception.h>

namespace mantissa::optim {

/// How an optimizer writes its fp32 result into a bfloat16/float16 parameter that has no fp32
/// master copy (pure low-precision training). fp32 and fp64 parameters, and fp32 masters, are
/// unaffected: their results are stored as they are.
///
/// - `kNearest`: round to the nearest representable value (PyTorch's `p.add_()` on a bf16
///   tensor). An update smaller than half a unit in the last place of the weight is lost:
///   for bf16, whenever it is below about 1/256 of the weight.
/// - `kKahan`: keep a compensation buffer in the parameter's dtype that holds the part of each
///   update the rounding lost, and add it to the next update (Kahan summation). Python: optimi's
///   `AdamW(kahan_sum=True)`.
/// - `kStochasticRounding`: round up or down at random, with the probability of rounding up equal
///   to the discarded fraction of a unit in the last place, so the stored value is right on
///   average. Python: torchao's `_AdamW(bf16_stochastic_round=True)`.
enum class LowPrecisionUpdate : std::int8_t { kNearest, kKahan, kStochasticRounding };

/// The option's spelling at the edge (CLI, JSON, checkpoints): "nearest", "kahan",
/// "stochastic_rounding".
inline const char* to_string(LowPrecisionUpdate rule) {
  switch (rule) {
    case LowPrecisionUpdate::kNearest:
      return "nearest";
    case LowPrecisionUpdate::kKahan:
      return "kahan";
    case LowPrecisionUpdate::kStochasticRounding:
      return "stochastic_rounding";
  }
  return "nearest";
}

/// Reads a spelling of `to_string`. Throws `c10::ValueError` naming the text otherwise.
inline LowPrecisionUpdate parse_low_precision_update(const std::string& text) {
  if (text == "nearest") return LowPrecisionUpdate::kNearest;
  if (text == "kahan") return LowPrecisionUpdate::kKahan;
  TORCH_CHECK_VALUE(text == "stochastic_rounding",
                    "low_precision_update must be nearest, kahan or stochastic_rounding; got '",
                    text, "'");
  return LowPrecisionUpdate::kStochasticRounding;
}

}  // namespace mantissa::optim
