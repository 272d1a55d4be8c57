#pragma once

#include <cstdint>
#include <memory>
#include <ostream>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <mantissa/fp8/recipe.h>
#include <mantissa/fp8/scaling_state.h>

namespace mantissa::fp8 {

/// A `torch::nn::Linear` whose three GEMMs can run in FP8 on `at::_scaled_mm`. Until FP8 is
/// switched on (by `convert_to_float8_training`, or `enable_current_scaling` /
/// `enable_delayed_scaling`) it is exactly a `torch::nn::Linear`: the same options, the same
/// initialization (it draws the same random numbers), the same parameter names `weight` and
/// `bias`, the same forward. Declare a model's linear layers with this type to make them
/// convertible: C++ cannot retarget a `torch::nn::Linear` member from outside the model.
///
/// In FP8, with `y = x Wᵀ + b` (x flattened to [M, K], W [N, K]):
///   output      = x·Wᵀ   e4m3 x e4m3 (fast accumulation)
///   grad_input  = dY·W   e5m2 x e4m3 under HYBRID, e4m3 x e4m3 under E4M3
///   grad_weight = dYᵀ·x  the same formats
/// each operand scaled per tensor and cast with saturation, the second operand laid out
/// column-major as cuBLASLt requires. The output and the gradients come out in the autocast
/// dtype of the input's device (the input's dtype without autocast); the bias is added inside
/// the GEMM before its result is rounded (after it, in fp32, for fp32 outputs), and its
/// gradient is summed in fp32. Python: torchao's `Float8Linear` (current scaling) and
/// TransformerEngine's `te.Linear` under `fp8_autocast(DelayedScaling)`. No host sync on CUDA;
/// CPU `_scaled_mm` reads its scales on the host.
class Float8LinearImpl : public torch::nn::Cloneable<Float8LinearImpl> {
 public:
  Float8LinearImpl(int64_t in_features, int64_t out_features)
      : Float8LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  /// Python: `torch.nn.Linear(in_features, out_features, bias=True)`.
  explicit Float8LinearImpl(const torch::nn::LinearOptions& options);
  /// Shares the weight and bias tensors of `linear` (no copy): Python's
  /// `Float8Linear.from_float(mod)`.
  explicit Float8LinearImpl(const torch::nn::Linear& linear);

  /// Creates and registers the parameters with `torch::nn::Linear`'s initialization.
  void reset() override;
  /// "mantissa::fp8::Float8Linear(in_features=64, out_features=32, bias=true, fp8=delayed)".
  void pretty_print(std::ostream& stream) const override;

  /// The layer on `input` [..., in_features]. Python: `layer(input)`.
  at::Tensor forward(const at::Tensor& input);

  /// Runs in FP8 with scales from each tensor's own amax (torchao's tensorwise recipe).
  void enable_current_scaling(Float8Format format = Float8Format::kHybrid);
  /// Runs in FP8 with the scales of columns [first_column, first_column + 3) of `state`
  /// (what `state->add_layer()` returned), recording this layer's amaxes there.
  void enable_delayed_scaling(std::shared_ptr<Float8ScalingState> state, int64_t first_column);
  /// Back to the high-precision `torch::nn::Linear` forward.
  void disable_float8();

  /// Whether forward runs in FP8.
  bool is_float8() const { return float8_; }
  /// The recipe in use (meaningful when `is_float8()`).
  ScalingRecipe scaling_recipe() const { return recipe_; }
  /// The format in use (the state's for delayed scaling).
  Float8Format fp8_format() const;

  /// Python: `layer.in_features` etc., through the options.
  torch::nn::LinearOptions options;
  /// [out_features, in_features], as `torch::nn::Linear::weight`.
  at::Tensor weight;
  /// [out_features], undefined when `options.bias()` is false.
  at::Tensor bias;

 private:
  bool float8_ = false;
  ScalingRecipe recipe_ = ScalingRecipe::kCurrent;
  Float8Format format_ = Float8Format::kHybrid;
  std::shared_ptr<Float8ScalingState> state_;  // delayed only
  int64_t first_column_ = 0;
};

/// The module holder of `Float8LinearImpl`, as `torch::nn::Linear` is of `LinearImpl`.
TORCH_MODULE(Float8Linear);

}  // namespace mantissa::fp8
