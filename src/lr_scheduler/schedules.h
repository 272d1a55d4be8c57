#pragma once
// The schedules of transformers/optimization.py: a schedule's kwargs and step counts resolved
// once, and its factor at any step, computed operation for operation as Python does. Internal.

#include <cstdint>
#include <optional>

#include <mantissa/argument_enums.h>
#include <mantissa/lr_scheduler_kwargs.h>

#include "training_arguments/lr_scheduler_kwargs_schema.h"

namespace mantissa::detail {

/// Everything a schedule's lambda reads: its kwargs (HF's defaults filled in) and its step
/// counts, with what follows from both.
struct ResolvedSchedule {
  ResolvedLrSchedulerKwargs kwargs;  // timescale set: the kwarg, the warmup or 10000
  std::int64_t warmup = 0;
  std::int64_t total = 0;
  std::int64_t stable_end = 0;  // warmup_stable_decay: warmup + num_stable_steps
  std::int64_t decay_end = 0;   // warmup_stable_decay: stable_end + num_decay_steps
};

/// The schedule `schedule` over `warmup` and `total` steps with `kwargs`. Throws
/// `c10::ValueError` for a negative step count, kwargs the schema rejects, a schedule that reads
/// the optimizer's lr without `initial_lr`, and step counts Python would divide by zero or a
/// 64-bit count cannot hold. Pure host code.
ResolvedSchedule resolve_schedule(SchedulerType schedule, std::int64_t warmup, std::int64_t total,
                                  const LrSchedulerKwargs& kwargs,
                                  std::optional<double> initial_lr);

/// The multiplier of the base lr at `step` (`schedule_factor`'s value; the lambda HF hands to
/// LambdaLR). Pure host arithmetic.
double schedule_factor_at(const ResolvedSchedule& schedule, std::int64_t step);

}  // namespace mantissa::detail
