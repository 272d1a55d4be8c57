// The schema of lr_scheduler_kwargs (training_arguments/lr_scheduler_kwargs_schema.h): the keys
// of each schedule, their types, ranges and defaults, and HF's texts for what is wrong.
#include "training_arguments/lr_scheduler_kwargs_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <c10/util/Exception.h>

#include "shorten.h"
#include "training_arguments/python_repr.h"

namespace mantissa {
namespace detail {
namespace {

using Schedule = SchedulerType;

// The spellings of WsdShape, in its order.
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

  std::optional<WsdShape> shape(const char* key, const char* what) const {
    const LrSchedulerKwarg* value = find(key);
    if (value == nullptr) return std::nullopt;
    const auto* s = std::get_if<std::string>(value);
    if (s == nullptr) bad(key, *value, "must be a string");
    for (std::size_t i = 0; i < std::size(kShapeNames); ++i) {
      if (*s == kShapeNames[i]) return static_cast<WsdShape>(i);
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

}  // namespace

ResolvedLrSchedulerKwargs resolve_lr_scheduler_kwargs(Schedule schedule,
                                                      const LrSchedulerKwargs& kwargs,
                                                      std::optional<double> initial_lr) {
  const KwargsReader in(schedule, kwargs);
  ResolvedLrSchedulerKwargs p;
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

bool schedule_needs_initial_lr(Schedule schedule, const LrSchedulerKwargs& kwargs) {
  return schedule == Schedule::kPolynomial || ((schedule == Schedule::kCosineWithMinLr ||
                                                schedule == Schedule::kCosineWarmupWithMinLr) &&
                                               kwargs.count("min_lr") != 0);
}

}  // namespace detail

void check_lr_scheduler_kwargs(const Choice<SchedulerType>& type, const LrSchedulerKwargs& kwargs,
                               std::optional<double> initial_lr) {
  detail::resolve_lr_scheduler_kwargs(type.value(), kwargs, initial_lr);
}

}  // namespace mantissa
