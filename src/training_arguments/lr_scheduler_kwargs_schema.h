#pragma once
// The schema of `lr_scheduler_kwargs`: which keys each Hugging Face schedule takes, of what type
// and in what range, read into typed values with HF's defaults filled in. Internal.
//
// It lives with the other argument checks because both sides use it: validate() checks
// `lr_scheduler_kwargs` through `check_lr_scheduler_kwargs`, and the schedules in
// src/lr_scheduler/ read their values from it. src/lr_scheduler/ includes this folder; nothing
// here includes src/lr_scheduler/.

#include <cstdint>
#include <optional>

#include <mantissa/argument_enums.h>
#include <mantissa/lr_scheduler_kwargs.h>

namespace mantissa::detail {

/// warmup_stable_decay's `warmup_type` and `decay_type`: "linear", "cosine", "1-sqrt".
enum class WsdShape { kLinear, kCosine, kOneMinusSqrt };

/// The keyword arguments of one schedule as its lambda reads them, with HF's defaults where a key
/// is absent: the arguments transformers binds with `functools.partial`. The step counts
/// (warmup, total) are not among them; src/lr_scheduler/schedules.h adds those.
struct ResolvedLrSchedulerKwargs {
  SchedulerType schedule = SchedulerType::kConstant;
  double num_cycles = 0.5;  // cosine_with_restarts: 1.0
  double lr_init = 0.0;     // polynomial: the optimizer's initial lr (`optimizer.defaults["lr"]`)
  double lr_end = 1e-7;
  double power = 1.0;
  std::int64_t timescale = 0;  // 0: unset (the schedule picks the warmup, or 10000)
  double min_lr_rate = 0.0;
  std::optional<double> warmup_lr_rate;
  WsdShape warmup_type = WsdShape::kLinear;
  WsdShape decay_type = WsdShape::kCosine;
  double min_lr_ratio = 0.0;
  std::int64_t num_decay_steps = 0;
  std::optional<std::int64_t> num_stable_steps;  // unset: the rest of the run
};

/// Reads `kwargs` for `schedule` with every check that needs no step counts (the ones
/// `check_lr_scheduler_kwargs` documents). `initial_lr` unset skips the checks and values that
/// need the optimizer's lr. Throws `c10::ValueError` naming the key and the value. Pure host code.
ResolvedLrSchedulerKwargs resolve_lr_scheduler_kwargs(SchedulerType schedule,
                                                      const LrSchedulerKwargs& kwargs,
                                                      std::optional<double> initial_lr);

/// Whether `schedule` with `kwargs` reads the optimizer's initial lr (polynomial, and a `min_lr`
/// of the two cosine schedules with a floor), so that a schedule that does not never asks an
/// optimizer whose options lack `get_lr()`. Pure.
bool schedule_needs_initial_lr(SchedulerType schedule, const LrSchedulerKwargs& kwargs);

}  // namespace mantissa::detail
