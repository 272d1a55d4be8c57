// The pure resume policies: where a saved state continues in a run of a given shape, and how
// changed arguments are judged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "trainer/resume_check.h"

namespace {

using mantissa::TrainerState;
using mantissa::TrainingArguments;
using mantissa::detail::compare_resumed_arguments;
using mantissa::detail::resume_position;
using mantissa::detail::RunShape;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;
using ::testing::UnorderedElementsAre;

// 13 batches an epoch, accumulation 2: 7 update steps (the last one of a single batch).
const RunShape kShape{/*batches_per_epoch=*/13, /*updates_per_epoch=*/7,
                      /*gradient_accumulation_steps=*/2,
                      /*per_device_train_batch_size=*/8};

TrainerState state_at(std::int64_t global_step, double epoch, std::int64_t steps_in_epoch) {
  TrainerState state;
  state.global_step = global_step;
  state.epoch = epoch;
  state.steps_in_epoch = steps_in_epoch;
  state.train_batch_size = 8;
  return state;
}

TEST(ResumeCheckTest, PositionComesFromTheSavedEpochAndBatches) {
  auto fresh = resume_position(state_at(0, 0.0, 0), kShape);
  EXPECT_EQ(fresh.epoch, 0);
  EXPECT_EQ(fresh.batches_done, 0);
  // Mid-epoch: 3 update steps of epoch 1 are 6 batches.
  auto mid = resume_position(state_at(10, 1.0 + 6.0 / 13.0, 6), kShape);
  EXPECT_EQ(mid.epoch, 1);
  EXPECT_EQ(mid.batches_done, 6);
  // The epoch's last (single-batch) update finished it: the next epoch starts from its beginning.
  auto end = resume_position(state_at(14, 2.0, 13), kShape);
  EXPECT_EQ(end.epoch, 2);
  EXPECT_EQ(end.batches_done, 0);
}

TEST(ResumeCheckTest, StateWithoutABatchCountIsPlacedByGlobalStepAsHfDoes) {
  auto position = resume_position(state_at(10, 1.43, 0), kShape);
  EXPECT_EQ(position.epoch, 1);
  EXPECT_EQ(position.batches_done, 6);
}

TEST(ResumeCheckTest, PositionsThatDoNotFitTheRunAreErrors) {
  EXPECT_THAT([] { resume_position(state_at(10, 1.5, 14), kShape); },
              ThrowsMessage<c10::ValueError>(HasSubstr("saved after 14 batches of an epoch")));
  EXPECT_THAT([] { resume_position(state_at(11, 1.0 + 6.0 / 13.0, 6), kShape); },
              ThrowsMessage<c10::ValueError>(HasSubstr("'global_step' is 11, but epoch")));
  auto other_batch = state_at(10, 1.0 + 6.0 / 13.0, 6);
  other_batch.train_batch_size = 16;
  EXPECT_THAT([&] { resume_position(other_batch, kShape); },
              ThrowsMessage<c10::ValueError>(HasSubstr("'train_batch_size' 16")));
}

TEST(ResumeCheckTest, ChangedArgumentsAreSortedByWhatTheyBreak) {
  const auto saved = TrainingArguments().learning_rate(1e-3).save_steps(10);
  EXPECT_THAT(compare_resumed_arguments(saved, saved).warnings, IsEmpty());

  const auto now = TrainingArguments(saved)
                       .learning_rate(2e-3)
                       .save_steps(20)
                       .output_dir("elsewhere")
                       .per_device_train_batch_size(4)
                       .optim("sgd")
                       .seed(3);
  const auto changes = compare_resumed_arguments(now, saved);
  EXPECT_THAT(changes.errors,
              UnorderedElementsAre(HasSubstr("per_device_train_batch_size is 4 now but was 8"),
                                   HasSubstr("optim is \"sgd\" now")));
  ASSERT_EQ(changes.warnings.size(), 3u);
  EXPECT_THAT(changes.warnings[0], HasSubstr("learning_rate is 0.002 now but was 0.001 when the "
                                             "checkpoint was saved; the checkpoint's"));
  EXPECT_THAT(changes.warnings[1], HasSubstr("save_steps is 20.0 now but was 10.0 when the "
                                             "checkpoint was saved; this run's value is used"));
  EXPECT_THAT(
      changes.warnings[2],
      HasSubstr("this run's value is used, so the interrupted epoch continues in another order"));
  // adamw_torch and the fused AdamW read each other's optimizer.pt.
  EXPECT_THAT(
      compare_resumed_arguments(TrainingArguments().optim("adamw_torch"), TrainingArguments())
          .errors,
      IsEmpty());
}

TEST(ResumeCheckTest, TheGlobalBatchDecidesAChangedBatchSplit) {
  using mantissa::detail::ProcessCounts;
  // 2 processes x 32 saved, 1 process x 64 now: the same 64 examples per step.
  const auto saved = TrainingArguments().per_device_train_batch_size(32);
  const auto alone = TrainingArguments(saved).per_device_train_batch_size(64);
  auto changes = compare_resumed_arguments(alone, saved, ProcessCounts{1, 2});
  EXPECT_THAT(changes.errors, IsEmpty());
  EXPECT_TRUE(changes.batch_regrouped);
  ASSERT_EQ(changes.warnings.size(), 1u);
  EXPECT_THAT(changes.warnings[0],
              AllOf(HasSubstr("per_device_train_batch_size is 64 now but was 32"),
                    HasSubstr("is 64 x 1 x 1 = 64 now and was 32 x 2 x 1 = 64"),
                    HasSubstr("the run continues from it")));
  // The same process count, half the batch and twice the accumulation.
  const auto accumulated =
      TrainingArguments(saved).per_device_train_batch_size(16).gradient_accumulation_steps(2);
  changes = compare_resumed_arguments(accumulated, saved, ProcessCounts{2, 2});
  EXPECT_THAT(changes.errors, IsEmpty());
  EXPECT_TRUE(changes.batch_regrouped);
  EXPECT_EQ(changes.warnings.size(), 2u);
  // Another global batch: refused, with both products.
  changes = compare_resumed_arguments(alone, saved, ProcessCounts{2, 2});
  EXPECT_FALSE(changes.batch_regrouped);
  EXPECT_THAT(changes.errors, UnorderedElementsAre(AllOf(
                                  HasSubstr("per_device_train_batch_size is 64 now but was 32"),
                                  HasSubstr("is 64 x 2 x 1 = 128 now and was 32 x 2 x 1 = 64"))));
  // An unknown saved count (0) is taken as this run's.
  EXPECT_THAT(compare_resumed_arguments(alone, saved, ProcessCounts{1, 0}).errors,
              UnorderedElementsAre(HasSubstr("= 64 now and was 32 x 1 x 1 = 32")));
  // Only the process count changed: nothing to judge here (the Trainer warns).
  changes = compare_resumed_arguments(saved, saved, ProcessCounts{1, 2});
  EXPECT_THAT(changes.errors, IsEmpty());
  EXPECT_THAT(changes.warnings, IsEmpty());
  EXPECT_FALSE(changes.batch_regrouped);
  // A saved batch whose product leaves int64 never equals this run's.
  const auto huge = TrainingArguments(saved).per_device_train_batch_size(std::int64_t{1} << 62);
  EXPECT_THAT(compare_resumed_arguments(alone, huge, ProcessCounts{1, 4}).errors,
              UnorderedElementsAre(HasSubstr("beyond int64")));
}

}  // namespace
