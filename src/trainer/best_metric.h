#pragma once
// Whether an evaluation is the best so far: the rule behind metric_for_best_model,
// greater_is_better and load_best_model_at_end. A pure function. Internal.

#include <optional>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The value of `args`' metric for the best model (`resolved_metric_for_best_model`) in
/// `metrics` when it beats `best` (higher with `resolved_greater_is_better`, else lower; any
/// finite value beats no best yet), else nullopt. A NaN or infinite value never beats it.
/// Throws `c10::ValueError` naming the metric and what the evaluation reported when `metrics`
/// lacks it. Python: the comparison in `Trainer._determine_best_metric`. No device sync.
std::optional<double> improved_best_metric(const TrainingArguments& args, const LogEntry& metrics,
                                           std::optional<double> best);

}  // namespace mantissa::detail
