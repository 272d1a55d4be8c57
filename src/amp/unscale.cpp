#include <mantissa/amp/unscale.h>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/grad_mode.h>

#include "amp/cuda_kernels.h"

namespace mantissa::amp {
namespace {

void check_arguments(at::TensorList grads, const at::Tensor& found_inf,
                     const at::Tensor& inv_scale) {
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::kFloat, "found_inf must be a float tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::kFloat, "inv_scale must be a float tensor.");
  for (const auto& g : grads) {
    TORCH_CHECK(g.device() == grads[0].device() && g.scalar_type() == grads[0].scalar_type(),
                "non_finite_check_and_unscale_: all gradients must share one device and dtype, "
                "got ",
                grads[0].device(), "/", grads[0].scalar_type(), " and ", g.device(), "/",
                g.scalar_type());
    TORCH_CHECK(g.layout() == at::kStrided, "scaled_grad must be a strided (not sparse) Tensor.");
  }
}

bool aten_has_kernel(const at::Tensor& grad) {
  // ATen's CUDA kernel dispatches float, double and half only (pytorch issue #127176).
  return !(grad.is_cuda() && grad.scalar_type() == at::kBFloat16);
}

}  // namespace

void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale) {
  if (grads.empty()) return;
  check_arguments(grads, found_inf, inv_scale);
  if (aten_has_kernel(grads[0])) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
#ifdef MANTISSA_WITH_CUDA
  cuda::non_finite_check_and_unscale_(grads, found_inf, inv_scale);
#else
  detail::non_finite_check_and_unscale_fallback_(grads, found_inf, inv_scale);
#endif
}

bool cuda_kernels_built() noexcept {
#ifdef MANTISSA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace detail {

void non_finite_check_and_unscale_fallback_(at::TensorList grads, at::Tensor& found_inf,
                                            const at::Tensor& inv_scale) {
  check_arguments(grads, found_inf, inv_scale);
  at::NoGradGuard no_grad;
  for (const auto& grad : grads) {
    auto nonfinite =
        at::logical_not(at::isfinite(grad)).any().to(at::kFloat).reshape(found_inf.sizes());
    found_inf.copy_(at::maximum(found_inf, nonfinite));
    // In opmath (fp32 for half/bf16) and rounded once to the grad's dtype, as ATen's kernels
    // do. Where inv_scale is exactly 1 the multiply is an identity, so ATen's skip of it
    // changes nothing.
    const auto opmath = at::toOpMathType(grad.scalar_type());
    auto grad_mut = grad;  // TensorList holds const Tensors; the storage is shared.
    grad_mut.copy_(grad.to(opmath).mul_(inv_scale.reshape({}).to(opmath)));
  }
}

}  // namespace detail
}  // namespace mantissa::amp
