#pragma once
// Entry points of the CUDA kernels in src/**/*.cu. Only called when MANTISSA_WITH_CUDA is set.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace mantissa::amp::cuda {

/// bf16 (or any floating dtype) unscale + non-finite check on CUDA; see
/// non_finite_check_and_unscale_.
void non_finite_check_and_unscale_(at::TensorList grads, at::Tensor& found_inf,
                                   const at::Tensor& inv_scale);

}  // namespace mantissa::amp::cuda
