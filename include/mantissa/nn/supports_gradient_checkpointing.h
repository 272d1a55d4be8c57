#pragma once

#include <functional>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <mantissa/gradient_checkpointing_kwargs.h>
#include <mantissa/nn/checkpoint.h>

namespace mantissa::nn {

/// Mixin for a model whose blocks can run through `checkpoint`. Python: a `PreTrainedModel`
/// with `supports_gradient_checkpointing = True`, whose blocks test
/// `self.gradient_checkpointing and self.training`.
///
/// Derive the model from it beside `torch::nn::Module` and run each block through
/// `maybe_checkpoint(is_training(), fn, x)`. The Trainer calls `gradient_checkpointing_enable`
/// when `--gradient_checkpointing` is set (it finds this interface with `dynamic_cast`) and
/// refuses a model without it. Host state only; no device work.
class SupportsGradientCheckpointing {
 public:
  virtual ~SupportsGradientCheckpointing() = default;

  /// Turns checkpointing on for the blocks. Python:
  /// `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)`.
  void gradient_checkpointing_enable(const GradientCheckpointingKwargs& kwargs = {}) {
    enabled_ = true;
    kwargs_ = kwargs;
  }
  /// Turns it off. Python: `model.gradient_checkpointing_disable()`.
  void gradient_checkpointing_disable() { enabled_ = false; }
  /// Python: `model.is_gradient_checkpointing`.
  bool is_gradient_checkpointing() const { return enabled_; }
  /// The kwargs of the last `gradient_checkpointing_enable`.
  const GradientCheckpointingKwargs& gradient_checkpointing_kwargs() const { return kwargs_; }

 protected:
  /// `fn(x)` through `checkpoint` when checkpointing is on, `training` is true and grad mode
  /// is enabled; else `fn(x)` directly. `preserve_rng_state` follows the kwargs (default true).
  /// `fn` is kept and called again in the backward, after the model's `forward()` returned:
  /// capture per-forward tensors (RoPE tables, masks) by value, not by reference
  /// (docs/trainer.md, "Saving memory", shows a `ModuleList` of decoder layers).
  at::Tensor maybe_checkpoint(bool training, const std::function<at::Tensor(const at::Tensor&)>& fn,
                              const at::Tensor& x) const {
    if (!enabled_ || !training || !at::GradMode::is_enabled()) return fn(x);
    return checkpoint(fn, x, kwargs_.preserve_rng_state.value_or(true));
  }

 private:
  bool enabled_ = false;
  GradientCheckpointingKwargs kwargs_;
};

}  // namespace mantissa::nn
