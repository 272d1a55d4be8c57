#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>
#include <mantissa/lr_scheduler.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "io/atomic_file.h"
#include "io/torch_load.h"
#include "io/torch_save.h"
#include "shorten.h"
#include "training_arguments/python_repr.h"

namespace mantissa {

namespace {

using Schedule = SchedulerType;

// Python's math.pi.
constexpr double kPi = 3.141592653589793;

void check_steps(std::int64_t num_warmup_steps, std::int64_t num_training_steps) {
  TORCH_CHECK_VALUE(num_warmup_steps >= 0, "num_warmup_steps must be >= 0, got ", num_warmup_steps);
  TORCH_CHECK_VALUE(num_training_steps >= 0, "num_training_steps must be >= 0, got ",
                    num_training_steps);
}

// ---- the keyword arguments -------------------------------------------------------------------

// warmup_stable_decay's warmup_type and decay_type.
enum class Shape { kLinear, kCosine, kOneMinusSqrt };
constexpr const char* kShapeNames[] = {"linear", "cosine", "1-sqrt"};

// The transformers function behind each schedule (for messages) and the keys it takes besides
// num_warmup_steps, num_training_steps and last_epoch, which are not the user's to pass.
struct ScheduleSignature {
  const char* function;
  std::vector<const char*> keys;
};

ScheduleSignature signature_of(Schedule schedule) {
  switch (schedule) {
    case Schedule::kLinear:
      return {"get_linear_schedule_with_warmup", {}};
    case Schedule::kCosine:
      return {"get_cosine_schedule_with_warmup", {"num_cycles"}};
    case Schedule::kCosineWithRestarts:
      return {"get_cosine_with_hard_restarts_schedule_with_warmup", {"num_cycles"}};
    case Schedule::kPolynomial:
      return {"get_polynomial_decay_schedule_with_warmup", {"lr_end", "power"}};
    case Schedule::kConstant:
      return {"get_constant_schedule", {}};
    case Schedule::kConstantWithWarmup:
      return {"get_constant_schedule_with_warmup", {}};
    case Schedule::kInverseSqrt:
      return {"get_inverse_sqrt_schedule", {"timescale"}};
    case Schedule::kCosineWithMinLr:
      return {"get_cosine_with_min_lr_schedule_with_warmup",
              {"num_cycles", "min_lr", "min_lr_rate"}};
    case Schedule::kCosineWarmupWithMinLr:
      return {"get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
              {"num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"}};
    case Schedule::kWarmupStableDecay:
      return {"get_wsd_schedule",
              {"num_decay_steps", "num_stable_steps", "warmup_type", "decay_type", "min_lr_ratio",
               "num_cycles"}};
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled schedule");
}

// A key or a value for a message: Python's repr, cut after 60 characters (the text is the
// user's, and may be long).
std::string short_repr(const std::string& text) {
  constexpr std::size_t kChars = 60;
  return text.size() > kChars ? detail::repr(text.substr(0, kChars) + "...") : detail::repr(text);
}

std::string kwarg_repr(const LrSchedulerKwarg& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return short_repr(*s);
  return detail::repr(value);
}

const char* kind_of(const LrSchedulerKwarg& value) {
  return std::visit(
      [](const auto& v) -> const char* {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::int64_t>) return "an integer";
        if constexpr (std::is_same_v<T, double>) return "a float";
        return "a string";
      },
      value);
}

// Everything a schedule's lambda reads, with HF's defaults filled in: the arguments that
// transformers binds with functools.partial.
struct Params {
  Schedule schedule = Schedule::kConstant;
  std::int64_t warmup = 0;
  std::int64_t total = 0;
  double num_cycles = 0.5;
  double lr_init = 0.0;  // polynomial: optimizer.defaults["lr"]
  double lr_end = 1e-7;
  double power = 1.0;
  std::int64_t timescale = 0;
  double min_lr_rate = 0.0;
  std::optional<double> warmup_lr_rate;
  Shape warmup_type = Shape::kLinear;
  Shape decay_type = Shape::kCosine;
  double min_lr_ratio = 0.0;
  std::int64_t num_decay_steps = 0;
  std::optional<std::int64_t> num_stable_steps;  // unset: the rest of the run
  std::int64_t stable_end = 0;                   // warmup + num_stable_steps
  std::int64_t decay_end = 0;                    // warmup + num_stable_steps + num_decay_steps
};

// Reads the keys of one schedule's kwargs, each checked for its type, and says what is wrong in
// words that name the key and the value.
class KwargsReader {
 public:
  KwargsReader(Schedule schedule, const LrSchedulerKwargs& kwargs)
      : kwargs_(kwargs), name_(Choice<Schedule>(schedule).name()) {
    const ScheduleSignature signature = signature_of(schedule);
    // No structured binding: clang before 16 cannot capture one in a lambda (the asan build).
    for (const auto& entry : kwargs) {
      const std::string& key = entry.first;
      const LrSchedulerKwarg& value = entry.second;
      const auto& keys = signature.keys;
      if (std::find_if(keys.begin(), keys.end(), [&](const char* k) { return key == k; }) !=
          keys.end()) {
        continue;
      }
      std::string takes;
      for (const char* k : keys) takes += std::string(takes.empty() ? "" : ", ") + k;
      const bool step_count = key == "num_warmup_steps" || key == "num_training_steps";
      TORCH_CHECK_VALUE(false, "lr_scheduler_kwargs: ", short_repr(key), ": ", kwarg_repr(value),
                        " is not an argument of the ", name_, " schedule (transformers' ",
                        signature.function, "), which takes ",
                        takes.empty() ? std::string("no lr_scheduler_kwargs") : takes,
                        step_count ? "; the warmup and the length come from --warmup_steps / "
                                     "--warmup_ratio and the run's number of steps"
                                   : "");
    }
  }

