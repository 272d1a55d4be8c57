#include "trainer/interval_policy.h"

#include <c10/util/Exception.h>

namespace mantissa::detail {
namespace {

bool every(std::int64_t step, std::int64_t interval) {
  return interval > 0 && step % interval == 0;
}

}  // namespace

IntervalStrategy parse_interval_strategy(const std::string& value, const char* field) {
  if (value == "no") return IntervalStrategy::kNo;
  if (value == "steps") return IntervalStrategy::kSteps;
  if (value == "epoch") return IntervalStrategy::kEpoch;
  if (value == "best") return IntervalStrategy::kBest;
  TORCH_CHECK_VALUE(false, field, ": ", value, " is not a valid IntervalStrategy");
  return IntervalStrategy::kNo;
}

IntervalPolicy make_interval_policy(const TrainingArguments& args) {
  IntervalPolicy policy;
  policy.logging = parse_interval_strategy(args.logging_strategy(), "logging_strategy");
  policy.evaluation = parse_interval_strategy(args.eval_strategy(), "eval_strategy");
  policy.saving = parse_interval_strategy(args.save_strategy(), "save_strategy");
  policy.logging_first_step = args.logging_first_step();
  return policy;
}

IntervalDecision decide_intervals(const IntervalPolicy& policy, const TrainerState& state,
                                  bool epoch_end) {
  const auto step = state.global_step;
  const bool steps = !epoch_end;
  auto due = [&](IntervalStrategy strategy, std::int64_t interval) {
    if (strategy == IntervalStrategy::kSteps) return steps && every(step, interval);
    if (strategy == IntervalStrategy::kEpoch) return epoch_end;
    return false;
  };
  IntervalDecision decision;
  decision.log = due(policy.logging, state.logging_steps) ||
                 (steps && policy.logging == IntervalStrategy::kSteps && step == 1 &&
                  policy.logging_first_step);
  decision.evaluate = due(policy.evaluation, state.eval_steps);
  decision.save = due(policy.saving, state.save_steps);
  return decision;
}

bool save_after_evaluation(const IntervalPolicy& policy, bool improved) {
  return policy.saving == IntervalStrategy::kBest && improved;
}

}  // namespace mantissa::detail
