#include "trainer/loss_window.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace mantissa::detail {

LossWindow::LossWindow(const c10::Device& device, bool nan_inf_filter)
    : device_(device), nan_inf_filter_(nan_inf_filter) {}

void LossWindow::count_updates_on_device() { count_on_device_ = true; }

void LossWindow::start(std::int64_t global_step) {
  const auto on_device = torch::TensorOptions().device(device_);
  tr_loss_ = torch::zeros({}, on_device.dtype(torch::kFloat));
  window_steps_ =
      count_on_device_ ? torch::zeros({}, on_device.dtype(torch::kFloat)) : torch::Tensor();
  nonfinite_streak_ = torch::zeros({}, on_device.dtype(torch::kLong));
  start_step_ = global_step;
  total_loss_ = 0.0;
}

// A non-finite micro-loss is replaced by the running average of this window,
// `tr_loss / (1 + global_step - start_step)`, with few ops: this runs every micro-batch, and
// on a small model each dispatched op is a visible share of the step.
void LossWindow::add(const torch::Tensor& step_loss, std::int64_t global_step) {
  // x - x is 0 exactly when x is finite (inf - inf and nan - nan are nan): two ops, where
  // at::isfinite dispatches six on the CPU.
  const auto finite = (step_loss - step_loss).eq(0);
  nonfinite_streak_.add_(1).masked_fill_(finite, 0);
  if (nan_inf_filter_) {
    const auto window_average = count_on_device_
                                    ? tr_loss_ / (window_steps_ + 1)
                                    : tr_loss_ / static_cast<double>(1 + global_step - start_step_);
    tr_loss_.add_(torch::where(finite, step_loss, window_average));
  } else {
    tr_loss_.add_(step_loss);
  }
}

void LossWindow::count_update() {
  if (count_on_device_) window_steps_.add_(1);
}

double LossWindow::close(std::int64_t global_step) {
  const auto steps = global_step - start_step_;
  const double window_loss = tr_loss_.item<double>();
  const double loss = steps > 0 ? window_loss / static_cast<double>(steps) : 0.0;
  total_loss_ += window_loss;
  tr_loss_.zero_();
  if (count_on_device_) window_steps_.zero_();
  start_step_ = global_step;
  return loss;
}

double LossWindow::run_total() const { return total_loss_ + tr_loss_.item<double>(); }

void LossWindow::check_nonfinite(std::int64_t max_consecutive) const {
  if (max_consecutive == 0 || !nonfinite_streak_.defined()) return;
  const auto streak = nonfinite_streak_.item<std::int64_t>();
  TORCH_CHECK(streak < max_consecutive, "training stopped: the loss was not finite for ", streak,
              " micro-batches in a row (max_consecutive_nonfinite=", max_consecutive,
              "). The run diverged: try a lower --learning_rate, --bf16 instead of --fp16, or a "
              "smaller --max_grad_norm.");
}

}  // namespace mantissa::detail