  std::optional<double> number(const char* key) const {
    const LrSchedulerKwarg* value = find(key);
    if (value == nullptr) return std::nullopt;
    double out = 0.0;
    if (const auto* i = std::get_if<std::int64_t>(value)) {
      out = static_cast<double>(*i);  // Python's float(int), and int * float
    } else if (const auto* d = std::get_if<double>(value)) {
      out = *d;
    } else {
      bad(key, *value, "must be a number");
    }
    if (!std::isfinite(out)) bad(key, *value, "must be a finite number");
    return out;
  }

  std::optional<std::int64_t> integer(const char* key) const {
    const LrSchedulerKwarg* value = find(key);
    if (value == nullptr) return std::nullopt;
    const auto* i = std::get_if<std::int64_t>(value);
    if (i == nullptr) bad(key, *value, "must be an integer (a number of steps)");
    return *i;
  }

  std::optional<Shape> shape(const char* key, const char* what) const {
    const LrSchedulerKwarg* value = find(key);
    if (value == nullptr) return std::nullopt;
    const auto* s = std::get_if<std::string>(value);
    if (s == nullptr) bad(key, *value, "must be a string");
    for (std::size_t i = 0; i < std::size(kShapeNames); ++i) {
      if (*s == kShapeNames[i]) return static_cast<Shape>(i);
    }
    // HF's text.
    const std::string shown = detail::shorten(*s, 60);
    TORCH_CHECK_VALUE(false, "lr_scheduler_kwargs: Unknown ", what, " type: ", shown,
                      ", expected 'linear', 'cosine' or '1-sqrt' (", key, " of ", name_, ")");
    std::abort();  // unreachable
  }

  // `v`, the value of `key`, in [lo, hi] (hi may be infinite).
  void check_range(const char* key, double v, double lo, double hi, const char* expected) const {
    if (v >= lo && v <= hi) return;
    bad(key, *find(key), expected);
  }

  [[noreturn]] void bad(const char* key, const LrSchedulerKwarg& value,
                        const std::string& why) const {
    TORCH_CHECK_VALUE(false, "lr_scheduler_kwargs: ", key, " of the ", name_, " schedule ", why,
                      ", got ", kwarg_repr(value), " (", kind_of(value), ")");
    std::abort();  // unreachable
  }

  const std::string& name() const { return name_; }

