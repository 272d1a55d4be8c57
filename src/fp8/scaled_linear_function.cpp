#include "fp8/scaled_linear_function.h"

#include <optional>

#include <ATen/ATen.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <mantissa/fp8/cast.h>

#include "fp8/amax_record.h"

namespace mantissa::fp8::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The scale a tensor with amax `amax` is cast with, recording the amax for the delayed
/// recipe. The delayed scale gets `0 * amax` added: +0 for a finite amax, NaN for inf or NaN,
/// so an overflow in this tensor reaches the output as NaN (for the loss scaler) instead of
/// being clamped away; the stored scale is untouched.
at::Tensor scale_for(const ScaledLinearPlan& plan, TensorRole role, const at::Tensor& amax,
                     c10::ScalarType dtype) {
  if (plan.recipe == ScalingRecipe::kCurrent) return current_scale(amax, dtype);
  const auto index = static_cast<int64_t>(role);
  if (plan.amax_cell[index].defined()) record_amax_(plan.amax_cell[index], amax);
  return plan.scale[index] + amax * 0;
}

/// CUDA's FP8 GEMM wants every inner dimension a multiple of 16. The token count M is the inner
/// dimension of grad_weight = dYᵀ·x; zero rows added to both operands change nothing.
at::Tensor pad_rows_to_16(const at::Tensor& t) {
  const int64_t extra = (16 - t.size(0) % 16) % 16;
  if (extra == 0 || !t.is_cuda()) return t;
  return at::cat({t, at::zeros({extra, t.size(1)}, t.options())});
}

/// mat2 of _scaled_mm column-major, as cuBLASLt requires: the same values, transposed storage.
at::Tensor column_major(const at::Tensor& t) { return t.t().contiguous().t(); }

/// Autocast stays out of both passes: the FP8 GEMMs choose their own output dtype, and CPU
/// autocast would otherwise turn the fp32 matmul of the emulated _scaled_mm into a bf16 one.
class ScaledLinearFunction : public torch::autograd::Function<ScaledLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& maybe_bias,
                            const ScaledLinearPlan& plan) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const at::Tensor bias = maybe_bias.value_or(at::Tensor());
    const c10::ScalarType x_dtype = float8_dtype(plan.format, TensorRole::kInput);
    const c10::ScalarType w_dtype = float8_dtype(plan.format, TensorRole::kWeight);
    const at::Tensor x_scale = scale_for(plan, TensorRole::kInput, tensor_amax(x), x_dtype);
    const at::Tensor w_scale = scale_for(plan, TensorRole::kWeight, tensor_amax(weight), w_dtype);
    const at::Tensor x8 = quantize(x, x_scale, x_dtype);       // [M, K] row-major
    const at::Tensor w8 = quantize(weight, w_scale, w_dtype);  // [N, K] row-major
    // _scaled_mm's scales undo the quantization: 1/scale.
    const at::Tensor x_inv = x_scale.reciprocal();
    const at::Tensor w_inv = w_scale.reciprocal();
    // The bias joins the fp32 accumulator before the one rounding to out_dtype; _scaled_mm
    // takes no bias for fp32 outputs, so there it is added afterwards, still in fp32.
    const bool bias_in_gemm = bias.defined() && plan.out_dtype != c10::kFloat;
    std::optional<at::Tensor> gemm_bias;
    if (bias_in_gemm) gemm_bias = bias.to(plan.out_dtype);
    at::Tensor out = at::_scaled_mm(x8, w8.t(), x_inv, w_inv, gemm_bias, std::nullopt,
                                    plan.out_dtype, /*use_fast_accum=*/true);
    if (bias.defined() && !bias_in_gemm) out.add_(bias);

    ctx->save_for_backward({x8, w8, x_inv, w_inv});
    ctx->saved_data["recipe"] = static_cast<int64_t>(plan.recipe);
    ctx->saved_data["format"] = static_cast<int64_t>(plan.format);
    ctx->saved_data["out_dtype"] = static_cast<int64_t>(plan.out_dtype);
    ctx->saved_data["has_bias"] = bias.defined();
    const auto g = static_cast<int64_t>(TensorRole::kGradOutput);
    ctx->saved_data["g_scale"] = plan.scale[g];
    ctx->saved_data["g_amax_cell"] = plan.amax_cell[g];
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x8 = saved[0];
    const at::Tensor& w8 = saved[1];
    const at::Tensor& x_inv = saved[2];
    const at::Tensor& w_inv = saved[3];
    ScaledLinearPlan plan;
    plan.recipe = static_cast<ScalingRecipe>(ctx->saved_data["recipe"].toInt());
    plan.format = static_cast<Float8Format>(ctx->saved_data["format"].toInt());
    plan.out_dtype = static_cast<c10::ScalarType>(ctx->saved_data["out_dtype"].toInt());
    const auto g = static_cast<int64_t>(TensorRole::kGradOutput);
    plan.scale[g] = ctx->saved_data["g_scale"].toTensor();
    plan.amax_cell[g] = ctx->saved_data["g_amax_cell"].toTensor();

    const at::Tensor grad_out = grads[0].contiguous();  // [M, N]
    const c10::ScalarType g_dtype = float8_dtype(plan.format, TensorRole::kGradOutput);
    const at::Tensor g_scale =
        scale_for(plan, TensorRole::kGradOutput, tensor_amax(grad_out), g_dtype);
    const at::Tensor g8 = quantize(grad_out, g_scale, g_dtype);
    const at::Tensor g_inv = g_scale.reciprocal();

    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {  // [M, N] · [N, K]
      grad_x = at::_scaled_mm(g8, column_major(w8), g_inv, w_inv, std::nullopt, std::nullopt,
                              plan.out_dtype, /*use_fast_accum=*/false);
    }
    if (ctx->needs_input_grad(1)) {  // [N, M] · [M, K]
      grad_w = at::_scaled_mm(pad_rows_to_16(g8).t().contiguous(), column_major(pad_rows_to_16(x8)),
                              g_inv, x_inv, std::nullopt, std::nullopt, plan.out_dtype,
                              /*use_fast_accum=*/false);
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      grad_b = grad_out.sum(0, /*keepdim=*/false, c10::kFloat);
    }
    return {grad_x, grad_w, grad_b, at::Tensor()};
  }
};

}  // namespace

at::Tensor scaled_linear(const at::Tensor& x2d, const at::Tensor& weight, const at::Tensor& bias,
                         const ScaledLinearPlan& plan) {
  // An undefined tensor cannot be an input of a custom function; an empty optional can.
  std::optional<at::Tensor> maybe_bias;
  if (bias.defined()) maybe_bias = bias;
  return ScaledLinearFunction::apply(x2d, weight, maybe_bias, plan);
}

}  // namespace mantissa::fp8::detail
