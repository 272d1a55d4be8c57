#pragma once
// The training loss between two log lines, kept on the device: HF's `tr_loss` with
// `logging_nan_inf_filter`, and the count of non-finite micro-losses in a row.

#include <cstdint>

#include <c10/core/Device.h>
#include <torch/types.h>

namespace mantissa::detail {

/// The one owner of the running training loss of a `train()` call. A logging window starts
/// at the step of the previous log line; `add` runs every micro-batch and never syncs, the
/// reads (`close`, `run_total`, `check_nonfinite`) sync and happen only when the loop logs or
/// ends. Python: `tr_loss`, `_globalstep_last_logged` and `_total_loss_scalar` of
/// `Trainer._inner_training_loop`.
class LossWindow {
 public:
  /// A window on `device` that replaces non-finite micro-losses by the window's running
  /// average when `nan_inf_filter` (`logging_nan_inf_filter`). Nothing is allocated before
  /// `start`.
  LossWindow(const c10::Device& device, bool nan_inf_filter);

  /// Counts the window's optimizer updates in a device tensor (`count_update`) instead of
  /// deriving them from `global_step` on the host: a captured CUDA graph replays the same
  /// ops on each step, so the average it takes cannot read a host number. Call before `start`.
  void count_updates_on_device();

  /// Allocates the window's tensors (zero) and opens a window at `global_step`. No sync.
  void start(std::int64_t global_step);

  /// Adds one micro-batch's loss (a 0-d float tensor on the device). In place, so a captured
  /// step keeps accumulating into the same tensors. No sync. Ops, per call: 2 for the
  /// finiteness test, 2 for the streak, then 3 to filter (4 counting on the device) or 1.
  void add(const torch::Tensor& step_loss, std::int64_t global_step);

  /// Notes that an optimizer update completed: one device op when counting on the device
  /// (it is captured with the step), nothing otherwise. No sync.
  void count_update();

  /// The step the open window started at (the last log line's, or the run's first).
  std::int64_t start_step() const noexcept { return start_step_; }

  /// Closes the window at `global_step` and opens the next: the mean loss per update over it
  /// (0 for an empty window), added to the run's total. Syncs (one `.item()`).
  double close(std::int64_t global_step);

  /// The sum of every window's loss, the open one's included: what `train_loss` averages.
  /// Syncs.
  double run_total() const;

  /// Throws when `max_consecutive` > 0 and that many micro-losses in a row were not finite
  /// (the run diverged). Syncs.
  void check_nonfinite(std::int64_t max_consecutive) const;

 private:
  c10::Device device_;
  bool nan_inf_filter_;
  bool count_on_device_ = false;
  torch::Tensor tr_loss_;
  torch::Tensor window_steps_;  // updates since the window opened; only when counted on the device
  torch::Tensor nonfinite_streak_;
  std::int64_t start_step_ = 0;
  double total_loss_ = 0.0;
};

}  // namespace mantissa::detail
