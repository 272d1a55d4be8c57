// When the loop logs, evaluates and saves, decided without training.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "trainer/interval_policy.h"

namespace {

using mantissa::IntervalStrategy;
using mantissa::TrainerState;
using mantissa::TrainingArguments;
using mantissa::detail::decide_intervals;
using mantissa::detail::make_interval_policy;
using mantissa::detail::save_after_evaluation;

TrainerState at_step(std::int64_t step, std::int64_t logging, std::int64_t eval,
                     std::int64_t save) {
  TrainerState state;
  state.global_step = step;
  state.logging_steps = logging;
  state.eval_steps = eval;
  state.save_steps = save;
  return state;
}

TEST(IntervalPolicyTest, ParsesTheStrategiesOnce) {
  const auto policy = make_interval_policy(
      TrainingArguments().logging_strategy("epoch").eval_strategy("steps").save_strategy("best"));
  EXPECT_EQ(policy.logging, IntervalStrategy::kEpoch);
  EXPECT_EQ(policy.evaluation, IntervalStrategy::kSteps);
  EXPECT_EQ(policy.saving, mantissa::SaveStrategy::kBest);
  EXPECT_THAT([] { make_interval_policy(TrainingArguments().save_strategy("hourly")); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  ::testing::HasSubstr("hourly is not a valid SaveStrategy")));
}

TEST(IntervalPolicyTest, StepsStrategyIsDueOnMultiplesOnly) {
  const auto policy = make_interval_policy(
      TrainingArguments().logging_strategy("steps").eval_strategy("steps").save_strategy("steps"));
  const auto at10 = decide_intervals(policy, at_step(10, 5, 10, 4), /*epoch_end=*/false);
  EXPECT_TRUE(at10.log);
  EXPECT_TRUE(at10.evaluate);
  EXPECT_FALSE(at10.save);
  const auto at12 = decide_intervals(policy, at_step(12, 5, 10, 4), false);
  EXPECT_FALSE(at12.log);
  EXPECT_FALSE(at12.evaluate);
  EXPECT_TRUE(at12.save);
  // An epoch end is not a step: nothing is due there for the steps strategy.
  const auto end = decide_intervals(policy, at_step(10, 5, 10, 5), /*epoch_end=*/true);
  EXPECT_FALSE(end.log || end.evaluate || end.save);
}

TEST(IntervalPolicyTest, EpochStrategyIsDueAtEpochEndsOnly) {
  const auto policy = make_interval_policy(
      TrainingArguments().logging_strategy("epoch").eval_strategy("epoch").save_strategy("epoch"));
  const auto step = decide_intervals(policy, at_step(10, 5, 5, 5), false);
  EXPECT_FALSE(step.log || step.evaluate || step.save);
  const auto end = decide_intervals(policy, at_step(7, 5, 5, 5), true);
  EXPECT_TRUE(end.log && end.evaluate && end.save);
}

TEST(IntervalPolicyTest, NoStrategyIsNeverDue) {
  const auto policy = make_interval_policy(
      TrainingArguments().logging_strategy("no").eval_strategy("no").save_strategy("no"));
  for (const bool epoch_end : {false, true}) {
    const auto d = decide_intervals(policy, at_step(10, 1, 1, 1), epoch_end);
    EXPECT_FALSE(d.log || d.evaluate || d.save);
  }
}

TEST(IntervalPolicyTest, LoggingFirstStep) {
  auto args = TrainingArguments().logging_strategy("steps").logging_first_step(true);
  const auto policy = make_interval_policy(args);
  EXPECT_TRUE(decide_intervals(policy, at_step(1, 50, 50, 50), false).log);
  EXPECT_FALSE(decide_intervals(policy, at_step(2, 50, 50, 50), false).log);
  EXPECT_FALSE(decide_intervals(policy, at_step(1, 50, 50, 50), true).log);
  EXPECT_FALSE(decide_intervals(make_interval_policy(args.logging_first_step(false)),
                                at_step(1, 50, 50, 50), false)
                   .log);
}

TEST(IntervalPolicyTest, ZeroIntervalIsNeverDue) {
  const auto policy = make_interval_policy(
      TrainingArguments().logging_strategy("steps").eval_strategy("steps").save_strategy("steps"));
  const auto d = decide_intervals(policy, at_step(6, 0, 0, 0), false);
  EXPECT_FALSE(d.log || d.evaluate || d.save);
}

TEST(IntervalPolicyTest, BestSavesOnlyAfterAnImprovingEvaluation) {
  const auto policy =
      make_interval_policy(TrainingArguments().eval_strategy("steps").save_strategy("best"));
  EXPECT_FALSE(decide_intervals(policy, at_step(10, 5, 5, 5), false).save);
  EXPECT_FALSE(decide_intervals(policy, at_step(10, 5, 5, 5), true).save);
  EXPECT_TRUE(save_after_evaluation(policy, /*improved=*/true));
  EXPECT_FALSE(save_after_evaluation(policy, /*improved=*/false));
  EXPECT_FALSE(save_after_evaluation(
      make_interval_policy(TrainingArguments().save_strategy("steps")), /*improved=*/true));
}

}  // namespace

namespace {

TEST(IntervalPolicyTest, EvaluatesWithinTellsWhetherARunCanFindABestModel) {
  using mantissa::detail::evaluates_within;
  const auto steps = make_interval_policy(TrainingArguments().eval_strategy("steps"));
  EXPECT_FALSE(evaluates_within(steps, 50, 0, 20));  // --eval_steps 50 --max_steps 20
  EXPECT_TRUE(evaluates_within(steps, 20, 0, 20));
  EXPECT_TRUE(evaluates_within(steps, 5, 0, 20));
  EXPECT_FALSE(evaluates_within(steps, 10, 20, 29));  // resumed at 20: the next is 30
  EXPECT_TRUE(evaluates_within(steps, 10, 20, 30));
  EXPECT_FALSE(evaluates_within(steps, 0, 0, 20));
  EXPECT_FALSE(evaluates_within(steps, 5, 20, 20));  // nothing left to train
  const auto epoch = make_interval_policy(TrainingArguments().eval_strategy("epoch"));
  EXPECT_TRUE(evaluates_within(epoch, 0, 0, 1));
  const auto no = make_interval_policy(TrainingArguments().eval_strategy("no"));
  EXPECT_FALSE(evaluates_within(no, 5, 0, 20));
}

}  // namespace
