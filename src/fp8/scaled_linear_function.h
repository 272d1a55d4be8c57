#pragma once
// The autograd function behind Float8Linear: three at::_scaled_mm GEMMs, since 2.11 has no
// derivative for _scaled_mm.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <mantissa/fp8/recipe.h>

namespace mantissa::fp8::detail {

/// Where one forward and its backward take their scales from.
struct ScaledLinearPlan {
  ScalingRecipe recipe = ScalingRecipe::kCurrent;
  Float8Format format = Float8Format::kHybrid;
  /// dtype of the output and of the gradients (the autocast dtype, else the input's).
  c10::ScalarType out_dtype = c10::kFloat;
  /// Delayed only: 1-element views of the state's scales and of its amax row, per TensorRole.
  /// Undefined amax views record nothing (evaluation).
  at::Tensor scale[kScalesPerLayer];
  at::Tensor amax_cell[kScalesPerLayer];
};

/// y = x2d · weightᵀ + bias in FP8 as `plan` says, differentiable in all three (bias may be
/// undefined). x2d is [M, K], weight [N, K]; y is [M, N] in `plan.out_dtype`.
at::Tensor scaled_linear(const at::Tensor& x2d, const at::Tensor& weight, const at::Tensor& bias,
                         const ScaledLinearPlan& plan);

}  // namespace mantissa::fp8::detail
