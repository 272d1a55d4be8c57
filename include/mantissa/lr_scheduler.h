#pragma once
// Hugging Face's learning-rate schedules (transformers.optimization) driven like PyTorch's
// torch.optim.lr_scheduler.LambdaLR.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <mantissa/argument_enums.h>
#include <mantissa/lr_scheduler_kwargs.h>

namespace mantissa {

/// The multiplier of the base learning rate at `step` for the Hugging Face schedule `type`
/// with its keyword arguments `kwargs` (w = `num_warmup_steps`, T = `num_training_steps`; during
/// the warmup every schedule but `constant` ramps up as `step / max(1, w)`, except where said):
///
/// - "linear": `max(0, (T - step) / max(1, T - w))` (`get_linear_schedule_with_warmup`);
/// - "cosine": `max(0, 0.5 * (1 + cos(pi * num_cycles * 2 * progress)))` with
///   `progress = (step - w) / max(1, T - w)` (`get_cosine_schedule_with_warmup`);
/// - "cosine_with_restarts": 0 once `progress >= 1`, else
///   `max(0, 0.5 * (1 + cos(pi * ((num_cycles * progress) % 1))))`
///   (`get_cosine_with_hard_restarts_schedule_with_warmup`);
/// - "polynomial": `((lr - lr_end) * (1 - (step - w) / (T - w))^power + lr_end) / lr`, and
///   `lr_end / lr` past T, where `lr` is `initial_lr` (`get_polynomial_decay_schedule_with_warmup`,
///   which reads `optimizer.defaults["lr"]`); T must differ from w, where Python divides by zero;
/// - "constant": 1 (`get_constant_schedule`); "constant_with_warmup": the ramp, then 1
///   (`get_constant_schedule_with_warmup`);
/// - "inverse_sqrt": `1 / sqrt((step + timescale - w) / timescale)` (`get_inverse_sqrt_schedule`;
///   T unused);
/// - "cosine_with_min_lr": the cosine, scaled into `[min_lr_rate, 1]`
///   (`get_cosine_with_min_lr_schedule_with_warmup`; `min_lr` is turned into `min_lr / lr`);
/// - "cosine_warmup_with_min_lr": the same with HF's shifted steps: the ramp is
///   `(step + 1) / max(1, w)` (or from `warmup_lr_rate` to 1) and the cosine starts one step in
///   (`get_cosine_with_min_lr_schedule_with_warmup_lr_rate`);
/// - "warmup_stable_decay": from `min_lr_ratio` up to 1 by `warmup_type`, 1 for
///   `num_stable_steps`, down to `min_lr_ratio` by `decay_type` over `num_decay_steps`, then
///   `min_lr_ratio` (`get_wsd_schedule`; `num_stable_steps` defaults to `T - w - num_decay_steps`).
///
/// Computed with the same double operations in the same order as transformers
/// (`transformers/optimization.py`), so the values are bit for bit those of Python (for step
/// counts below 2^53). `type` is a `SchedulerType` or its spelling ("linear"); an unknown spelling
/// throws `c10::ValueError` with HF's text "foo is not a valid SchedulerType, please select one
/// of ['linear', 'cosine', 'cosine_with_restarts', ...]"; a negative `warmup` or `total` and
/// `kwargs` that `check_lr_scheduler_kwargs(type, kwargs, initial_lr)` rejects throw
/// `c10::ValueError` naming them. `initial_lr` is needed by "polynomial" and by `min_lr`; without
/// it they throw. Pure host arithmetic.
double schedule_factor(const Choice<SchedulerType>& type, std::int64_t step,
                       std::int64_t num_warmup_steps, std::int64_t num_training_steps,
                       const LrSchedulerKwargs& kwargs = {},
                       std::optional<double> initial_lr = std::nullopt);

/// A learning-rate scheduler over a LibTorch optimizer: Hugging Face's `get_scheduler(type,
/// optimizer, num_warmup_steps, num_training_steps, scheduler_specific_kwargs)`, which is a
/// `torch.optim.lr_scheduler.LambdaLR` with the lambda `schedule_factor(type, ..., kwargs)`.
///
///     torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(5e-5));
///     mantissa::LrScheduler scheduler(optimizer, "linear", /*num_warmup_steps=*/100, max_steps);
///     mantissa::LrScheduler restarts(optimizer, "cosine_with_restarts", 100, max_steps,
///                                    {{"num_cycles", 3}});
///     for (...) { ...; optimizer.step(); scheduler.step(); }
///
/// Construction records each param group's current lr as its base lr and sets
/// `lr = base_lr * factor(0)` (so 0 with a warmup); `last_epoch()` is then 0. Each `step()`
/// increments `last_epoch` and sets `lr = base_lr * factor(last_epoch)`. The lr is read and
/// written through `group.options().get_lr()` / `set_lr()`, so every LibTorch optimizer works.
/// The scheduler keeps a pointer to the optimizer, which must outlive it. Host only: nothing
/// here touches a device. Move-only, like an optimizer.
class LrScheduler {
 public:
  /// Python: `transformers.get_scheduler(type, optimizer, num_warmup_steps, num_training_steps,
  /// scheduler_specific_kwargs=kwargs)`. The schedule's lr (polynomial's `lr_end`, `min_lr`) is
  /// relative to `optimizer.defaults().get_lr()`, as HF's to `optimizer.defaults["lr"]`.
  /// Throws `c10::ValueError` for an unknown `type` (HF's text, see `schedule_factor`), a
  /// negative step count or `kwargs` that `check_lr_scheduler_kwargs` rejects, and `c10::Error`
  /// when the optimizer has no param groups. `type` is a `SchedulerType` or its spelling
  /// ("linear").
  LrScheduler(torch::optim::Optimizer& optimizer, const Choice<SchedulerType>& type,
              std::int64_t num_warmup_steps, std::int64_t num_training_steps,
              const LrSchedulerKwargs& kwargs = {});

