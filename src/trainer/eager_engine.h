#pragma once
// The eager step: every op dispatched as the loop reaches it.

#include <cstdint>

#include "trainer/step_engine.h"

namespace mantissa::detail {

/// Forward and backward under autocast, then at the accumulation boundary the update: master
/// gradients, unscale and clip (only when `max_grad_norm` > 0), `on_pre_optimizer_step`, the
/// scaler's step, the cast back into the model (unless FusedAdamW wrote it), the loss-scale
/// update; then on the host: whether the step was skipped, `on_optimizer_step`, the scheduler
/// (only after a step that ran), cleared gradients. Python: HF's `training_step` +
/// `accelerator.clip_grad_norm_` + `optimizer.step()` with `torch.amp.GradScaler`.
///
/// The halves are public so that an engine composing this one (the CUDA-graph engine) can
/// capture the device half and run the host half after each replay.
class EagerEngine final : public StepEngine {
 public:
  /// An engine over `parts`; whether FusedAdamW writes the model back is read here, once.
  explicit EagerEngine(StepParts parts);

  /// See StepEngine::train_batch.

  bool train_batch(const Batch& batch, std::int64_t in_group, bool boundary) override;
  /// See StepEngine::last_grad_norm.
  torch::Tensor last_grad_norm() const override { return grad_norm_; }

  /// Forward and backward of one micro-batch, whose loss counts 1/`in_group`, and its loss
  /// into the loss window. In a data-parallel run the backward averages the gradients across
  /// the processes when `sync_gradients` (the group's last micro-batch); the others accumulate
  /// locally, as under DDP's `no_sync()`. No sync with the device.
  void forward_backward(const Batch& batch, std::int64_t in_group, bool sync_gradients = true);

  /// The device half of the update at an accumulation boundary, ending with each registered
  /// piece of state's `after_optimizer_step` (saved_state.h; a collective where it
  /// communicates). No sync, so it can be captured in a CUDA graph, where the host-side
  /// `on_pre_optimizer_step` does not belong: `with_callbacks` false then.
  void update_on_device(bool with_callbacks);

  /// The host half: whether the update was skipped (a sync, only with loss scaling), with its
  /// log line and the consecutive-skip error, `on_optimizer_step`, the scheduler, and when
  /// `zero_grads` the gradients cleared. `scale_before` is the loss scale the update used
  /// (read only for the log line of a skipped step). Returns whether it was skipped.
  bool update_on_host(const torch::Tensor& scale_before, bool zero_grads);

  /// Both halves, eagerly. Returns whether the update was skipped.
  bool update();

  /// The loss scale the last `update_on_device` used (a device copy; undefined without loss
  /// scaling).
  const torch::Tensor& scale_before() const noexcept { return scale_before_; }

  /// Sets every gradient (optimizer, model, masters) to None. No sync.
  void clear_grads();

  /// Turns off autocast's weight-cast cache: a captured graph would keep the casts it made.
  void disable_autocast_cache() noexcept { autocast_cache_ = false; }

 private:
  /// Each registered piece of state's `after_optimizer_step`, in order.
  void run_after_step_hooks();

  StepParts parts_;
  bool fused_writes_back_;  // FusedAdamW casts the masters into the model in its own pass
  bool autocast_cache_ = true;
  torch::Tensor grad_norm_;
  torch::Tensor scale_before_;
  std::int64_t consecutive_skips_ = 0;
};

}  // namespace mantissa::detail
