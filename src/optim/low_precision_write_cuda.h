#pragma once
// The GPU kernel of the low-precision rules' write (low_precision_write.h). Internal: called by
// write_low_precision_ for CUDA tensors when the library is built with CUDA.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "optim/low_precision_write.h"

namespace mantissa::optim::detail::cuda {

/// Writes the fp32 `target` into the bf16/fp16 `param` under Kahan compensation (`comp`, the
/// parameter's dtype; `kahan`) or stochastic rounding keyed by `key`, element for element the
/// host's bits. All three contiguous, of one shape, on one GPU. Launches on the current stream;
/// no sync.
void write_low_precision(const at::Tensor& param, const at::Tensor& target, bool kahan,
                         const at::Tensor& comp, const RoundingKey& key);

}  // namespace mantissa::optim::detail::cuda