  /// A learning-rate factor for step `step` (0 at construction), as LambdaLR's `lr_lambda`.
  using LrLambda = std::function<double(std::int64_t step)>;

  /// Any schedule: `lr = base_lr * lr_lambda(step)`. Python:
  /// `torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)`. `type()` is then "lambda".
  LrScheduler(torch::optim::Optimizer& optimizer, LrLambda lr_lambda);

  LrScheduler(LrScheduler&&) noexcept = default;
  LrScheduler& operator=(LrScheduler&&) noexcept = default;
  LrScheduler(const LrScheduler&) = delete;
  LrScheduler& operator=(const LrScheduler&) = delete;
  ~LrScheduler() = default;

  /// Advances the schedule by one step and writes the new lr into every param group.
  /// Python: `scheduler.step()`. Call it after `optimizer.step()`, and (as HF's Trainer does)
  /// not after a step the GradScaler skipped.
  void step();

  /// The lr of each param group as last set by this scheduler. Python:
  /// `scheduler.get_last_lr()`.
  std::vector<double> get_last_lr() const { return last_lr_; }

  /// The number of `step()` calls since construction (or as loaded). Python:
  /// `scheduler.last_epoch`; HF's Trainer keeps it equal to the global step.
  std::int64_t last_epoch() const noexcept { return last_epoch_; }

  /// The lr of each param group when the scheduler was built. Python: `scheduler.base_lrs`.
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }

  /// The schedule's name ("linear", ...), its warmup, its total steps and its keyword
  /// arguments, as constructed (empty for a lambda schedule).
  const std::string& type() const noexcept { return type_; }
  std::int64_t num_warmup_steps() const noexcept { return num_warmup_steps_; }
  std::int64_t num_training_steps() const noexcept { return num_training_steps_; }
  const LrSchedulerKwargs& kwargs() const noexcept { return kwargs_; }

  /// Python: `scheduler.state_dict()` of HF's LambdaLR, with the same keys and types:
  /// `base_lrs` (list of float), `last_epoch` (int), `_step_count` (int), `_is_initial`
  /// (False), `_get_lr_called_within_step` (False), `_last_lr` (list of float) and
  /// `lr_lambdas` (one empty dict per param group, which is what HF's `functools.partial`
  /// lambdas save). The schedule itself (type, warmup, total, kwargs) is not part of it, as in
  /// Python.
  c10::impl::GenericDict state_dict() const;

  /// Python: `scheduler.load_state_dict(state)`. Takes `base_lrs`, `last_epoch` and, when
  /// present, `_step_count` and `_last_lr`; other keys are ignored. Like Python it does not
  /// touch the optimizer's lr (the optimizer's own state holds it). Throws `c10::ValueError`
  /// when a key is missing, has the wrong type, or `base_lrs` does not have one entry per param
  /// group.
  void load_state_dict(const c10::impl::GenericDict& state);

  /// Writes `state_dict()` to `path` in `torch.save`'s format (HF's `scheduler.pt`), atomically:
  /// a temporary file renamed over `path`, so a failed write leaves the old file intact.
  /// Python's `torch.load(path)` reads it.
  void save(const std::string& path) const;

  /// Reads a file written by `save(path)` or by Python's
  /// `torch.save(scheduler.state_dict(), path)` and loads it with `load_state_dict`.
  void load(const std::string& path);

 private:
  void apply_lr();

  torch::optim::Optimizer* optimizer_;
  std::string type_;
  LrLambda lr_lambda_;  // a named schedule's too, with its arguments bound (HF's partial)
  std::int64_t num_warmup_steps_;
  std::int64_t num_training_steps_;
  LrSchedulerKwargs kwargs_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  std::int64_t last_epoch_ = 0;
  std::int64_t step_count_ = 0;
};

}  // namespace mantissa
