#pragma once

#include <ATen/core/Tensor.h>

namespace mantissa::amp {

/// Mixin for optimizers whose step unscales the gradients and checks them for inf/nan
/// itself, reading the scale and the found-inf flag as device tensors (no host sync).
///
/// Python: an optimizer with `_step_supports_amp_scaling = True` (fused Adam/AdamW), to which
/// `GradScaler.step` hands `optimizer.grad_scale` and `optimizer.found_inf` before calling
/// `optimizer.step()`. `GradScaler::step` detects this interface with `dynamic_cast`.
class SupportsAmpScaling {
 public:
  virtual ~SupportsAmpScaling() = default;

  /// Set right before `step()`. `grad_scale` (0-d fp32) is the factor the gradients are still
  /// multiplied by, or undefined when `GradScaler::unscale_` already divided it out.
  /// `found_inf` (0-d fp32) is non-zero when the step must be skipped; when it is, the
  /// optimizer must leave parameters and state untouched.
  virtual void set_amp_scaling(const at::Tensor& grad_scale, const at::Tensor& found_inf) = 0;

  /// Called right after `step()`: forget the tensors given by `set_amp_scaling`.
  virtual void clear_amp_scaling() = 0;
};

}  // namespace mantissa::amp
