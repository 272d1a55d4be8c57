#include "lr_scheduler/schedules.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>
#include <mantissa/lr_scheduler.h>

namespace mantissa {
namespace detail {
namespace {

using Schedule = SchedulerType;

// Python's math.pi.
constexpr double kPi = 3.141592653589793;

void check_steps(std::int64_t num_warmup_steps, std::int64_t num_training_steps) {
  TORCH_CHECK_VALUE(num_warmup_steps >= 0, "num_warmup_steps must be >= 0, got ", num_warmup_steps);
  TORCH_CHECK_VALUE(num_training_steps >= 0, "num_training_steps must be >= 0, got ",
                    num_training_steps);
}

// ---- the lambdas of transformers/optimization.py, operation for operation -------------------

// a * b + c with the product rounded first, as Python computes it: never one fused
// multiply-add, whatever the compiler's -ffp-contract.
double mul_add(double a, double b, double c) {
  volatile double product = a * b;
  return product + c;
}

double warmup_ramp(std::int64_t step, std::int64_t warmup) {
  return static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(1, warmup));
}

// progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps -
// num_warmup_steps))
double progress_of(std::int64_t step, std::int64_t warmup, std::int64_t total) {
  return static_cast<double>(step - warmup) /
         static_cast<double>(std::max<std::int64_t>(1, total - warmup));
}

// _get_cosine_schedule_with_warmup_lr_lambda (the second definition in optimization.py, the one
// both "cosine" and "cosine_with_min_lr" call; "cosine" with min_lr_rate 0.0).
double cosine_with_min_lr(const ResolvedSchedule& p, std::int64_t step) {
  if (step < p.warmup) return warmup_ramp(step, p.warmup);
  const double progress = progress_of(step, p.warmup, p.total);
  double factor = 0.5 * (1.0 + std::cos(kPi * p.kwargs.num_cycles * 2.0 * progress));
  factor = mul_add(factor, 1.0 - p.kwargs.min_lr_rate, p.kwargs.min_lr_rate);
  return std::max(0.0, factor);
}

// _get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda: every count a float first.
double cosine_warmup_with_min_lr(const ResolvedSchedule& p, std::int64_t step) {
  const double current_step = static_cast<double>(step);
  const double num_warmup_steps = static_cast<double>(p.warmup);
  const double num_training_steps = static_cast<double>(p.total);
  if (current_step < num_warmup_steps) {
    if (!p.kwargs.warmup_lr_rate) return (current_step + 1.0) / std::max(1.0, num_warmup_steps);
    const double warmup_lr_rate = *p.kwargs.warmup_lr_rate;
    return warmup_lr_rate +
           (1.0 - warmup_lr_rate) * current_step / std::max(1.0, num_warmup_steps - 1);
  }
  const double progress = (current_step - num_warmup_steps + 1.0) /
                          std::max(1.0, num_training_steps - num_warmup_steps);
  double factor = 0.5 * (1.0 + std::cos(kPi * p.kwargs.num_cycles * 2.0 * progress));
  factor = mul_add(factor, 1.0 - p.kwargs.min_lr_rate, p.kwargs.min_lr_rate);
  return std::max(0.0, factor);
}

// _get_wsd_scheduler_lambda
double warmup_stable_decay(const ResolvedSchedule& p, std::int64_t step) {
  if (step < p.warmup) {
    const double progress = warmup_ramp(step, p.warmup);
    double factor = progress;
    if (p.kwargs.warmup_type == WsdShape::kCosine) {
      factor = 0.5 * (1.0 - std::cos(kPi * progress));
    } else if (p.kwargs.warmup_type == WsdShape::kOneMinusSqrt) {
      factor = 1.0 - std::sqrt(1.0 - progress);
    }
    factor = mul_add(factor, 1.0 - p.kwargs.min_lr_ratio, p.kwargs.min_lr_ratio);
    return std::max(0.0, factor);
  }
  if (step < p.stable_end) return 1.0;
  if (step < p.decay_end) {
    const double progress =
        static_cast<double>(step - p.stable_end) /
        static_cast<double>(std::max<std::int64_t>(1, p.kwargs.num_decay_steps));
    double factor = 1.0 - progress;
    if (p.kwargs.decay_type == WsdShape::kCosine) {
      factor = 0.5 * (1.0 + std::cos(kPi * p.kwargs.num_cycles * 2.0 * progress));
    } else if (p.kwargs.decay_type == WsdShape::kOneMinusSqrt) {
      factor = 1.0 - std::sqrt(progress);
    }
    factor = mul_add(factor, 1.0 - p.kwargs.min_lr_ratio, p.kwargs.min_lr_ratio);
    return std::max(0.0, factor);
  }
  return p.kwargs.min_lr_ratio;
}

}  // namespace

ResolvedSchedule resolve_schedule(SchedulerType schedule, std::int64_t warmup, std::int64_t total,
                                  const LrSchedulerKwargs& kwargs,
                                  std::optional<double> initial_lr) {
  check_steps(warmup, total);
  if (schedule_needs_initial_lr(schedule, kwargs)) {
    TORCH_CHECK_VALUE(initial_lr.has_value(), "the ", Choice<Schedule>(schedule).name(),
                      " schedule is relative to the optimizer's initial lr: pass initial_lr");
  }
  ResolvedSchedule p;
  p.kwargs = resolve_lr_scheduler_kwargs(schedule, kwargs, initial_lr);
  p.warmup = warmup;
  p.total = total;
  switch (schedule) {
    case Schedule::kPolynomial:
      // Python divides by num_training_steps - num_warmup_steps at that step.
      TORCH_CHECK_VALUE(total != warmup,
                        "the polynomial schedule decays over num_training_steps - num_warmup_steps "
                        "steps, which is 0 here (",
                        total, " - ", warmup, "; transformers divides by zero at step ", total,
                        "); shorten the warmup");
      break;
    case Schedule::kInverseSqrt:
      if (p.kwargs.timescale == 0)
        p.kwargs.timescale = warmup != 0 ? warmup : 10000;  // HF: warmup or 10_000
      break;
    case Schedule::kWarmupStableDecay: {
      // HF: num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps when
      // unset (negative when warmup and decay overlap the run's end: the decay then starts
      // part-way, as in Python).
      std::int64_t stable = 0;
      bool overflow = false;
      if (p.kwargs.num_stable_steps) {
        stable = *p.kwargs.num_stable_steps;
      } else {
        // total - warmup >= -2^63 + 1; num_decay_steps >= 0.
        overflow =
            total - warmup < std::numeric_limits<std::int64_t>::min() + p.kwargs.num_decay_steps;
        if (!overflow) stable = total - warmup - p.kwargs.num_decay_steps;
      }
      overflow = overflow || c10::add_overflows(warmup, stable, &p.stable_end) ||
                 c10::add_overflows(p.stable_end, p.kwargs.num_decay_steps, &p.decay_end);
      TORCH_CHECK_VALUE(
          !overflow, "lr_scheduler_kwargs: the warmup_stable_decay schedule's num_warmup_steps ",
          warmup, ", num_stable_steps ", stable, " and num_decay_steps ", p.kwargs.num_decay_steps,
          " add up to more steps than a 64-bit count holds");
      break;
    }
    default:
      break;
  }
  return p;
}

double schedule_factor_at(const ResolvedSchedule& p, std::int64_t current_step) {
  const std::int64_t warmup = p.warmup;
  const std::int64_t total = p.total;
  switch (p.kwargs.schedule) {
    case Schedule::kConstant:
      return 1.0;
    case Schedule::kConstantWithWarmup:
      if (current_step < warmup) {
        return static_cast<double>(current_step) / std::max(1.0, static_cast<double>(warmup));
      }
      return 1.0;
    case Schedule::kLinear:
      if (current_step < warmup) return warmup_ramp(current_step, warmup);
      return std::max(0.0, static_cast<double>(total - current_step) /
                               static_cast<double>(std::max<std::int64_t>(1, total - warmup)));
    case Schedule::kCosine:
    case Schedule::kCosineWithMinLr:
      return cosine_with_min_lr(p, current_step);
    case Schedule::kCosineWithRestarts: {
      if (current_step < warmup) return warmup_ramp(current_step, warmup);
      const double progress = progress_of(current_step, warmup, total);
      if (progress >= 1.0) return 0.0;
      // Python's float % 1.0, which is fmod for the non-negative operands here.
      return std::max(0.0,
                      0.5 * (1.0 + std::cos(kPi * std::fmod(p.kwargs.num_cycles * progress, 1.0))));
    }
    case Schedule::kPolynomial: {
      if (current_step < warmup) return warmup_ramp(current_step, warmup);
      if (current_step > total) return p.kwargs.lr_end / p.kwargs.lr_init;
      const double lr_range = p.kwargs.lr_init - p.kwargs.lr_end;
      const std::int64_t decay_steps = total - warmup;
      const double pct_remaining =
          1.0 - static_cast<double>(current_step - warmup) / static_cast<double>(decay_steps);
      const double decay =
          mul_add(lr_range, std::pow(pct_remaining, p.kwargs.power), p.kwargs.lr_end);
      return decay / p.kwargs.lr_init;
    }
    case Schedule::kInverseSqrt: {
      if (current_step < warmup) return warmup_ramp(current_step, warmup);
      // Python: (current_step + (timescale - num_warmup_steps)) / timescale, exact integers.
      std::int64_t shifted = 0;
      const double numerator =
          c10::add_overflows(current_step - warmup, p.kwargs.timescale, &shifted)
              ? static_cast<double>(current_step - warmup) + static_cast<double>(p.kwargs.timescale)
              : static_cast<double>(shifted);
      return 1.0 / std::sqrt(numerator / static_cast<double>(p.kwargs.timescale));
    }
    case Schedule::kCosineWarmupWithMinLr:
      return cosine_warmup_with_min_lr(p, current_step);
    case Schedule::kWarmupStableDecay:
      return warmup_stable_decay(p, current_step);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled schedule");
}

}  // namespace detail

double schedule_factor(const Choice<SchedulerType>& type, std::int64_t step,
                       std::int64_t num_warmup_steps, std::int64_t num_training_steps,
                       const LrSchedulerKwargs& kwargs, std::optional<double> initial_lr) {
  return detail::schedule_factor_at(
      detail::resolve_schedule(type.value(), num_warmup_steps, num_training_steps, kwargs,
                               initial_lr),
      step);
}

}  // namespace mantissa
