// The run's schedule without training: batches, updates and epochs, accumulation groups.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "trainer/run_schedule.h"

namespace {

using mantissa::TrainingArguments;
using mantissa::detail::make_run_schedule;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TrainingArguments batches_of(std::int64_t batch_size) {
  return TrainingArguments().per_device_train_batch_size(batch_size);
}

TEST(RunScheduleTest, PartialLastBatchCountsUnlessDropLast) {
  const auto kept = make_run_schedule(10, batches_of(4).num_train_epochs(1));
  EXPECT_EQ(kept.batches_per_epoch, 3);
  EXPECT_EQ(kept.updates_per_epoch, 3);
  EXPECT_EQ(kept.max_steps, 3);
  EXPECT_EQ(kept.num_epochs, 1);
  const auto dropped =
      make_run_schedule(10, batches_of(4).num_train_epochs(1).dataloader_drop_last(true));
  EXPECT_EQ(dropped.batches_per_epoch, 2);
  EXPECT_EQ(dropped.updates_per_epoch, 2);
  EXPECT_EQ(dropped.max_steps, 2);
}

TEST(RunScheduleTest, PartialAccumulationGroupIsOneUpdate) {
  // 7 batches in groups of 3: [0 1 2] [3 4 5] [6].
  const auto s =
      make_run_schedule(70, batches_of(10).gradient_accumulation_steps(3).num_train_epochs(2));
  EXPECT_EQ(s.batches_per_epoch, 7);
  EXPECT_EQ(s.updates_per_epoch, 3);
  EXPECT_EQ(s.max_steps, 6);
  EXPECT_EQ(s.num_epochs, 2);
  std::vector<std::int64_t> in_group;
  std::vector<bool> boundary;
  for (std::int64_t b = 0; b < s.batches_per_epoch; ++b) {
    in_group.push_back(s.group_of(b).in_group);
    boundary.push_back(s.group_of(b).boundary);
  }
  EXPECT_THAT(in_group, ElementsAre(3, 3, 3, 3, 3, 3, 1));
  EXPECT_THAT(boundary, ElementsAre(false, false, true, false, false, true, true));
  EXPECT_EQ(s.group_of(4).group_start, 3);
  EXPECT_EQ(s.group_of(6).group_start, 6);
}

TEST(RunScheduleTest, FewerBatchesThanAccumulationStillUpdatesOnce) {
  const auto s =
      make_run_schedule(20, batches_of(10).gradient_accumulation_steps(8).num_train_epochs(1));
  EXPECT_EQ(s.batches_per_epoch, 2);
  EXPECT_EQ(s.updates_per_epoch, 1);
  EXPECT_EQ(s.group_of(0).in_group, 2);
  EXPECT_FALSE(s.group_of(0).boundary);
  EXPECT_TRUE(s.group_of(1).boundary);
}

TEST(RunScheduleTest, MaxStepsWinsOverEpochs) {
  const auto s = make_run_schedule(100, batches_of(10).max_steps(25).num_train_epochs(1));
  EXPECT_EQ(s.updates_per_epoch, 10);
  EXPECT_EQ(s.max_steps, 25);
  EXPECT_EQ(s.num_epochs, 3);  // the third one ends at step 25
}

TEST(RunScheduleTest, FractionalEpochsRoundTheStepsUp) {
  const auto s = make_run_schedule(100, batches_of(10).num_train_epochs(1.25));
  EXPECT_EQ(s.max_steps, 13);  // ceil(12.5)
  EXPECT_EQ(s.num_epochs, 2);
}

TEST(RunScheduleTest, FractionalEpochOfABatch) {
  const auto s = make_run_schedule(40, batches_of(10).num_train_epochs(2));
  EXPECT_DOUBLE_EQ(s.fractional_epoch(0, 1), 0.5);
  EXPECT_DOUBLE_EQ(s.fractional_epoch(1, 3), 2.0);
}

TEST(RunScheduleTest, BatchIndicesFollowTheOrderAndStopAtTheEnd) {
  const auto s = make_run_schedule(5, batches_of(2).num_train_epochs(1));
  const std::vector<std::int64_t> order{4, 2, 0, 3, 1};
  EXPECT_THAT(s.batch_indices(order.data(), 0), ElementsAre(4u, 2u));
  EXPECT_THAT(s.batch_indices(order.data(), 1), ElementsAre(0u, 3u));
  EXPECT_THAT(s.batch_indices(order.data(), 2), ElementsAre(1u));
}

TEST(RunScheduleTest, RunShapeCarriesTheSizes) {
  const auto shape =
      make_run_schedule(70, batches_of(10).gradient_accumulation_steps(3)).run_shape();
  EXPECT_EQ(shape.batches_per_epoch, 7);
  EXPECT_EQ(shape.updates_per_epoch, 3);
  EXPECT_EQ(shape.gradient_accumulation_steps, 3);
  EXPECT_EQ(shape.per_device_train_batch_size, 10);
}

TEST(RunScheduleTest, RefusesRunsWithoutWork) {
  EXPECT_THAT(
      [] { make_run_schedule(0, batches_of(4)); },
      ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("the training dataset is empty")));
  EXPECT_THAT([] { make_run_schedule(3, batches_of(4).dataloader_drop_last(true)); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("no batch would be produced")));
  EXPECT_THAT([] { make_run_schedule(30, batches_of(4).num_train_epochs(0)); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("would take no optimizer step")));
}

}  // namespace