 private:
  const LrSchedulerKwarg* find(const char* key) const {
    const auto it = kwargs_.find(key);
    return it == kwargs_.end() ? nullptr : &it->second;
  }

  const LrSchedulerKwargs& kwargs_;
  std::string name_;
};

// min_lr / min_lr_rate of the two cosine schedules with a floor (HF's checks and texts).
double resolve_min_lr_rate(const KwargsReader& in, std::optional<double> initial_lr) {
  const auto min_lr = in.number("min_lr");
  const auto min_lr_rate = in.number("min_lr_rate");
  TORCH_CHECK_VALUE(!(min_lr && min_lr_rate),
                    "lr_scheduler_kwargs: Only one of min_lr or min_lr_rate should be set (",
                    in.name(), " got both)");
  TORCH_CHECK_VALUE(min_lr || min_lr_rate,
                    "lr_scheduler_kwargs: One of min_lr or min_lr_rate should be set through the "
                    "`lr_scheduler_kwargs` (",
                    in.name(), " got neither)");
  if (min_lr_rate) {
    in.check_range("min_lr_rate", *min_lr_rate, 0.0, 1.0,
                   "is a fraction of the initial lr: it must lie in [0, 1]");
    return *min_lr_rate;
  }
  in.check_range("min_lr", *min_lr, 0.0, std::numeric_limits<double>::infinity(),
                 "is a learning rate: it must be >= 0");
  if (!initial_lr) return 0.0;  // checked without the optimizer: the rest waits for it
  TORCH_CHECK_VALUE(*initial_lr > 0, "lr_scheduler_kwargs: min_lr of the ", in.name(),
                    " schedule is divided by the initial lr, which is ", detail::repr(*initial_lr),
                    "; give min_lr_rate instead, or a positive lr");
  in.check_range(
      "min_lr", *min_lr, 0.0, *initial_lr,
      ("is a learning rate: it must lie in [0, the initial lr " + detail::repr(*initial_lr) + "]")
          .c_str());
  return *min_lr / *initial_lr;  // HF: min_lr / optimizer.defaults["lr"]
}

// The kwargs of `schedule` read into its parameters, with every check that needs no step
// counts. `initial_lr` unset skips the checks (and values) that need the optimizer's lr.
Params resolve_kwargs(Schedule schedule, const LrSchedulerKwargs& kwargs,
                      std::optional<double> initial_lr) {
  const KwargsReader in(schedule, kwargs);
  Params p;
  p.schedule = schedule;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (schedule == Schedule::kCosineWithRestarts) p.num_cycles = 1.0;
  if (const auto v = in.number("num_cycles")) {
    in.check_range("num_cycles", *v, 0.0, kInf, "counts cosine waves: it must be >= 0");
    p.num_cycles = *v;
  }
  switch (schedule) {
    case Schedule::kPolynomial: {
      if (const auto v = in.number("lr_end")) {
        in.check_range("lr_end", *v, 0.0, kInf, "is a learning rate: it must be >= 0");
        p.lr_end = *v;
      }
      if (const auto v = in.number("power")) {
        if (!(*v > 0)) in.bad("power", kwargs.at("power"), "must be > 0");
        p.power = *v;
      }
      if (initial_lr) {
        // HF's check and text (get_polynomial_decay_schedule_with_warmup).
        TORCH_CHECK_VALUE(*initial_lr > p.lr_end, "lr_scheduler_kwargs: lr_end (",
                          detail::repr(p.lr_end), ") must be smaller than initial lr (",
                          detail::repr(*initial_lr), ") for the polynomial schedule");
        p.lr_init = *initial_lr;
      }
      break;
    }
    case Schedule::kInverseSqrt:
      if (const auto v = in.integer("timescale")) {
        TORCH_CHECK_VALUE(*v >= 1,
                          "lr_scheduler_kwargs: timescale of the inverse_sqrt schedule must be at "
                          "least 1 (a number of steps), got ",
                          *v);
        p.timescale = *v;
      }
      break;
    case Schedule::kCosineWithMinLr:
      p.min_lr_rate = resolve_min_lr_rate(in, initial_lr);
      break;
    case Schedule::kCosineWarmupWithMinLr:
      p.min_lr_rate = resolve_min_lr_rate(in, initial_lr);
      if (const auto v = in.number("warmup_lr_rate")) {
        in.check_range("warmup_lr_rate", *v, 0.0, 1.0,
                       "is the first step's fraction of the lr: it must lie in [0, 1]");
        p.warmup_lr_rate = *v;
      }
      break;
    case Schedule::kWarmupStableDecay: {
      const auto decay = in.integer("num_decay_steps");
      TORCH_CHECK_VALUE(
          decay.has_value(),
          "lr_scheduler_kwargs: the warmup_stable_decay schedule (transformers' get_wsd_schedule) "
          "needs num_decay_steps, the length of its decay, e.g. {\"num_decay_steps\": 100}");
      TORCH_CHECK_VALUE(*decay >= 0,
                        "lr_scheduler_kwargs: num_decay_steps of the warmup_stable_decay schedule "
                        "must be >= 0, got ",
                        *decay);
      p.num_decay_steps = *decay;
      if (const auto stable = in.integer("num_stable_steps")) {
        TORCH_CHECK_VALUE(*stable >= 0,
                          "lr_scheduler_kwargs: num_stable_steps of the warmup_stable_decay "
                          "schedule must be >= 0, got ",
                          *stable);
        p.num_stable_steps = *stable;
      }
      if (const auto v = in.shape("warmup_type", "warmup")) p.warmup_type = *v;
      if (const auto v = in.shape("decay_type", "decay")) p.decay_type = *v;
      if (const auto v = in.number("min_lr_ratio")) {
        in.check_range("min_lr_ratio", *v, 0.0, 1.0,
                       "is a fraction of the lr: it must lie in [0, 1]");
        p.min_lr_ratio = *v;
      }
      break;
    }
    default:
      break;
  }
  return p;
}

// Whether the schedule reads the optimizer's lr (so a schedule that does not never asks an
// optimizer whose options lack get_lr()).
bool needs_initial_lr(Schedule schedule, const LrSchedulerKwargs& kwargs) {
  return schedule == Schedule::kPolynomial || ((schedule == Schedule::kCosineWithMinLr ||
                                                schedule == Schedule::kCosineWarmupWithMinLr) &&
                                               kwargs.count("min_lr") != 0);
}

// The full parameters of a schedule over `warmup` and `total` steps.
Params resolve(Schedule schedule, std::int64_t warmup, std::int64_t total,
               const LrSchedulerKwargs& kwargs, std::optional<double> initial_lr) {
  check_steps(warmup, total);
  if (needs_initial_lr(schedule, kwargs)) {
    TORCH_CHECK_VALUE(initial_lr.has_value(), "the ", Choice<Schedule>(schedule).name(),
                      " schedule is relative to the optimizer's initial lr: pass initial_lr");
  }
  Params p = resolve_kwargs(schedule, kwargs, initial_lr);
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
      if (p.timescale == 0) p.timescale = warmup != 0 ? warmup : 10000;  // HF: warmup or 10_000
      break;
    case Schedule::kWarmupStableDecay: {
      // HF: num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps when
      // unset (negative when warmup and decay overlap the run's end: the decay then starts
      // part-way, as in Python).
      std::int64_t stable = 0;
      bool overflow = false;
      if (p.num_stable_steps) {
        stable = *p.num_stable_steps;
      } else {
        // total - warmup >= -2^63 + 1; num_decay_steps >= 0.
        overflow = total - warmup < std::numeric_limits<std::int64_t>::min() + p.num_decay_steps;
        if (!overflow) stable = total - warmup - p.num_decay_steps;
      }
      overflow = overflow || c10::add_overflows(warmup, stable, &p.stable_end) ||
                 c10::add_overflows(p.stable_end, p.num_decay_steps, &p.decay_end);
      TORCH_CHECK_VALUE(!overflow,
                        "lr_scheduler_kwargs: the warmup_stable_decay schedule's num_warmup_steps ",
                        warmup, ", num_stable_steps ", stable, " and num_decay_steps ",
                        p.num_decay_steps, " add up to more steps than a 64-bit count holds");
      break;
    }
    default:
      break;
  }
  return p;
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
double cosine_with_min_lr(const Params& p, std::int64_t step) {
  if (step < p.warmup) return warmup_ramp(step, p.warmup);
  const double progress = progress_of(step, p.warmup, p.total);
  double factor = 0.5 * (1.0 + std::cos(kPi * p.num_cycles * 2.0 * progress));
  factor = mul_add(factor, 1.0 - p.min_lr_rate, p.min_lr_rate);
  return std::max(0.0, factor);
}

// _get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda: every count a float first.
double cosine_warmup_with_min_lr(const Params& p, std::int64_t step) {
  const double current_step = static_cast<double>(step);
  const double num_warmup_steps = static_cast<double>(p.warmup);
  const double num_training_steps = static_cast<double>(p.total);
  if (current_step < num_warmup_steps) {
    if (!p.warmup_lr_rate) return (current_step + 1.0) / std::max(1.0, num_warmup_steps);
    const double warmup_lr_rate = *p.warmup_lr_rate;
    return warmup_lr_rate +
           (1.0 - warmup_lr_rate) * current_step / std::max(1.0, num_warmup_steps - 1);
  }
  const double progress = (current_step - num_warmup_steps + 1.0) /
                          std::max(1.0, num_training_steps - num_warmup_steps);
  double factor = 0.5 * (1.0 + std::cos(kPi * p.num_cycles * 2.0 * progress));
  factor = mul_add(factor, 1.0 - p.min_lr_rate, p.min_lr_rate);
  return std::max(0.0, factor);
}

// _get_wsd_scheduler_lambda
double warmup_stable_decay(const Params& p, std::int64_t step) {
  if (step < p.warmup) {
    const double progress = warmup_ramp(step, p.warmup);
    double factor = progress;
    if (p.warmup_type == Shape::kCosine) {
      factor = 0.5 * (1.0 - std::cos(kPi * progress));
    } else if (p.warmup_type == Shape::kOneMinusSqrt) {
      factor = 1.0 - std::sqrt(1.0 - progress);
    }
    factor = mul_add(factor, 1.0 - p.min_lr_ratio, p.min_lr_ratio);
    return std::max(0.0, factor);
  }
  if (step < p.stable_end) return 1.0;
  if (step < p.decay_end) {
    const double progress = static_cast<double>(step - p.stable_end) /
                            static_cast<double>(std::max<std::int64_t>(1, p.num_decay_steps));
    double factor = 1.0 - progress;
    if (p.decay_type == Shape::kCosine) {
      factor = 0.5 * (1.0 + std::cos(kPi * p.num_cycles * 2.0 * progress));
    } else if (p.decay_type == Shape::kOneMinusSqrt) {
      factor = 1.0 - std::sqrt(progress);
    }
    factor = mul_add(factor, 1.0 - p.min_lr_ratio, p.min_lr_ratio);
    return std::max(0.0, factor);
  }
  return p.min_lr_ratio;
}

double factor(const Params& p, std::int64_t current_step) {
  const std::int64_t warmup = p.warmup;
  const std::int64_t total = p.total;
  switch (p.schedule) {
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
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(p.num_cycles * progress, 1.0))));
    }
    case Schedule::kPolynomial: {
      if (current_step < warmup) return warmup_ramp(current_step, warmup);
      if (current_step > total) return p.lr_end / p.lr_init;
      const double lr_range = p.lr_init - p.lr_end;
      const std::int64_t decay_steps = total - warmup;
      const double pct_remaining =
          1.0 - static_cast<double>(current_step - warmup) / static_cast<double>(decay_steps);
      const double decay = mul_add(lr_range, std::pow(pct_remaining, p.power), p.lr_end);
      return decay / p.lr_init;
    }
    case Schedule::kInverseSqrt: {
      if (current_step < warmup) return warmup_ramp(current_step, warmup);
      // Python: (current_step + (timescale - num_warmup_steps)) / timescale, exact integers.
      std::int64_t shifted = 0;
      const double numerator =
          c10::add_overflows(current_step - warmup, p.timescale, &shifted)
              ? static_cast<double>(current_step - warmup) + static_cast<double>(p.timescale)
              : static_cast<double>(shifted);
      return 1.0 / std::sqrt(numerator / static_cast<double>(p.timescale));
    }
    case Schedule::kCosineWarmupWithMinLr:
      return cosine_warmup_with_min_lr(p, current_step);
    case Schedule::kWarmupStableDecay:
      return warmup_stable_decay(p, current_step);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled schedule");
}

