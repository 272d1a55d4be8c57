// Unscale + non-finite check on CUDA for the dtypes ATen's kernel lacks (bf16: pytorch issue
// #127176). One elementwise pass per gradient through TensorIterator, so any strides work.
// Same arithmetic as ATen's: opmath(val) * inv_scale, rounded once, skipped when inv_scale == 1.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/native/TensorIterator.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/native/cuda/Loops.cuh>

#include "amp/cuda_kernels.h"

namespace mantissa::amp::cuda {

void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale) {
  TORCH_CHECK(found_inf.is_cuda() && inv_scale.is_cuda(),
              "found_inf and inv_scale must be CUDA tensors.");
  const c10::cuda::CUDAGuard device_guard(found_inf.device());
  for (const auto& grad : grads) {
    TORCH_CHECK(grad.is_cuda(), "scaled_grad must be a CUDA tensor.");
    auto grad_mut = grad;
    auto iter = at::TensorIterator::unary_op(grad_mut, grad_mut);
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, iter.dtype(), "mantissa_non_finite_check_and_unscale_cuda", [&] {
          float* found_inf_ptr = found_inf.data_ptr<float>();
          const float* inv_scale_ptr = inv_scale.const_data_ptr<float>();
          using opmath_t = at::opmath_type<scalar_t>;
          at::native::gpu_kernel(iter, [=] GPU_LAMBDA(scalar_t val) -> scalar_t {
            const auto fval = static_cast<opmath_t>(val);
            if (!isfinite(fval)) {
              *found_inf_ptr = 1.f;
            }
            const auto inv = static_cast<opmath_t>(*inv_scale_ptr);
            return static_cast<scalar_t>(inv == opmath_t(1) ? fval : fval * inv);
          });
        });
  }
}

}  // namespace mantissa::amp::cuda
