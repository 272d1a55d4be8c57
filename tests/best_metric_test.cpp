// src/trainer/best_metric.h: which evaluation is the best so far.
#include <limits>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "trainer/best_metric.h"

namespace {

using mantissa::TrainingArguments;
using mantissa::detail::improved_best_metric;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::ThrowsMessage;

TEST(BestMetricTest, TheLossImprovesWhenItFalls) {
  const TrainingArguments args;  // metric_for_best_model unset: eval_loss, lower is better
  EXPECT_THAT(improved_best_metric(args, {{"eval_loss", 0.5}}, std::nullopt), Optional(0.5));
  EXPECT_THAT(improved_best_metric(args, {{"eval_loss", 0.4}}, 0.5), Optional(0.4));
  EXPECT_EQ(improved_best_metric(args, {{"eval_loss", 0.5}}, 0.5), std::nullopt) << "a tie";
  EXPECT_EQ(improved_best_metric(args, {{"eval_loss", 0.6}}, 0.5), std::nullopt);
}

TEST(BestMetricTest, AnAccuracyImprovesWhenItRises) {
  // A metric named without its prefix; greater_is_better follows from a name other than loss.
  const auto args = TrainingArguments().metric_for_best_model("accuracy");
  EXPECT_THAT(improved_best_metric(args, {{"eval_accuracy", 0.7}}, 0.6), Optional(0.7));
  EXPECT_EQ(improved_best_metric(args, {{"eval_accuracy", 0.5}}, 0.6), std::nullopt);
  const auto lower = TrainingArguments(args).greater_is_better(false);
  EXPECT_THAT(improved_best_metric(lower, {{"eval_accuracy", 0.5}}, 0.6), Optional(0.5));
}

TEST(BestMetricTest, ANonFiniteValueNeverRanksBest) {
  const TrainingArguments args;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(improved_best_metric(args, {{"eval_loss", nan}}, std::nullopt), std::nullopt);
  EXPECT_EQ(improved_best_metric(args, {{"eval_loss", -inf}}, 0.5), std::nullopt);
}

TEST(BestMetricTest, AMissingMetricIsNamedWithWhatTheEvaluationReported) {
  const auto args = TrainingArguments().metric_for_best_model("f1");
  EXPECT_THAT(
      [&] {
        improved_best_metric(args, {{"eval_loss", 0.5}, {"eval_accuracy", 0.9}}, 0.1);
      },
      ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("metric_for_best_model is 'eval_f1'"),
                                           HasSubstr("it reported eval_accuracy, eval_loss"))));
}

}  // namespace