c10::List<double> to_list(const std::vector<double>& values) {
  c10::List<double> list;
  for (const double value : values) list.push_back(value);
  return list;
}

std::vector<double> as_double_list(const c10::IValue& value, const char* key) {
  TORCH_CHECK_VALUE(value.isList() || value.isDoubleList() || value.isIntList(),
                    "LrScheduler state dict: '", key, "' must be a list of floats, got ",
                    value.tagKind());
  std::vector<double> out;
  for (const auto& item : value.toListRef()) {
    TORCH_CHECK_VALUE(item.isDouble() || item.isInt(), "LrScheduler state dict: '", key,
                      "' must be a list of floats, but holds a ", item.tagKind());
    out.push_back(item.isDouble() ? item.toDouble() : static_cast<double>(item.toInt()));
  }
  return out;
}

}  // namespace

void check_lr_scheduler_kwargs(const Choice<SchedulerType>& type, const LrSchedulerKwargs& kwargs,
                               std::optional<double> initial_lr) {
  resolve_kwargs(type.value(), kwargs, initial_lr);
}

double schedule_factor(const Choice<SchedulerType>& type, std::int64_t step,
                       std::int64_t num_warmup_steps, std::int64_t num_training_steps,
                       const LrSchedulerKwargs& kwargs, std::optional<double> initial_lr) {
  return factor(resolve(type.value(), num_warmup_steps, num_training_steps, kwargs, initial_lr),
                step);
}

