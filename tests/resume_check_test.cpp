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

}  // namespace
