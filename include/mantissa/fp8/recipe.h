#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

#include <mantissa/arg.h>

/// What an FP8 layer does with its three tensors (input, weight, grad_output): which FP8 dtype
/// each one is cast to, and where its scale comes from. Plain values, no tensors.
namespace mantissa::fp8 {

/// Where a tensor's scale comes from.
enum class ScalingRecipe {
  /// "current": from the tensor's own amax, just before the cast (torchao's "tensorwise",
  /// TransformerEngine's `Float8CurrentScaling`). Needs no state.
  kCurrent,
  /// "delayed": from an amax history of earlier steps (TransformerEngine's `DelayedScaling`),
  /// kept in a `Float8ScalingState` and updated once per optimizer step.
  kDelayed,
};

/// Which FP8 dtypes the forward and the backward use. Python: `transformer_engine.common.recipe.
/// Format` (pure E5M2 is refused there as here: it is not a member).
enum class Float8Format {
  /// "HYBRID": e4m3 (max 448) for input and weight, e5m2 (max 57344) for grad_output.
  kHybrid,
  /// "E4M3": e4m3 for all three.
  kE4M3,
};

/// How the delayed recipe reduces the amax history to one amax. Python: `DelayedScaling`'s
/// `amax_compute_algo`.
enum class AmaxComputeAlgo {
  kMax,         ///< "max": the largest amax of the window (NaN entries count as 0, as TE's fmaxf)
  kMostRecent,  ///< "most_recent": the amax of the last step only
};

/// The three tensors of a linear layer that get a scale of their own, in slot order.
enum class TensorRole : int64_t {
  kInput = 0,       ///< the layer's input `x` (forward)
  kWeight = 1,      ///< the weight `W` (forward)
  kGradOutput = 2,  ///< the incoming gradient `dY` (backward)
};

/// Number of scales one layer owns (one per `TensorRole`).
inline constexpr int64_t kScalesPerLayer = 3;

/// The longest amax history `Float8Recipe::validate` accepts: four times TransformerEngine's
/// default of 1024, the longest history its recipes use (torchao's delayed scaling kept 16).
/// The history is [length, 3 per layer] float32, copied and reduced every optimizer step, so
/// a longer one only costs memory and time (1e9 would be 12 GB per layer).
inline constexpr int64_t kMaxAmaxHistoryLen = 4096;

/// The FP8 training recipe of a run. Field names and defaults are TransformerEngine's
/// `DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
/// amax_compute_algo="max")`; the history fields only matter for `kDelayed`.
struct Float8Recipe {
  /// `fp8_recipe`: "current" or "delayed".
  MANTISSA_ARG(ScalingRecipe, recipe) = ScalingRecipe::kDelayed;
  /// `fp8_format`: "HYBRID" or "E4M3".
  MANTISSA_ARG(Float8Format, fp8_format) = Float8Format::kHybrid;
  /// `fp8_amax_history_len`: steps the delayed recipe remembers; 1 to `kMaxAmaxHistoryLen`.
  MANTISSA_ARG(int64_t, amax_history_len) = 1024;
  /// `fp8_amax_compute_algo`: "max" or "most_recent".
  MANTISSA_ARG(AmaxComputeAlgo, amax_compute_algo) = AmaxComputeAlgo::kMax;
  /// `fp8_margin`: the scale is divided by 2^margin, leaving headroom above the amax; >= 0.
  MANTISSA_ARG(int64_t, margin) = 0;

 public:
  /// Throws `c10::ValueError` naming the field and its value when `amax_history_len` is
  /// outside [1, `kMaxAmaxHistoryLen`] or `margin` is negative or above 64.
  void validate() const;
};

/// The FP8 dtype `format` gives a tensor of `role`: e4m3 for input and weight, e5m2 or e4m3 for
/// the gradient.
c10::ScalarType float8_dtype(Float8Format format, TensorRole role);

/// "current" / "delayed", "HYBRID" / "E4M3", "max" / "most_recent": the spellings of
/// TransformerEngine and of the command line.
const char* to_string(ScalingRecipe recipe);
const char* to_string(Float8Format format);
const char* to_string(AmaxComputeAlgo algo);

}  // namespace mantissa::fp8