LrScheduler::LrScheduler(torch::optim::Optimizer& optimizer, const Choice<SchedulerType>& type,
                         std::int64_t num_warmup_steps, std::int64_t num_training_steps,
                         const LrSchedulerKwargs& kwargs)
    : optimizer_(&optimizer),
      type_(type.name()),
      num_warmup_steps_(num_warmup_steps),
      num_training_steps_(num_training_steps),
      kwargs_(kwargs) {
  const Schedule schedule = type.value();
  TORCH_CHECK(!optimizer.param_groups().empty(), "LrScheduler: the optimizer has no param groups");
  std::optional<double> initial_lr;
  if (needs_initial_lr(schedule, kwargs)) initial_lr = optimizer.defaults().get_lr();
  const Params params = resolve(schedule, num_warmup_steps, num_training_steps, kwargs, initial_lr);
  lr_lambda_ = [params](std::int64_t step) { return factor(params, step); };
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
  // LambdaLR's constructor takes the initial step: last_epoch -1 -> 0, lr = base_lr * factor(0).
  last_epoch_ = -1;
  step();
}

LrScheduler::LrScheduler(torch::optim::Optimizer& optimizer, LrLambda lr_lambda)
    : optimizer_(&optimizer),
      type_("lambda"),
      lr_lambda_(std::move(lr_lambda)),
      num_warmup_steps_(0),
      num_training_steps_(0) {
  TORCH_CHECK_VALUE(static_cast<bool>(lr_lambda_), "LrScheduler: the lr_lambda is empty");
  TORCH_CHECK(!optimizer.param_groups().empty(), "LrScheduler: the optimizer has no param groups");
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
  last_epoch_ = -1;
  step();
}

