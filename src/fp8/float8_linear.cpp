#include <mantissa/fp8/float8_linear.h>

#include <utility>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/linear.h>

#include "fp8/scaled_linear_function.h"

namespace mantissa::fp8 {

Float8LinearImpl::Float8LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) {
  reset();
}

Float8LinearImpl::Float8LinearImpl(const torch::nn::Linear& linear) : options(linear->options) {
  TORCH_CHECK_VALUE(!linear.is_empty(), "Float8Linear cannot wrap an empty torch::nn::Linear");
  weight = register_parameter("weight", linear->weight);
  if (options.bias()) {
    bias = register_parameter("bias", linear->bias);
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
}

void Float8LinearImpl::reset() {
  // A torch::nn::Linear built here draws the same random numbers in the same order, so a model
  // declared with Float8Linear starts from the weights it would have with torch::nn::Linear.
  torch::nn::LinearImpl reference(options);
  weight = register_parameter("weight", reference.weight);
  if (options.bias()) {
    bias = register_parameter("bias", reference.bias);
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
}

void Float8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "mantissa::fp8::Float8Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias() << ", fp8=" << (float8_ ? to_string(recipe_) : "off") << ")";
}

Float8Format Float8LinearImpl::fp8_format() const {
  return state_ ? state_->recipe().fp8_format() : format_;
}

void Float8LinearImpl::enable_current_scaling(Float8Format format) {
  float8_ = true;
  recipe_ = ScalingRecipe::kCurrent;
  format_ = format;
  state_.reset();
}

void Float8LinearImpl::enable_delayed_scaling(std::shared_ptr<Float8ScalingState> state,
                                              int64_t first_column) {
  TORCH_CHECK_VALUE(state != nullptr, "enable_delayed_scaling needs a Float8ScalingState");
  TORCH_CHECK_VALUE(first_column >= 0 && first_column + kScalesPerLayer <= state->num_scales(),
                    "FP8 columns [", first_column, ", ", first_column + kScalesPerLayer,
                    ") are not in the scaling state, which has ", state->num_scales(),
                    ": pass what add_layer() returned");
  float8_ = true;
  recipe_ = ScalingRecipe::kDelayed;
  format_ = state->recipe().fp8_format();
  state_ = std::move(state);
  first_column_ = first_column;
}

void Float8LinearImpl::disable_float8() {
  float8_ = false;
  state_.reset();
}

at::Tensor Float8LinearImpl::forward(const at::Tensor& input) {
  // at::linear, not torch::nn::functional::linear: for an input of more than two dims the
  // latter runs matmul and then adds the bias in place, which under autocast adds an fp32 bias
  // into the bf16 output element by element and keeps the bias out of the GEMM.
  if (!float8_) return at::linear(input, weight, bias);

  const int64_t in_features = options.in_features();
  const int64_t out_features = options.out_features();
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(-1) == in_features,
                    "Float8Linear(in_features=", in_features, ") got an input of shape ",
                    input.sizes());
  const c10::DeviceType device_type = input.device().type();
  detail::ScaledLinearPlan plan;
  plan.recipe = recipe_;
  plan.format = format_;
  plan.out_dtype = at::autocast::is_autocast_enabled(device_type)
                       ? at::autocast::get_autocast_dtype(device_type)
                       : input.scalar_type();
  TORCH_CHECK_VALUE(plan.out_dtype == c10::kFloat || plan.out_dtype == c10::kBFloat16 ||
                        plan.out_dtype == c10::kHalf,
                    "Float8Linear computes in float32, bfloat16 or float16 (the input's dtype, or "
                    "the autocast dtype), got ",
                    plan.out_dtype);
  TORCH_CHECK_VALUE(device_type != c10::kCUDA || (in_features % 16 == 0 && out_features % 16 == 0),
                    "Float8Linear on CUDA needs in_features and out_features divisible by 16 "
                    "(cuBLASLt's FP8 GEMM), got ",
                    in_features, " and ", out_features);
  if (state_) {
    if (state_->device() != input.device()) state_->to_(input.device());
    for (int64_t role = 0; role < kScalesPerLayer; ++role) {
      const int64_t column = first_column_ + role;
      plan.scale[role] = state_->scale(column);
      // Evaluation casts with the scales of training but leaves the history alone.
      if (is_training()) plan.amax_cell[role] = state_->current_amaxes().narrow(0, column, 1);
    }
  }
  const at::Tensor x2d = input.reshape({-1, in_features});
  const at::Tensor out = detail::scaled_linear(x2d, weight, bias, plan);
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape.back() = out_features;
  return out.view(shape);
}

}  // namespace mantissa::fp8
