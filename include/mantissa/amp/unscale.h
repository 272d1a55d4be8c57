#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace mantissa::amp {

/// Multiplies every gradient in `grads` in place by `inv_scale` and writes 1.0 into
/// `found_inf` if any element of any gradient is inf or nan. One pass over each gradient.
///
/// Python: `torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)`,
/// and bit-identical to it: each element is computed as `float(g) * inv_scale` rounded to
/// the gradient's dtype, and left as is when `inv_scale == 1`.
///
/// `grads` share one device and one dtype; `found_inf` and `inv_scale` are 1-element fp32
/// tensors on that device, and `found_inf` is pre-zeroed by the caller. Where ATen has no
/// kernel for the device and dtype (bf16 on CUDA, pytorch issue #127176) mantissa's own
/// kernel runs. Never syncs with the device.
void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale);

/// True when this build of mantissa carries its CUDA kernels (MANTISSA_CUDA at build time).
bool cuda_kernels_built() noexcept;

namespace detail {
/// The portable fallback: plain ATen ops, any device and floating dtype. Two passes per
/// gradient (check, multiply), so only used where no fused kernel exists. Exposed for tests.
void non_finite_check_and_unscale_fallback_(at::TensorList grads, at::Tensor& found_inf,
                                            const at::Tensor& inv_scale);
}  // namespace detail

}  // namespace mantissa::amp