void LrScheduler::step() {
  ++step_count_;
  ++last_epoch_;
  apply_lr();
}

void LrScheduler::apply_lr() {
  const double f = lr_lambda_(last_epoch_);
  auto& groups = optimizer_->param_groups();
  TORCH_CHECK(groups.size() == base_lrs_.size(), "LrScheduler: the optimizer has ", groups.size(),
              " param groups but the scheduler was built for ", base_lrs_.size());
  last_lr_.clear();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const double lr = base_lrs_[i] * f;
    groups[i].options().set_lr(lr);
    last_lr_.push_back(lr);
  }
}

c10::impl::GenericDict LrScheduler::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("base_lrs", to_list(base_lrs_));
  state.insert("last_epoch", last_epoch_);
  state.insert("_step_count", step_count_);
  state.insert("_is_initial", false);
  state.insert("_get_lr_called_within_step", false);
  state.insert("_last_lr", to_list(last_lr_));
  c10::impl::GenericList lr_lambdas(
      c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  for (std::size_t i = 0; i < base_lrs_.size(); ++i) {
    lr_lambdas.push_back(c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  }
  state.insert("lr_lambdas", lr_lambdas);
  return state;
}

void LrScheduler::load_state_dict(const c10::impl::GenericDict& state) {
  auto get = [&](const char* key) -> c10::IValue {
    TORCH_CHECK_VALUE(state.contains(key), "LrScheduler state dict has no key '", key, "'");
    return state.at(key);
  };
  auto as_int = [&](const char* key) {
    const auto value = get(key);
    TORCH_CHECK_VALUE(value.isInt(), "LrScheduler state dict: '", key, "' must be an int, got ",
                      value.tagKind());
    return value.toInt();
  };
  std::vector<double> base_lrs = as_double_list(get("base_lrs"), "base_lrs");
  const std::int64_t last_epoch = as_int("last_epoch");
  const std::size_t num_groups = optimizer_->param_groups().size();
  TORCH_CHECK_VALUE(base_lrs.size() == num_groups, "LrScheduler state dict: 'base_lrs' has ",
                    base_lrs.size(), " entries but the optimizer has ", num_groups,
                    " param groups");
  // A learning rate is a finite number >= 0, and a constructed scheduler has stepped at least
  // once (last_epoch 0): anything else would feed nan or a negative rate into the optimizer.
  auto check_rates = [](const std::vector<double>& rates, const char* key) {
    for (std::size_t i = 0; i < rates.size(); ++i) {
      TORCH_CHECK_VALUE(std::isfinite(rates[i]) && rates[i] >= 0, "LrScheduler state dict: '", key,
                        "'[", i, "] is ", rates[i],
                        ", but a learning rate must be a finite number >= 0");
    }
  };
  check_rates(base_lrs, "base_lrs");
  TORCH_CHECK_VALUE(last_epoch >= 0 && last_epoch < std::numeric_limits<std::int64_t>::max(),
                    "LrScheduler state dict: 'last_epoch' is ", last_epoch,
                    ", but it counts the steps taken and must be >= 0");
  std::int64_t step_count = last_epoch + 1;
  if (state.contains("_step_count")) step_count = as_int("_step_count");
  TORCH_CHECK_VALUE(step_count >= 0, "LrScheduler state dict: '_step_count' is ", step_count,
                    ", but it must be >= 0");
  std::vector<double> last_lr;
  if (state.contains("_last_lr")) {
    last_lr = as_double_list(state.at("_last_lr"), "_last_lr");
    TORCH_CHECK_VALUE(last_lr.size() == num_groups, "LrScheduler state dict: '_last_lr' has ",
                      last_lr.size(), " entries but the optimizer has ", num_groups,
                      " param groups");
    check_rates(last_lr, "_last_lr");
  } else {
    const double f = lr_lambda_(last_epoch);
    for (const double base_lr : base_lrs) last_lr.push_back(base_lr * f);
  }
  base_lrs_ = std::move(base_lrs);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  last_lr_ = std::move(last_lr);
}

void LrScheduler::save(const std::string& path) const {
  // Not torch::pickle_save: its type tags make Python's torch.load(weights_only=True) refuse
  // the file, and HF's Trainer loads scheduler.pt that way.
  const auto bytes = io::torch_save_bytes(c10::IValue(state_dict()));
  io::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

void LrScheduler::load(const std::string& path) {
  const auto value = io::load_torch_file(path);
  TORCH_CHECK_VALUE(value.isGenericDict(), "'", path,
                    "' does not hold an LrScheduler state dict, but a ", value.tagKind());
  load_state_dict(value.toGenericDict());
}

}  // namespace mantissa
