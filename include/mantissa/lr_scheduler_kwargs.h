#pragma once
// The keyword arguments of Hugging Face's learning-rate schedules (`lr_scheduler_kwargs`).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>

#include <mantissa/argument_enums.h>

namespace mantissa {

/// One value of `lr_scheduler_kwargs`: an integer, a float or a string (JSON's numbers and
/// strings; Python's int, float and str). `2` is an integer and `2.0` a float: a key that takes
/// a number takes either, a key that takes a step count (`timescale`, `num_decay_steps`,
/// `num_stable_steps`) only an integer.
using LrSchedulerKwarg = std::variant<std::int64_t, double, std::string>;

/// `TrainingArguments::lr_scheduler_kwargs`: the chosen schedule's own arguments, by name.
/// Python: the `lr_scheduler_kwargs` dict, which HF's Trainer passes to
/// `transformers.get_scheduler(..., scheduler_specific_kwargs=lr_scheduler_kwargs)`.
///
///     args.lr_scheduler_type("cosine_with_restarts").lr_scheduler_kwargs({{"num_cycles", 3}});
///     --lr_scheduler_type warmup_stable_decay
///     --lr_scheduler_kwargs '{"num_decay_steps": 200, "decay_type": "1-sqrt"}'
///
/// What each schedule takes, with HF's defaults (`lr` is the optimizer's initial learning rate,
/// `learning_rate` in the Trainer):
///
/// - `linear`, `constant`, `constant_with_warmup`: none;
/// - `cosine`: `num_cycles` (0.5); `cosine_with_restarts`: `num_cycles` (1);
/// - `polynomial`: `lr_end` (1e-7, an absolute rate below `lr`), `power` (1.0);
/// - `inverse_sqrt`: `timescale` (the warmup steps, or 10000 without a warmup);
/// - `cosine_with_min_lr`: `num_cycles` (0.5) and one of `min_lr` (absolute) and `min_lr_rate`
///   (a fraction of `lr`); `cosine_warmup_with_min_lr`: the same and `warmup_lr_rate` (unset);
/// - `warmup_stable_decay`: `num_decay_steps` (required), `num_stable_steps` (the rest of the
///   run), `warmup_type` ("linear") and `decay_type` ("cosine"), each "linear", "cosine" or
///   "1-sqrt", `min_lr_ratio` (0), `num_cycles` (0.5).
///
/// A plain host value, ordered by key (Python's dict keeps insertion order; the values and the
/// schedule are the same).
using LrSchedulerKwargs = std::map<std::string, LrSchedulerKwarg>;

/// Checks `kwargs` against the schedule `type`, as `TrainingArguments::validate()` and the
/// `LrScheduler` constructor do: every key must be one `type` takes (Python raises `TypeError`
/// for an unexpected keyword argument; this throws `c10::ValueError` naming the schedule, the key
/// and the keys it takes), of the right type (a number, an integer, a string) and in range:
///
/// - `num_cycles`, `lr_end`, `min_lr` >= 0; `power` > 0; `timescale` >= 1;
///   `num_decay_steps`, `num_stable_steps` >= 0; `min_lr_rate`, `warmup_lr_rate` and
///   `min_lr_ratio` in [0, 1]; every number finite;
/// - `warmup_type` and `decay_type` one of "linear", "cosine", "1-sqrt" (HF's "Unknown decay
///   type" text);
/// - `cosine_with_min_lr` and `cosine_warmup_with_min_lr`: exactly one of `min_lr` and
///   `min_lr_rate` (HF's texts); `warmup_stable_decay`: `num_decay_steps` is given.
///
/// With `initial_lr` (the optimizer's initial lr) also the checks that depend on it:
/// `polynomial` needs `lr_end < initial_lr` (HF: "lr_end (...) must be smaller than initial lr
/// (...)", also for the default 1e-7), and `min_lr` must lie in [0, initial_lr] with a positive
/// initial_lr (the schedule uses `min_lr / initial_lr`).
/// Mantissa is stricter than HF in one way: `constant` and `constant_with_warmup`, whose
/// functions HF calls without the kwargs (so it ignores them), take none here, so a schedule
/// left behind with its kwargs is an error rather than a silent change. Pure host code.
void check_lr_scheduler_kwargs(const Choice<SchedulerType>& type, const LrSchedulerKwargs& kwargs,
                               std::optional<double> initial_lr = std::nullopt);

}  // namespace mantissa
