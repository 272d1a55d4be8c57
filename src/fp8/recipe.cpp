#include <mantissa/fp8/recipe.h>

#include <c10/util/Exception.h>

namespace mantissa::fp8 {

void Float8Recipe::validate() const {
  TORCH_CHECK_VALUE(amax_history_len() >= 1, "fp8_amax_history_len must be at least 1, got ",
                    amax_history_len());
  TORCH_CHECK_VALUE(amax_history_len() <= kMaxAmaxHistoryLen,
                    "fp8_amax_history_len must be at most ", kMaxAmaxHistoryLen,
                    " (four times TransformerEngine's default of 1024), got ", amax_history_len());
  // 2^-64 of e4m3's 448 is still a normal float; beyond that the scales stop meaning anything.
  TORCH_CHECK_VALUE(margin() >= 0 && margin() <= 64, "fp8_margin must be in [0, 64], got ",
                    margin());
}

c10::ScalarType float8_dtype(Float8Format format, TensorRole role) {
  if (role == TensorRole::kGradOutput && format == Float8Format::kHybrid) return c10::kFloat8_e5m2;
  return c10::kFloat8_e4m3fn;
}

const char* to_string(ScalingRecipe recipe) {
  return recipe == ScalingRecipe::kCurrent ? "current" : "delayed";
}

const char* to_string(Float8Format format) {
  return format == Float8Format::kHybrid ? "HYBRID" : "E4M3";
}

const char* to_string(AmaxComputeAlgo algo) {
  return algo == AmaxComputeAlgo::kMax ? "max" : "most_recent";
}

}  // namespace mantissa::fp8
