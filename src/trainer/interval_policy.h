#pragma once
// When the loop logs, evaluates and saves: the decision of HF's DefaultFlowCallback at step N. Pure
// functions of the arguments and the state, tested without training
// (tests/interval_policy_test.cpp).

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The strategies of one run, read once from the arguments. The step intervals are read
/// from `TrainerState` (`logging_steps`, `eval_steps`, `save_steps`), where ratios are
/// already resolved into steps, as HF does.
struct IntervalPolicy {
  /// `logging_strategy`.
  IntervalStrategy logging = IntervalStrategy::kSteps;
  /// `eval_strategy`.
  IntervalStrategy evaluation = IntervalStrategy::kNo;
  /// `save_strategy`.
  SaveStrategy saving = SaveStrategy::kSteps;
  /// Log after the first update too (`logging_first_step`).
  bool logging_first_step = false;
};

/// The policy for `args`. Throws `c10::ValueError` for a strategy that is not a valid name
/// (`TrainingArguments::validate` refuses those first).
IntervalPolicy make_interval_policy(const TrainingArguments& args);

/// What is due at `state.global_step`.
struct IntervalDecision {
  /// Write the training log line (`control.should_log`).
  bool log = false;
  /// Run the evaluation (`control.should_evaluate`).
  bool evaluate = false;
  /// Write a checkpoint (`control.should_save`).
  bool save = false;
};

/// What the intervals ask for after an update (`epoch_end` false) or at the end of an epoch
/// (`epoch_end` true). Python: `DefaultFlowCallback.on_step_end` / `on_epoch_end`. A step
/// interval of 0 or less is never due. `kBest` saves are decided after the evaluation
/// (`save_after_evaluation`), not here.
IntervalDecision decide_intervals(const IntervalPolicy& policy, const TrainerState& state,
                                  bool epoch_end);

/// Whether the evaluation strategy is due at least once after step `start_step` and up to
/// `max_steps` (what `--load_best_model_at_end` needs to have a best model to load): "steps"
/// when a multiple of `eval_steps` lies in (start_step, max_steps], "epoch" when any step is
/// left to train, "no" never.
bool evaluates_within(const IntervalPolicy& policy, std::int64_t eval_steps,
                      std::int64_t start_step, std::int64_t max_steps);

/// Whether an evaluation that improved the best metric (`improved`) asks for a checkpoint:
/// `save_strategy` best. Python: `Trainer._determine_best_metric` -> `control.should_save`.
bool save_after_evaluation(const IntervalPolicy& policy, bool improved);

}  // namespace mantissa::detail
