#pragma once
// Shared by the scaling state and the autograd function, which records into a saved view.

#include <ATen/ATen.h>

namespace mantissa::fp8::detail {

/// `cell` (a 1-element view into the amax history's row 0) becomes max(cell, amax), NaN
/// sticking, so the micro-batches of an accumulation group count together. No sync.
inline void record_amax_(const at::Tensor& cell, const at::Tensor& amax) {
  cell.copy_(at::maximum(cell, amax.reshape({1}).to(cell.scalar_type())));
}

}  // namespace mantissa::fp8::detail
