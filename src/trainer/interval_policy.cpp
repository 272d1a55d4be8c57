#include "trainer/interval_policy.h"

namespace mantissa::detail {
namespace {

bool every(std::int64_t step, std::int64_t interval) {
  return interval > 0 && step % interval == 0;
}

// Whether `strategy` (an IntervalStrategy or a SaveStrategy) is due: "steps" after an update
// (`epoch_end` false) every `interval` steps, "epoch" at the end of an epoch.
template <class Strategy>
bool due(Strategy strategy, std::int64_t step, std::int64_t interval, bool epoch_end) {
  if (strategy == Strategy::kSteps) return !epoch_end && every(step, interval);
  return strategy == Strategy::kEpoch && epoch_end;
}

}  // namespace

IntervalPolicy make_interval_policy(const TrainingArguments& args) {
  IntervalPolicy policy;
  policy.logging = args.logging_strategy().value();
  policy.evaluation = args.eval_strategy().value();
  policy.saving = args.save_strategy().value();
  policy.logging_first_step = args.logging_first_step();
  return policy;
}

IntervalDecision decide_intervals(const IntervalPolicy& policy, const TrainerState& state,
                                  bool epoch_end) {
  const auto step = state.global_step;
  IntervalDecision decision;
  decision.log = due(policy.logging, step, state.logging_steps, epoch_end) ||
                 (!epoch_end && policy.logging == IntervalStrategy::kSteps && step == 1 &&
                  policy.logging_first_step);
  decision.evaluate = due(policy.evaluation, step, state.eval_steps, epoch_end);
  decision.save = due(policy.saving, step, state.save_steps, epoch_end);
  return decision;
}

bool evaluates_within(const IntervalPolicy& policy, std::int64_t eval_steps,
                      std::int64_t start_step, std::int64_t max_steps) {
  if (max_steps <= start_step) return false;
  if (policy.evaluation == IntervalStrategy::kEpoch) return true;
  if (policy.evaluation != IntervalStrategy::kSteps || eval_steps <= 0) return false;
  return max_steps / eval_steps > start_step / eval_steps;
}

bool save_after_evaluation(const IntervalPolicy& policy, bool improved) {
  return policy.saving == SaveStrategy::kBest && improved;
}

}  // namespace mantissa::detail
