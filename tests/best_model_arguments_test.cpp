// The TrainingArguments of label names and of the best model: label_names (a list flag),
// load_best_model_at_end, metric_for_best_model, greater_is_better, with HF's defaults and
// checks.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mantissa/training_arguments.h>

namespace {

using mantissa::TrainingArguments;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

TEST(BestModelArgumentsTest, LabelNamesTakeOneOrMoreValuesOnTheCommandLine) {
  EXPECT_FALSE(TrainingArguments().label_names().has_value());
  const auto one = TrainingArguments::parse({"--label_names", "labels"});
  EXPECT_THAT(*one.label_names(), ElementsAre("labels"));
  const auto two = TrainingArguments::parse(
      {"--label_names", "start_positions", "end_positions", "--learning_rate", "1e-3"});
  EXPECT_THAT(*two.label_names(), ElementsAre("start_positions", "end_positions"));
  EXPECT_EQ(two.learning_rate(), 1e-3);
  EXPECT_FALSE(TrainingArguments::parse({"--label_names", "None"}).label_names().has_value());
  EXPECT_THAT([] { TrainingArguments::parse({"--label_names"}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("label_names")));
}

TEST(BestModelArgumentsTest, LabelNamesRoundTripThroughJsonAsAList) {
  const auto args = TrainingArguments().label_names(std::vector<std::string>{"a", "b"});
  const auto json = args.to_json();
  EXPECT_THAT(json, HasSubstr("\"label_names\": [\n    \"a\",\n    \"b\"\n  ]"));
  EXPECT_EQ(TrainingArguments::from_json(json), args);
  EXPECT_THAT([] { TrainingArguments::from_json(R"({"label_names": "labels"})"); },
              ThrowsMessage<c10::ValueError>(HasSubstr("label_names: expected a list of strings")));
  EXPECT_THAT([] { TrainingArguments::from_json(R"({"label_names": ["a", 3]})"); },
              ThrowsMessage<c10::ValueError>(HasSubstr("but it holds 3")));
}

TEST(BestModelArgumentsTest, TheMetricDefaultsToLossAndItsDirectionToItsName) {
  TrainingArguments args;
  EXPECT_EQ(args.resolved_metric_for_best_model(), "eval_loss");
  EXPECT_FALSE(args.resolved_greater_is_better());
  args.metric_for_best_model("accuracy");
  EXPECT_EQ(args.resolved_metric_for_best_model(), "eval_accuracy");
  EXPECT_TRUE(args.resolved_greater_is_better());
  args.metric_for_best_model("eval_val_loss");
  EXPECT_EQ(args.resolved_metric_for_best_model(), "eval_val_loss");
  EXPECT_FALSE(args.resolved_greater_is_better());
  args.greater_is_better(true);
  EXPECT_TRUE(args.resolved_greater_is_better());
}

TEST(BestModelArgumentsTest, LoadBestModelAtEndNeedsSavesAtTheEvaluations) {
  const auto base = TrainingArguments().load_best_model_at_end(true).eval_strategy("steps");
  EXPECT_THAT([&] { TrainingArguments(base).save_strategy("epoch").validate(); },
              ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("load_best_model_at_end"),
                                                   HasSubstr("eval_strategy is 'steps'"),
                                                   HasSubstr("save_strategy is 'epoch'"))));
  EXPECT_THAT(
      [&] { TrainingArguments(base).eval_steps(200).save_steps(500).validate(); },
      ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("save_steps (500.0)"),
                                           HasSubstr("whole multiple of eval_steps (200.0)"))));
  EXPECT_THAT([&] { TrainingArguments(base).eval_steps(0.1).save_steps(500).validate(); },
              ThrowsMessage<c10::ValueError>(HasSubstr("the same way")));
  EXPECT_THAT([&] { TrainingArguments(base).eval_steps(0.2).save_steps(0.3).validate(); },
              ThrowsMessage<c10::ValueError>(HasSubstr("whole multiple")));
  // A ratio below half a millionth is no multiple of anything: the message says why.
  EXPECT_THAT([&] { TrainingArguments(base).eval_steps(1e-9).save_steps(1e-9).validate(); },
              ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("eval_steps (1e-09) rounds to zero"),
                                                   Not(HasSubstr("multiple")))));
  EXPECT_NO_THROW(TrainingArguments(base).eval_steps(100).save_steps(500).validate());
  EXPECT_NO_THROW(TrainingArguments(base).eval_steps(0.1).save_steps(0.3).validate());
  EXPECT_NO_THROW(TrainingArguments(base).save_strategy("best").validate());
  EXPECT_NO_THROW(TrainingArguments(base).eval_strategy("epoch").save_strategy("epoch").validate());
  // Without load_best_model_at_end the intervals are free.
  EXPECT_NO_THROW(TrainingArguments().eval_strategy("steps").eval_steps(200).validate());
}

TEST(BestModelArgumentsTest, BadNamesAreRefused) {
  EXPECT_THAT([] { TrainingArguments().metric_for_best_model("").validate(); },
              ThrowsMessage<c10::ValueError>(HasSubstr("metric_for_best_model must name")));
  EXPECT_THAT(
      [] {
        TrainingArguments().label_names(std::vector<std::string>{"labels", ""}).validate();
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("label_names: a name is empty")));
  EXPECT_THAT(
      [] { TrainingArguments().save_strategy("best").metric_for_best_model("f1").validate(); },
      ThrowsMessage<c10::ValueError>(HasSubstr("save_strategy best saves when eval_f1 improves")));
}

}  // namespace
